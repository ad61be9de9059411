"""Record what a real vLLM 0.32 publishes on its KV-event socket, step by step, for the simulator's
conformance tests (tests/sim/test_conformance.py). Runs in the vLLM venv:

    .venv-vllm/bin/python e2e/vllm/build_model.py BUILD_DIR         # the tiny model, once
    .venv-vllm/bin/python scripts/capture_kv_events.py --model BUILD_DIR/model \\
        --scenario concurrent --out tests/kvcache/data/vllm-0.32-cpu-capture-2.json

Why in-process: over HTTP the requests of one moment land in engine steps by timing, so a capture
could not be replayed step for step. Here vLLM's own `LLMEngine` runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) and the script chooses before which `step()` each request is
added and each prefix-cache reset is made; CPU vLLM never schedules asynchronously, so one `step()`
is one schedule, one forward pass and one `update_from_output`, which publishes at most one event
batch. The batches are read back from a ZMQ SUB socket this script binds (vLLM's PUB connects to
a concrete address), so the recorded frames are the bytes vLLM put on the wire. To tie each batch
to its step, the scheduler's publisher is wrapped to count `publish` calls (the batch itself is
passed on untouched) and the script waits for exactly that many messages after each step. The
scheduler's `schedule` is wrapped the same way, to record what each step scheduled (tokens per
request, in vLLM's order) and which requests it preempted: context for anyone debugging a
mismatch, not part of what the tests compare.

Every request is greedy with `ignore_eos`, so its length is exactly `max_tokens`; the generated ids
are recorded, so a replay can generate the same tokens. Sequence numbers must start at 0 and run
without a gap (a slow-joining subscriber would lose the first batches): the script checks it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK_SIZE = 32  # CPU vLLM accepts multiples of 32 only
VOCAB = (3, 8000)  # ids drawn for prompts: the e2e model's plain BPE ids, no special tokens


def _env(workdir: Path) -> None:
    """vLLM's environment, set before vLLM is imported (it reads several at import)."""
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CACHE_ROOT=str(workdir / "cache"),
        TORCHINDUCTOR_CACHE_DIR=str(workdir / "inductor"),
        TMPDIR=str(tmp),
        OMP_NUM_THREADS="1",
    )
    os.environ.pop("PYTHONHASHSEED", None)  # the default NONE_HASH seed, as capture-1


def ids(seed: int, n: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(*VOCAB) for _ in range(n)]


@dataclass
class Req:
    id: str
    prompt: list[int]
    max_tokens: int


@dataclass
class Scenario:
    """Engine limits, and what happens before which step (0-based)."""

    description: str
    num_gpu_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    adds: dict[int, list[Req]] = field(default_factory=dict)
    # step -> reset_running_requests flags of the resets made before it, in order
    resets: dict[int, list[bool]] = field(default_factory=dict)


def _concurrent() -> Scenario:
    shared = ids(1, 64)
    a = [*shared, *ids(2, 60)]
    return Scenario(
        description=(
            "Concurrent requests under eviction pressure: five requests arrive before step 0 (two "
            "share a 2-block prefix, one repeats another's prompt in the same step, so both compute "
            "and cache the same blocks; max_num_seqs 4 keeps the fifth waiting), more arrive while "
            "they decode and evict cached blocks, then earlier prompts come back."
        ),
        num_gpu_blocks=24,
        max_model_len=512,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        adds={
            0: [
                Req("A", a, 40),
                Req("B", [*shared, *ids(3, 50)], 24),
                Req("C", ids(4, 90), 8),
                Req("D", list(a), 4),
                Req("E", ids(5, 100), 10),
            ],
            6: [Req("F", ids(6, 300), 8), Req("G", [*shared, *ids(7, 200)], 4)],
            20: [Req("H", list(a), 6), Req("I", ids(4, 90), 3), Req("J", ids(8, 33), 40)],
            45: [Req("K", [*shared, *ids(9, 150)], 5)],
        },
    )


def _chunked() -> Scenario:
    long1 = ids(11, 700)
    return Scenario(
        description=(
            "Chunked prefill: a budget of 100 tokens a step (not a multiple of the block size), "
            "prompts of 700 and 900 tokens prefilled over many steps beside decoding requests; a "
            "prompt sharing 10 blocks with the first arrives while that one is still prefilling; "
            "the 900-token prompt evicts; two 600-token prompts arrive together, and the second waits "
            "until the first finishes: its first chunk would fit, its whole prompt does not "
            "(scheduler_reserve_full_isl)."
        ),
        num_gpu_blocks=40,
        max_model_len=1024,
        max_num_seqs=8,
        max_num_batched_tokens=100,
        adds={
            0: [Req("L1", long1, 4), Req("d1", ids(12, 40), 30)],
            3: [Req("d2", ids(13, 50), 20), Req("L2", [*long1[:320], *ids(14, 300)], 2)],
            12: [Req("L3", ids(15, 900), 2)],
            14: [Req("d3", ids(16, 70), 12)],
            24: [Req("L4", ids(17, 600), 3), Req("L5", ids(18, 600), 2)],
        },
    )


def _preemption() -> Scenario:
    shared = ids(21, 40)
    reqs = [
        Req("P1", [*shared, *ids(22, 20)], 140),
        Req("P2", [*shared, *ids(23, 25)], 130),
        Req("P3", ids(24, 70), 120),
        Req("P4", ids(25, 45), 150),
        Req("P5", ids(26, 50), 110),
        Req("P6", [*shared, *ids(27, 30)], 100),
    ]
    return Scenario(
        description=(
            "Preemption: 15 usable blocks (480 tokens) and six requests that each grow to 5-6 "
            "blocks while decoding, so the most recently admitted running request is preempted "
            "(recompute) again and again and resumes hitting its own freed blocks; three share a "
            "prefix; a seventh request arrives mid-way."
        ),
        num_gpu_blocks=16,
        max_model_len=256,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        adds={0: reqs, 30: [Req("P7", [*shared, *ids(28, 10)], 60)]},
    )


def _reset() -> Scenario:
    shared = ids(31, 64)
    r1 = [*shared, *ids(32, 36)]
    r2 = [*shared, *ids(33, 50)]
    return Scenario(
        description=(
            "Prefix-cache resets under load: a plain reset while requests hold blocks (refused, no "
            "event), reset_prefix_cache(reset_running_requests=True) mid-load (every running request "
            "preempted, the cache cleared, the requests recompute from scratch), a prompt repeated "
            "afterwards, long prompts (one evicts on an idle engine), then a reset on an idle engine whose "
            "AllBlocksCleared waits for the next step with a request."
        ),
        num_gpu_blocks=24,
        max_model_len=512,
        max_num_seqs=4,
        max_num_batched_tokens=256,
        adds={
            0: [Req("R1", r1, 30), Req("R2", r2, 30)],
            5: [Req("R3", ids(34, 150), 20)],
            15: [Req("R4", list(r1), 8)],
            18: [Req("R6", ids(35, 300), 4)],
            35: [Req("R7", ids(36, 400), 2)],
            60: [Req("R5", list(r2), 4)],
        },
        resets={4: [False], 8: [True], 55: [False]},
    )


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "concurrent": _concurrent,
    "chunked": _chunked,
    "preemption": _preemption,
    "reset": _reset,
}


def _sub_socket() -> tuple[Any, str]:
    import zmq

    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 5_000)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _replay(endpoint: str, start: int) -> list[list[bytes]]:
    """Batches from `start` on, from vLLM's replay buffer (the same payload bytes it published)."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        out: list[list[bytes]] = []
        while True:
            _, topic, seq, payload = sock.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                return out
            out.append([topic, seq, payload])
    finally:
        sock.close()


def capture(model: Path, scenario_name: str, workdir: Path) -> dict[str, Any]:
    _env(workdir)
    import msgspec
    import torch
    import vllm
    import zmq
    from vllm import EngineArgs, SamplingParams
    from vllm.config import KVEventsConfig
    from vllm.v1.engine.llm_engine import LLMEngine

    sc = SCENARIOS[scenario_name]()
    sock, endpoint = _sub_socket()
    replay_endpoint = f"tcp://127.0.0.1:{_free_port()}"
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay_endpoint,
        "topic": "kv-events",
    }
    args = EngineArgs(
        model=str(model),
        dtype="bfloat16",
        seed=0,
        max_model_len=sc.max_model_len,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=True,
        num_gpu_blocks_override=sc.num_gpu_blocks,
        max_num_seqs=sc.max_num_seqs,
        max_num_batched_tokens=sc.max_num_batched_tokens,
        enable_chunked_prefill=True,
        enforce_eager=True,
        kv_events_config=KVEventsConfig(**kv_events),
    )
    engine = LLMEngine.from_engine_args(args)
    core = engine.engine_core.engine_core  # InprocClient -> EngineCore
    sched = core.scheduler
    cfg = core.vllm_config

    published = [0]
    publisher = sched.kv_event_publisher
    real_publish = publisher.publish

    def counting_publish(batch: Any) -> None:
        published[0] += 1
        real_publish(batch)

    publisher.publish = counting_publish
    schedules: list[Any] = []
    real_schedule = sched.schedule

    def recording_schedule(*a: Any, **kw: Any) -> Any:
        out = real_schedule(*a, **kw)
        schedules.append(out)
        return out

    sched.schedule = recording_schedule
    time.sleep(2.0)  # let vLLM's PUB connect and our subscription reach it before anything is sent

    params: dict[str, Any] = {}
    outputs: dict[str, list[int]] = {}
    reported: set[str] = set()
    names: dict[str, str] = {}  # vLLM's request id -> ours
    steps: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    last_action = max([*sc.adds, *sc.resets, 0])
    decoder = msgspec.msgpack.Decoder()
    step = 0
    while True:
        record: dict[str, Any] = {"step": step}
        if step in sc.resets:
            record["resets"] = [
                {
                    "reset_running_requests": flag,
                    "returned": engine.reset_prefix_cache(reset_running_requests=flag),
                }
                for flag in sc.resets[step]
            ]
        if step in sc.adds:
            record["added"] = []
            for r in sc.adds[step]:
                sp = SamplingParams(
                    temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True, detokenize=False
                )
                # vLLM suffixes the id it is given; the record uses the given one.
                names[engine.add_request(r.id, {"prompt_token_ids": r.prompt}, sp)] = r.id
                params[r.id] = r
                record["added"].append(
                    {"request_id": r.id, "prompt_token_ids": r.prompt, "max_tokens": r.max_tokens}
                )
        if not engine.has_unfinished_requests() and step > last_action:
            break
        before, n_sched = published[0], len(schedules)
        for out in engine.step():
            if out.finished:
                outputs[names.get(out.request_id, out.request_id)] = list(out.outputs[0].token_ids)
        if len(schedules) > n_sched:  # an idle engine (requests all finished) does not schedule
            so = schedules[-1]
            record["scheduled"] = {names[k]: n for k, n in so.num_scheduled_tokens.items()}
            record["preempted"] = sorted(names[k] for k in so.preempted_req_ids or ())
        record["finished"] = sorted(set(outputs) - reported)
        reported.update(record["finished"])
        record["messages"] = []
        for _ in range(published[0] - before):
            try:
                frames, via = sock.recv_multipart(), "sub"
            except zmq.Again:
                # A subscriber that joined late lost it: vLLM's replay buffer has the same bytes.
                frames, via = _replay(replay_endpoint, len(messages))[0], "replay"
            topic, seq, payload = frames
            seq_no = int.from_bytes(seq, "big")
            if seq_no != len(messages):
                raise SystemExit(f"sequence {seq_no} where {len(messages)} was due: a batch was lost")
            ts, events, dp_rank = decoder.decode(payload)
            msg = {
                "seq": seq_no,
                "step": step,
                "topic": topic.decode(),
                "seq_hex": seq.hex(),
                "received_via": via,
                "payload_hex": payload.hex(),
                "decoded": {"ts": ts, "events": events, "data_parallel_rank": dp_rank},
            }
            messages.append(msg)
            record["messages"].append(seq_no)
        steps.append(record)
        step += 1
        if step > 5000:
            raise SystemExit("the scenario did not finish in 5000 steps")

    sc_cfg = cfg.scheduler_config
    requests = [
        {
            "request_id": r.id,
            "prompt_token_ids": r.prompt,
            "max_tokens": r.max_tokens,
            "added_before_step": next(s for s, rs in sc.adds.items() if r in rs),
            "output_token_ids": outputs[r.id],
        }
        for r in params.values()
    ]
    return {
        "what": (
            "Raw KV-cache event messages a real vLLM (CPU build) published over ZMQ, with the requests "
            "that produced them, stepped in-process so every batch is tied to the engine step that "
            "published it. Conformance vectors for epp's simulator. Data only."
        ),
        "scenario": scenario_name,
        "description": sc.description,
        "frame_layout": (
            "each ZMQ message has 3 frames: [topic (utf-8, here 'kv-events'), sequence (8-byte "
            "big-endian unsigned, from 0, +1 per message), payload (msgpack array [ts float64, events "
            "array, data_parallel_rank int])]; each event is a msgpack map whose first key 'type' is "
            "the tag. 'decoded' is the payload as msgspec decodes it."
        ),
        "json_note": (
            "block hashes are uint64 and exceed 2^53: parse with a decoder that keeps 64-bit integers exact."
        ),
        "step_note": (
            "steps[i] is engine step i: 'resets' (reset_prefix_cache calls made before it, with what "
            "they returned) and 'added' (add_request calls made before it, in order) happen first; "
            "'scheduled' is vLLM's SchedulerOutput.num_scheduled_tokens (request -> tokens, in vLLM's "
            "order: running requests first, then admissions), 'preempted' its preempted_req_ids, "
            "'finished' the requests whose output finished in the step, 'messages' the seq numbers "
            "of the batches the step published. Sampling: temperature 0, ignore_eos, so each request "
            "generates exactly max_tokens."
        ),
        "settings": {
            "vllm_package": f"vllm-cpu {vllm.__version__}",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "model": (
                "e2e/vllm/build_model.py: random-weight LlamaForCausalLM (seed 0, bfloat16, 2 layers, "
                "hidden 128, 4 heads, vocab 8256) with epp-tiny's tokenizer"
            ),
            "engine": (
                "vllm.v1.engine.llm_engine.LLMEngine.from_engine_args, VLLM_ENABLE_V1_MULTIPROCESSING=0"
            ),
            "block_size": cfg.cache_config.block_size,
            "num_gpu_blocks_override": sc.num_gpu_blocks,
            "num_gpu_blocks": cfg.cache_config.num_gpu_blocks,
            "max_model_len": cfg.model_config.max_model_len,
            "max_num_seqs": sc_cfg.max_num_seqs,
            "max_num_batched_tokens": sc_cfg.max_num_batched_tokens,
            "enable_chunked_prefill": sc_cfg.enable_chunked_prefill,
            "enable_prefix_caching": cfg.cache_config.enable_prefix_caching,
            "async_scheduling": sc_cfg.async_scheduling,
            "scheduler_reserve_full_isl": sc_cfg.scheduler_reserve_full_isl,
            "watermark": sc_cfg.watermark,
            "long_prefill_token_threshold": sc_cfg.long_prefill_token_threshold,
            "policy": str(sc_cfg.policy),
            "enforce_eager": True,
            "prefix_caching_hash_algo": cfg.cache_config.prefix_caching_hash_algo,
            "PYTHONHASHSEED": "unset",
            "kv_events_config": kv_events
            | {
                "endpoint": "tcp://127.0.0.1:<random port>",
                "replay_endpoint": "tcp://127.0.0.1:<random port>",
            },
            "socket_roles": (
                "vLLM's PUB connects; this script's SUB binds. A batch the SUB missed (a slow joiner) "
                "is fetched from vLLM's replay ROUTER: messages[].received_via says which"
            ),
        },
        "requests": requests,
        "steps": steps,
        "messages": messages,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="the model directory (build_model.py's model/)")
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    ap.add_argument("--workdir", type=Path, default=Path("run/capture"), help="vLLM's caches and temp files")
    args = ap.parse_args(argv)
    data = capture(args.model.resolve(), args.scenario, args.workdir.resolve())
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    n_events = sum(len(m["decoded"]["events"]) for m in data["messages"])
    print(
        f"{args.scenario}: {len(data['steps'])} steps, {len(data['messages'])} batches, {n_events} events "
        f"-> {args.out}",
        file=sys.stderr,
    )
    # The engine's threads (the publisher's) would keep the interpreter alive past main().
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
