"""The simulator's KV events, end to end on the wire: a real ZMQ SUB socket receives them,
`epp.kvcache.events.decode_batch` decodes them and `epp.kvcache.index.BlockIndex` applies them.

The key check: for any prompt, the blocks epp's index says the replica holds (epp's own keys,
computed from the token ids epp would compute) are the blocks the replica itself has cached.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import zmq

from epp.api.requests import Api, parse_request, plain_prompt
from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, decode_batch
from epp.kvcache.index import ApplyStats, BlockIndex
from epp.kvcache.keys import block_keys, seed_for
from epp.sim.engine import SimConfig, SimState
from epp.sim.fleet import SimFleet
from epp.sim.server import bound_address, sim_state, start_sim_server
from epp.tokenize.chat import encode_chat
from epp.tokenize.tokenizer import load_shipped

MODEL = "sim-model"
ADAPTER = "sql-lora"
BS = 16
POD = "pod-a"
SYSTEM = "You are a careful assistant who answers in full sentences. " * 12
_TOKENIZER = load_shipped()


class Replica:
    """One simulated replica with KV events, a SUB socket on them and an epp index fed from it."""

    def __init__(self, url: str, state: SimState, sub: zmq.Socket[bytes]) -> None:
        self.url = url
        self.state = state
        self.sub = sub
        self.index = BlockIndex()
        self.applied = ApplyStats()
        self.batches: list[tuple[bytes, int, EventBatch]] = []
        self._seq = -1

    async def drain(self, within: float = 5.0) -> list[EventBatch]:
        """Receive and apply every batch the replica has published so far."""
        new: list[EventBatch] = []
        deadline = time.monotonic() + within
        while self._seq < self.state.kv_last_seq:
            if not self.sub.poll(0):
                assert time.monotonic() < deadline, "KV events did not arrive"
                await asyncio.sleep(0.002)
                continue
            topic, seq_frame, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq_frame, "big")
            assert seq == self._seq + 1, "no batch may be lost"
            self._seq = seq
            batch = decode_batch(payload)
            assert batch.skipped == 0 and batch.invalid == 0
            st = self.index.apply(POD, batch, model=MODEL)
            for field in ApplyStats.__struct_fields__:
                setattr(self.applied, field, getattr(self.applied, field) + getattr(st, field))
            self.batches.append((topic, seq, batch))
            new.append(batch)
        return new

    def epp_blocks(self, tokens: list[int], *, lora: str | None = None, salt: str | None = None) -> int:
        keys = block_keys(tokens, BS, seed=seed_for(MODEL, lora_name=lora, cache_salt=salt))
        found = self.index.match(keys).get(POD)
        return 0 if found is None else found.blocks

    def sim_blocks(self, tokens: list[int], *, lora: str | None = None, salt: str | None = None) -> int:
        return self.state.cached_blocks(tokens, lora_name=lora, cache_salt=salt)

    async def post(self, http: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with http.post(self.url + path, json=body) as r:
            assert r.status == 200, await r.text()
            reply: dict[str, Any] = await r.json()
        await self.drain()
        return reply


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
def zctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
async def replica(zctx: zmq.Context[zmq.Socket[bytes]]) -> AsyncIterator[Replica]:
    cfg = SimConfig(
        time_scale=0.001,
        block_size=BS,
        num_gpu_blocks=49,  # 48 usable beside the null block, ~3 system prompts: the workload evicts
        lora_adapters=(ADAPTER,),
        kv_events="tcp://127.0.0.1:0",
        kv_replay="tcp://127.0.0.1:0",
    )
    runner = await start_sim_server("127.0.0.1", 0, config=cfg)
    state = sim_state(runner)
    assert state.kv_endpoint is not None
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(state.kv_endpoint)
    try:
        assert state.publisher is not None
        deadline = time.monotonic() + 5
        while state.publisher.subscriptions < 1:  # a PUB drops what it sends before this
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        yield Replica(f"http://{bound_address(runner)}", state, sub)
    finally:
        sub.close(linger=0)
        await runner.cleanup()


def epp_tokens(path: str, body: dict[str, Any]) -> list[int]:
    """The token ids epp computes for a request before scheduling (as the Director does)."""
    req = parse_request(path=path, headers={}, body=json.dumps(body).encode(), request_id="t")
    if req.token_ids is not None:
        return req.token_ids
    if req.api is Api.CHAT:
        return encode_chat(_TOKENIZER, body)  # the chat template, as vLLM's chat endpoint
    text = plain_prompt(req)
    assert text is not None
    return _TOKENIZER.encode(text)


def chat(text: str, model: str = MODEL, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    return {"model": model, "messages": messages, "max_tokens": 2, **extra}


async def test_index_agrees_with_the_replica_cache(replica: Replica, http: aiohttp.ClientSession) -> None:
    chat_path, completions = "/v1/chat/completions", "/v1/completions"
    question = "Question 0: why is the sky blue?"
    # (path, body, LoRA adapter, cache salt) in the order they are sent.
    requests: list[tuple[str, dict[str, Any], str | None, str | None]] = [
        (chat_path, chat(f"Question {i}: why is the sky blue?"), None, None) for i in range(4)
    ]
    requests.append((chat_path, chat(question, ADAPTER), ADAPTER, None))
    requests.append((chat_path, chat(question, cache_salt="tenant-1"), None, "tenant-1"))
    token_prompt = {"model": MODEL, "prompt": list(range(500, 600)), "max_tokens": 20}
    requests.append((completions, token_prompt, None, None))
    for i in range(3):  # other long prompts: these evict the system prompt's blocks
        text = f"Document {i}. " + "A wholly different prefix with its own words. " * 25
        requests.append((completions, {"model": MODEL, "prompt": text, "max_tokens": 2}, None, None))
    requests.append((chat_path, chat("Question 1: why is the sky blue?"), None, None))

    for n, (path, body, _, _) in enumerate(requests, start=1):
        reply = await replica.post(http, path, body)
        assert reply["usage"]["prompt_tokens"] == len(epp_tokens(path, body))  # tokenized as epp does
        # After every request, for every prompt sent so far: epp's view == the replica's cache.
        for p, b, lora, salt in requests[:n]:
            tokens = epp_tokens(p, b)
            assert replica.epp_blocks(tokens, lora=lora, salt=salt) == replica.sim_blocks(
                tokens, lora=lora, salt=salt
            )

    assert replica.applied.removed > 0, "the workload was meant to evict"
    assert replica.applied.orphans == 0 and replica.applied.missed_removals == 0
    assert replica.index.stats().entries == replica.state.engine.num_cached_blocks
    assert {topic for topic, _, _ in replica.batches} == {b""}  # vLLM's default topic
    stored = [e for _, _, b in replica.batches for e in b.events if isinstance(e, BlockStored)]
    assert any(e.lora_name == ADAPTER and e.lora_id == 1 for e in stored)
    salted = [e for e in stored if e.extra_keys and e.extra_keys[0] == ["tenant-1"]]
    assert salted and salted[0].parent_block_hash is None


async def test_cached_tokens_follow_the_blocks(replica: Replica, http: aiohttp.ClientSession) -> None:
    first = await replica.post(http, "/v1/chat/completions", chat("First question?"))
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    second = await replica.post(http, "/v1/chat/completions", chat("Second question?"))
    a = epp_tokens("/v1/chat/completions", chat("First question?"))
    b = epp_tokens("/v1/chat/completions", chat("Second question?"))
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    expected = min(common // BS, (len(b) - 1) // BS) * BS
    assert expected > 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == expected
    # The same request under an adapter or a salt shares nothing with it.
    lora = await replica.post(http, "/v1/chat/completions", chat("Second question?", ADAPTER))
    assert lora["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    salted = await replica.post(http, "/v1/chat/completions", chat("Second question?", cache_salt="x"))
    assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    again = await replica.post(http, "/v1/chat/completions", chat("Second question?", cache_salt="x"))
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (len(b) - 1) // BS * BS


async def test_eviction_sends_block_removed_for_the_oldest_tail(
    replica: Replica, http: aiohttp.ClientSession
) -> None:
    # Token-id prompts of exactly 16 blocks each: the pool (48 blocks) holds three.
    prompts = [list(range(1000 * (i + 1), 1000 * (i + 1) + 16 * BS)) for i in range(4)]
    stored: list[list[int]] = []
    for p in prompts[:3]:
        await replica.post(http, "/v1/completions", {"model": MODEL, "prompt": p, "max_tokens": 1})
        (batch,) = [b for _, _, b in replica.batches[-1:]]
        (ev,) = batch.events
        assert isinstance(ev, BlockStored)
        stored.append(ev.block_hashes)
    assert replica.state.engine.num_cached_blocks == 48
    await replica.post(http, "/v1/completions", {"model": MODEL, "prompt": prompts[3], "max_tokens": 1})
    removed = [
        e.block_hashes[0] for _, _, b in replica.batches for e in b.events if isinstance(e, BlockRemoved)
    ]
    # The first prompt's blocks, freed first, go first, its last block before its first.
    assert removed == stored[0][::-1]
    assert replica.epp_blocks(prompts[0]) == replica.sim_blocks(prompts[0]) == 0
    assert replica.epp_blocks(prompts[1]) == replica.sim_blocks(prompts[1]) == 16


async def test_reset_prefix_cache_sends_all_blocks_cleared(
    replica: Replica, http: aiohttp.ClientSession
) -> None:
    body = chat("Anything?")
    await replica.post(http, "/v1/chat/completions", body)
    tokens = epp_tokens("/v1/chat/completions", body)
    assert replica.epp_blocks(tokens) > 0
    async with http.post(replica.url + "/reset_prefix_cache") as r:
        assert r.status == 200
    assert replica.sim_blocks(tokens) == 0
    # As vLLM: the event waits in the engine and goes out with the next step's events.
    assert await replica.drain() == []
    other = chat("Something else entirely?")
    before = len(replica.batches)
    await replica.post(http, "/v1/chat/completions", other)
    first = replica.batches[before][2]  # the new request's first step
    assert first.events[0] == AllBlocksCleared()
    assert [type(e) for e in first.events[1:]] == [BlockStored]
    assert replica.epp_blocks(tokens) == replica.sim_blocks(tokens) > 0  # the shared system prompt
    other_tokens = epp_tokens("/v1/chat/completions", other)
    assert replica.epp_blocks(other_tokens) == replica.sim_blocks(other_tokens) > 0
    # The replay socket serves the buffered batches too.
    assert replica.state.kv_replay_endpoint is not None and replica.state.kv_replay_endpoint.startswith(
        "tcp://"
    )


def test_fleet_exposes_kv_endpoints() -> None:
    configs = [SimConfig(kv_events="tcp://127.0.0.1:0", kv_replay="tcp://127.0.0.1:0"), SimConfig()]
    with SimFleet(configs) as fleet:
        assert fleet.kv_endpoints[0] is not None and fleet.kv_endpoints[0].startswith("tcp://127.0.0.1:")
        assert not fleet.kv_endpoints[0].endswith(":0")
        assert fleet.kv_replay_endpoints[0] is not None and fleet.kv_replay_endpoints[1] is None
        assert fleet.kv_endpoints[1] is None
        assert fleet.kv_subscriptions() == [0, 0]
