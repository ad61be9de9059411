"""The real-time simulator (epp.sim.engine + epp.sim.server) runs the step engine, seen over HTTP:

- concurrent requests share engine steps (continuous batching), a prefix hit's first token comes
  far sooner than a miss's, preemption shows in vLLM's /metrics counter;
- its KV events, received on a real ZMQ socket, are exactly the events `epp.sim.core` produces
  for the same requests run in virtual time (batch for batch).

Prompts are token ids (no tokenizer in the way) and time scales are small, so the module runs in a
few seconds; timing assertions keep wide margins.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq

from epp.datastore import promtext
from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch
from epp.sim import core
from epp.sim.blocks import BlockHasher
from epp.sim.engine import SimConfig, SimState
from epp.sim.profiles import Profile, get_profile
from epp.sim.server import bound_address, sim_state, start_sim_server

MODEL = "sim-model"


class Pod:
    def __init__(self, url: str, state: SimState) -> None:
        self.url = url
        self.state = state


@pytest.fixture
async def pods() -> AsyncIterator[Any]:
    runners = []

    async def start(config: SimConfig) -> Pod:
        runner = await start_sim_server("127.0.0.1", 0, config=config)
        runners.append(runner)
        return Pod(f"http://{bound_address(runner)}", sim_state(runner))

    yield start
    for r in runners:
        await r.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


async def complete(
    http: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int
) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        reply: dict[str, Any] = await r.json()
    return reply


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + "{"):
                return float(line.rpartition(" ")[2])
    raise AssertionError(f"{name} not in /metrics")


def linear(**changes: Any) -> Profile:
    """A profile whose step costs 0.1 ms per token computed, nothing else: easy to reason about."""
    base = get_profile("tiny").replace(
        name="linear",
        block_size=16,
        num_gpu_blocks=1000,
        max_num_seqs=8,
        max_num_batched_tokens=4096,
        max_model_len=4096,
        step_overhead_s=0.0,
        weights_read_s=0.0,
        token_s=1e-4,
        attention_pair_s=0.0,
        kv_read_token_s=0.0,
    )
    return base.replace(**changes)


async def test_concurrent_cold_prompts_share_a_step(pods: Any, http: aiohttp.ClientSession) -> None:
    # The blocker's 2000-token prefill is one 0.2 s step; two cold 1000-token prompts arrive during
    # it, wait, and are admitted together into the next step (0.2 s for their 2000 tokens). So
    # three requests take two steps, and the two finish together.
    pod = await pods(SimConfig.from_profile(linear()))
    blocker = asyncio.create_task(complete(http, pod.url, ids(10_000, 2000), 1))
    await asyncio.sleep(0.05)
    done: dict[int, float] = {}

    async def cold(i: int) -> dict[str, Any]:
        reply = await complete(http, pod.url, ids(20_000 + 5000 * i, 1000), 1)
        done[i] = time.monotonic()
        return reply

    t0 = time.monotonic()
    replies = await asyncio.gather(cold(0), cold(1))
    await blocker
    assert all(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for r in replies)
    stats = pod.state.snapshot()
    assert stats["steps"] == 2
    assert abs(done[0] - done[1]) < 0.05  # the same step's outputs
    assert 0.25 < done[0] - t0 < 1.0  # the rest of the blocker's step, then 0.2 s together


async def test_a_hit_answers_far_sooner_than_a_miss(pods: Any, http: aiohttp.ClientSession) -> None:
    # CodeLlama-13B on an A100, 4096-token prompt: ~500 ms cold vs ~18 ms on a hit (x 0.3 here).
    pod = await pods(SimConfig.from_profile(get_profile("codellama-13b-a100"), time_scale=0.3))
    prompt = ids(1, 4096)

    async def ttft() -> tuple[float, int]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True}
        body["stream_options"] = {"include_usage": True}
        t0 = time.monotonic()
        async with http.post(pod.url + "/v1/completions", json=body) as r:
            await r.content.readuntil(b"\n\n")
            first = time.monotonic() - t0
            text = (await r.read()).decode()
        usage = [line for line in text.splitlines() if '"usage"' in line]
        cached = int(usage[0].split('"cached_tokens":')[1].split("}")[0])
        return first, cached

    miss, miss_cached = await ttft()
    hit, hit_cached = await ttft()
    assert (miss_cached, hit_cached) == (0, 4080)  # all full blocks but the last token's
    assert miss > 0.14  # 0.5 s x 0.3
    assert hit < miss / 4


async def test_a_chat_streams_first_chunk_comes_with_the_first_token(
    pods: Any, http: aiohttp.ClientSession
) -> None:
    # ~2000 prompt tokens at 0.1 ms each: a 0.2 s prefill step. The role chunk must not go out
    # before it (vLLM writes it with the first output), or clients would measure no TTFT at all.
    pod = await pods(SimConfig.from_profile(linear()))
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * 2000}],
        "max_tokens": 2,
        "stream": True,
    }
    t0 = time.monotonic()
    async with http.post(pod.url + "/v1/chat/completions", json=body) as r:
        first = await r.content.readuntil(b"\n\n")
        elapsed = time.monotonic() - t0
        await r.read()
    assert b'"role":"assistant"' in first
    assert elapsed > 0.15


async def test_preemption_under_a_small_kv_cache(pods: Any, http: aiohttp.ClientSession) -> None:
    # 24 blocks of 16 tokens; four requests grow to 9 blocks each (64 prompt + 80 output tokens):
    # they cannot all run to the end together, so the latest admitted are preempted and recompute.
    cfg = SimConfig(block_size=16, num_gpu_blocks=24, time_scale=0.1, decode_per_token=0.05)
    pod = await pods(cfg)
    replies = await asyncio.gather(*(complete(http, pod.url, ids(1000 * (i + 1), 64), 80) for i in range(4)))
    assert [r["usage"]["completion_tokens"] for r in replies] == [80] * 4
    assert await metric(http, pod.url, "vllm:num_preemptions_total") >= 1
    assert pod.state.snapshot()["max_running"] == 4
    assert await metric(http, pod.url, "vllm:kv_cache_usage_perc") == 0


async def test_the_per_request_latency_histograms_read_as_vllms(
    pods: Any, http: aiohttp.ClientSession
) -> None:
    """vLLM's prefill (scheduled to first token), uncached prompt tokens and decode histograms,
    observed when a request finishes, and its per-token one, in wall seconds: epp's scrape reads
    the decode side (`LatencyTotals`) to learn a pod's per-token time."""
    pod = await pods(SimConfig.from_profile(linear()))  # 0.1 ms per token computed, nothing else
    await complete(http, pod.url, ids(1, 2000), 5)  # a 0.2 s prefill, then 4 one-token steps
    await complete(http, pod.url, ids(1, 2000), 5)  # a hit: 16 tokens computed
    async with http.get(pod.url + "/metrics") as r:
        page = await r.read()
    totals = promtext.parse(page).latency
    assert totals is not None
    assert (totals.decodes, totals.tokens) == (2, 8)
    assert totals.token_seconds == pytest.approx(8e-4, rel=0.01)
    assert totals.decode_seconds == pytest.approx(8e-4, rel=0.01)
    sums = {
        line.split("{")[0]: float(line.rpartition(" ")[2])
        for line in page.decode().splitlines()
        if line.startswith(
            ("vllm:request_prefill_time_seconds_sum", "vllm:request_prefill_kv_computed_tokens_sum")
        )
    }
    assert sums["vllm:request_prefill_kv_computed_tokens_sum"] == 2000 + 16
    assert sums["vllm:request_prefill_time_seconds_sum"] == pytest.approx(0.2 + 0.0016, rel=0.01)
    # vLLM's buckets: the prefill in 0.3's (the first), every token in 0.01's.
    assert b'vllm:request_prefill_time_seconds_bucket{model_name="sim-model",le="0.3"} 2.0' in page
    assert b'vllm:inter_token_latency_seconds_bucket{model_name="sim-model",le="0.01"} 8.0' in page


async def test_a_prompt_longer_than_max_model_len_is_a_400(pods: Any, http: aiohttp.ClientSession) -> None:
    """As vLLM 0.32: a prompt that leaves no room is refused; a budget past the end is clamped."""
    pod = await pods(SimConfig.from_profile(linear(max_model_len=256), time_scale=0.01))
    body = {"model": MODEL, "prompt": ids(1, 257), "max_tokens": 10}
    async with http.post(pod.url + "/v1/completions", json=body) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert "maximum context length is 256 tokens" in error["message"]
    assert (await complete(http, pod.url, ids(1, 250), 10))["usage"]["completion_tokens"] == 6
    assert (await complete(http, pod.url, ids(1, 246), 10))["usage"]["completion_tokens"] == 10


async def test_models_report_max_model_len_as_vllm(pods: Any, http: aiohttp.ClientSession) -> None:
    """vLLM 0.32's ModelCard: the base model's card carries max_model_len, an adapter's has null."""
    cfg = SimConfig.from_profile(linear(max_model_len=256), time_scale=0.01)
    pod = await pods(dataclasses.replace(cfg, lora_adapters=("ad",)))
    async with http.get(pod.url + "/v1/models") as r:
        assert r.status == 200
        body = await r.json()
    base, adapter = body["data"]
    assert (base["id"], base["max_model_len"], base["parent"], base["owned_by"]) == (MODEL, 256, None, "vllm")
    assert (adapter["id"], adapter["max_model_len"], adapter["parent"]) == ("ad", None, MODEL)
    assert base["permission"][0]["object"] == "model_permission"


async def test_sim_output_token_ids_are_generated_and_cached(pods: Any, http: aiohttp.ClientSession) -> None:
    """The simulator's `sim_output_token_ids` extension: a conversation's next turn, carrying the
    reply, hits the reply's blocks; without it the pod generates filler and the turn hits only
    the previous prompt."""
    pod = await pods(SimConfig.from_profile(linear(), time_scale=0.01))
    reply = ids(1000, 32)

    async def turn(prompt: list[int], **extra: Any) -> dict[str, Any]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 32, **extra}
        async with http.post(pod.url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            usage: dict[str, Any] = (await r.json())["usage"]
        return usage

    await turn(ids(1, 32), sim_output_token_ids=reply)
    usage = await turn(ids(1, 32) + reply + ids(5000, 16))
    # 2 prompt blocks + the reply's first block (the last reply token is never computed: 63 of 64).
    assert usage["prompt_tokens_details"]["cached_tokens"] == 48
    await turn(ids(2001, 32))  # filler reply
    usage = await turn(ids(2001, 32) + reply + ids(5000, 16))
    assert usage["prompt_tokens_details"]["cached_tokens"] == 32
    body = {"model": MODEL, "prompt": ids(1, 8), "max_tokens": 2, "sim_output_token_ids": ["a"]}
    async with http.post(pod.url + "/v1/completions", json=body) as r:
        assert r.status == 400
        assert "sim_output_token_ids" in (await r.json())["error"]["message"]


# --- KV events: real time == the core in virtual time ------------------------------------------------


@pytest.fixture
def zctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def normal(events: list[Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for e in events:
        if isinstance(e, BlockStored):
            out.append(("stored", e.block_hashes, e.parent_block_hash, e.token_ids, e.lora_name, e.lora_id))
        elif isinstance(e, BlockRemoved):
            out.append(("removed", e.block_hashes))
        else:
            assert isinstance(e, AllBlocksCleared)
            out.append(("cleared",))
    return out


# (prompt, max_tokens, model) in order; None = POST /reset_prefix_cache. 16-token blocks, 40 blocks.
SCENARIO: list[tuple[list[int], int, str] | None] = [
    (ids(100, 70), 4, MODEL),  # 4 full blocks
    (ids(100, 40) + ids(900, 30), 4, MODEL),  # shares 2 blocks
    (ids(100, 70), 30, MODEL),  # a hit; generated tokens complete a block
    (ids(100, 70), 4, "ad"),  # the same tokens under an adapter: nothing shared
    (ids(5000, 300), 2, MODEL),  # 18 blocks: evicts
    (ids(6000, 300), 2, MODEL),  # evicts more
    None,
    (ids(100, 70), 2, MODEL),  # AllBlocksCleared rides with this one's first step
]


async def test_kv_events_equal_the_cores(
    pods: Any, http: aiohttp.ClientSession, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    cfg = SimConfig(
        block_size=16,
        num_gpu_blocks=40,
        time_scale=0.01,
        lora_adapters=("ad",),
        kv_events="tcp://127.0.0.1:0",
    )
    pod = await pods(cfg)
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pod.state.kv_endpoint)
    publisher = pod.state.publisher
    assert publisher is not None
    deadline = time.monotonic() + 5
    while publisher.subscriptions < 1:  # a PUB drops what it sends before this
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)

    for step in SCENARIO:
        if step is None:
            async with http.post(pod.url + "/reset_prefix_cache") as r:
                assert r.status == 200
            continue
        prompt, max_tokens, model = step
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
        async with http.post(pod.url + "/v1/completions", json=body) as r:
            assert r.status == 200
    wire: list[list[tuple[Any, ...]]] = []
    for seq in range(pod.state.kv_last_seq + 1):
        assert sub.poll(5000), "a KV-event batch did not arrive"
        _, seq_frame, payload = sub.recv_multipart()
        assert int.from_bytes(seq_frame, "big") == seq
        wire.append(normal(decode_batch(payload).events))
    sub.close(linger=0)

    engine = core.Engine(pod.state.profile, record_events=True, hasher=BlockHasher(cfg.hash_algo))
    expected: list[list[tuple[Any, ...]]] = []
    now = 0.0
    for i, step in enumerate(SCENARIO):
        if step is None:
            assert engine.reset_prefix_cache()
            continue
        prompt, max_tokens, model = step
        lora = model if model in cfg.lora_adapters else None
        req = core.EngineRequest(f"r{i}", prompt, max_tokens, lora_name=lora, lora_id=cfg.lora_id(model))
        engine.add_request(req, now)
        while engine.has_unfinished():
            now += engine.step(now).duration
            events = engine.take_events()
            if events:
                expected.append(normal(events))

    assert wire == expected
    kinds = {e[0] for batch in wire for e in batch}
    assert kinds == {"stored", "removed", "cleared"}
    assert any(e[0] == "stored" and e[4] == "ad" and e[5] == 1 for batch in wire for e in batch)


async def test_kv_events_can_carry_vllms_whole_digests(
    pods: Any, http: aiohttp.ClientSession, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """As vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: the 32-byte digests a router recomputing
    vLLM's sha256_cbor hashes from the prompt finds, also for blocks that were evicted since."""
    cfg = SimConfig(
        block_size=16,
        num_gpu_blocks=5,  # 4 usable: the second prompt evicts the first one's blocks
        time_scale=0.01,
        kv_events="tcp://127.0.0.1:0",
        hash_algo="sha256_cbor",
        kv_int_hashes=False,
    )
    pod = await pods(cfg)
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pod.state.kv_endpoint)
    publisher = pod.state.publisher
    assert publisher is not None
    deadline = time.monotonic() + 5
    while publisher.subscriptions < 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    prompts = [list(range(1, 50)), list(range(100, 149))]
    for prompt in prompts:
        async with http.post(pod.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as r:
            assert r.status == 200
    stored: list[bytes] = []
    removed: list[bytes] = []
    for _ in range(pod.state.kv_last_seq + 1):
        assert sub.poll(5000), "a KV-event batch did not arrive"
        payload = msgspec.msgpack.decode(sub.recv_multipart()[2])
        for event in payload[1]:
            (stored if event["type"] == "BlockStored" else removed).extend(event["block_hashes"])
    sub.close(linger=0)
    hasher = BlockHasher("sha256_cbor")
    wanted = [d for p in prompts for d in hasher.digests(p, 16)]
    assert stored == wanted  # 3 full blocks each (48 of 49 tokens)
    assert removed and set(removed) <= set(wanted[:3])  # the first prompt's, as whole digests too
