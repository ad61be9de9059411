"""Conformance: the step-based engine, given a real vLLM's requests at the same steps with the same
limits, schedules the same tokens and publishes the same KV events, step by step.

The captures (tests/kvcache/data/vllm-0.32-cpu-capture-2.json and on) were recorded by
scripts/capture_kv_events.py, which drives vLLM 0.32's own engine in-process one `step()` at a time
(CPU vLLM never schedules asynchronously, so a step is one schedule and at most one event batch),
adds each request and makes each prefix-cache reset before a chosen step, and reads the batches off
a ZMQ SUB socket: the raw bytes vLLM published, decoded here by epp's own decoder. Each capture
stresses one thing under eviction pressure (its `description` says what): concurrent requests in
one step, chunked prefill, preemption, resets with running requests.

The engine generates the tokens vLLM generated (`output_token_ids`), so every block's tokens are
the same on both sides and blocks are compared by content: a block is the whole token sequence up
to its end (the hashes differ by design: blake2b against vLLM's SHA-256). `BlockRemoved` is resolved
through the hashes its side stored before. Everything else an event carries is compared as is
(`medium` in lower case: epp's decoder lower-cases it). Per step, the scheduled tokens per request
(in vLLM's order) and the preempted requests must match too, so a passing capture means the same
schedule, not just the same cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, Event, decode_batch
from epp.sim import core, profiles

DATA_DIR = Path(__file__).resolve().parent.parent / "kvcache" / "data"
CAPTURES = sorted(
    p for p in DATA_DIR.glob("vllm-0.32-cpu-capture-*.json") if not p.name.endswith("capture-1.json")
)


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


Normal = tuple[Any, ...]


class Normaliser:
    """One side's events in hash-free form: blocks as the token sequences they end."""

    def __init__(self) -> None:
        self.seq: dict[int, tuple[int, ...]] = {}  # hash -> the tokens from the sequence's start

    def batch(self, events: list[Event]) -> list[Normal]:
        out: list[Normal] = []
        for ev in events:
            if isinstance(ev, BlockStored):
                prefix = () if ev.parent_block_hash is None else self.seq[ev.parent_block_hash]
                keys = []
                for i, h in enumerate(ev.block_hashes):
                    prefix = prefix + tuple(ev.token_ids[i * ev.block_size : (i + 1) * ev.block_size])
                    self.seq[h] = prefix
                    keys.append(prefix)
                out.append(
                    (
                        "stored",
                        tuple(keys),
                        ev.parent_block_hash is None,
                        ev.block_size,
                        ev.lora_id,
                        ev.lora_name,
                        ev.extra_keys,
                        (ev.medium or "").lower(),
                    )
                )
            elif isinstance(ev, BlockRemoved):
                out.append(
                    ("removed", tuple(self.seq[h] for h in ev.block_hashes), (ev.medium or "").lower())
                )
            else:
                assert isinstance(ev, AllBlocksCleared)
                out.append(("cleared",))
        return out


def profile_for(settings: dict[str, Any]) -> profiles.Profile:
    assert settings["enable_chunked_prefill"] and settings["enable_prefix_caching"]
    # What the engine models: vLLM's defaults for these (the capture records them).
    assert not settings["async_scheduling"] and settings["scheduler_reserve_full_isl"]
    assert settings["watermark"] == 0.0 and settings["long_prefill_token_threshold"] == 0
    assert settings["num_gpu_blocks"] == settings["num_gpu_blocks_override"]
    return profiles.get_profile("tiny").replace(
        name="capture",
        block_size=settings["block_size"],
        num_gpu_blocks=settings["num_gpu_blocks_override"],
        max_model_len=settings["max_model_len"],
        max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
    )


def real_steps(data: dict[str, Any]) -> list[tuple[int, dict[str, int], list[str], list[Normal]]]:
    """Per step: (step, scheduled, preempted, normalised events) as vLLM recorded them."""
    by_seq = {m["seq"]: m for m in data["messages"]}
    norm = Normaliser()
    out = []
    for s in data["steps"]:
        if not s.get("scheduled"):
            # No schedule (an idle engine) or an empty one (vLLM's step after the last requests
            # finished, telling its workers so): the engine has nothing to step.
            assert not s["messages"]
            continue
        events: list[Event] = []
        for seq in s["messages"]:
            events += decode_batch(bytes.fromhex(by_seq[seq]["payload_hex"])).events
        out.append((s["step"], s["scheduled"], s["preempted"], norm.batch(events)))
    return out


def simulated_steps(
    data: dict[str, Any], *, extra_blocks: int = 0
) -> list[tuple[int, dict[str, int], list[str], list[Normal]]]:
    """The same requests through the engine, added and reset before the same steps."""
    prof = profile_for(data["settings"])
    prof = prof.replace(num_gpu_blocks=prof.num_gpu_blocks + extra_blocks)
    engine = core.Engine(prof, record_events=True, record_schedule=True)
    outputs = {r["request_id"]: r["output_token_ids"] for r in data["requests"]}
    norm = Normaliser()
    out = []
    now = 0.0
    for s in data["steps"]:
        for reset in s.get("resets", ()):
            assert (
                engine.reset_prefix_cache(reset_running_requests=reset["reset_running_requests"])
                == (reset["returned"])
            )
        for r in s.get("added", ()):
            req = core.EngineRequest(
                r["request_id"],
                r["prompt_token_ids"],
                r["max_tokens"],
                output_token_ids=outputs[r["request_id"]],
            )
            engine.add_request(req, now)
        if not engine.has_unfinished():
            continue
        now += engine.step(now).duration
        assert engine.last_scheduled is not None and engine.last_preempted is not None
        out.append(
            (
                s["step"],
                dict(engine.last_scheduled),
                sorted(engine.last_preempted),
                norm.batch(engine.take_events()),
            )
        )
    assert not engine.has_unfinished()
    return out


@pytest.mark.parametrize("path", CAPTURES, ids=[p.stem for p in CAPTURES])
def test_engine_matches_the_capture_step_by_step(path: Path) -> None:
    data = load(path)
    real, ours = real_steps(data), simulated_steps(data)
    for theirs, mine in zip(real, ours, strict=False):
        step = theirs[0]
        assert mine[0] == step
        assert list(mine[1].items()) == list(theirs[1].items()), f"step {step}: scheduled tokens"
        assert mine[2] == theirs[2], f"step {step}: preempted"
        assert mine[3] == theirs[3], f"step {step}: KV events"
    assert len(ours) == len(real)


@pytest.mark.parametrize("path", CAPTURES, ids=[p.stem for p in CAPTURES])
def test_one_block_more_would_not_match(path: Path) -> None:
    """Each capture pins the pool at its flag less vLLM's null block: with the flag's count usable
    (the model before issue 15) the engine schedules or evicts differently somewhere."""
    data = load(path)
    assert simulated_steps(data, extra_blocks=1) != real_steps(data)


@pytest.mark.parametrize("path", CAPTURES, ids=[p.stem for p in CAPTURES])
def test_the_capture_exercises_what_it_claims(path: Path) -> None:
    """Guards against a vacuous pass: each capture has what its scenario is about."""
    data = load(path)
    steps = real_steps(data)
    events = [e for _, _, _, batch in steps for e in batch]
    assert data["messages"] and [m["seq"] for m in data["messages"]] == list(range(len(data["messages"])))
    assert any(e[0] == "removed" for e in events), "no eviction"
    scenario = data["scenario"]
    if scenario == "concurrent":
        assert max(len(sched) for _, sched, _, _ in steps) == data["settings"]["max_num_seqs"]
        assert any(sum(1 for e in batch if e[0] == "stored") > 1 for _, _, _, batch in steps)
    elif scenario == "chunked":
        budget = data["settings"]["max_num_batched_tokens"]
        assert any(sum(sched.values()) == budget and len(sched) > 1 for _, sched, _, _ in steps)
        assert max(len(r["prompt_token_ids"]) for r in data["requests"]) > 2 * budget
    elif scenario == "preemption":
        assert sum(len(pre) for _, _, pre, _ in steps) >= 3
    elif scenario == "reset":
        resets = [r for s in data["steps"] for r in s.get("resets", ())]
        assert {(r["reset_running_requests"], r["returned"]) for r in resets} >= {
            (False, False),
            (True, True),
        }
        assert sum(1 for e in events if e[0] == "cleared") >= 2
    else:
        pytest.fail(f"unknown scenario {scenario!r}")
