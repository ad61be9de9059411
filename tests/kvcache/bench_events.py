"""Decode throughput of epp.kvcache.events.decode_batch, in blocks per second, per wire encoding.

Run: .venv/bin/python tests/kvcache/bench_events.py [--quick]
Not a test (timings are machine-dependent); the numbers back the design note in
epp/kvcache/events.py. The ingestion target is >= 500k blocks/s in one process, so the decoder
should take a small share of it.

Batches are shaped like a busy vLLM step: 8 BlockStored events of 16 full blocks each, 16-token
blocks, token ids from a 152k vocabulary (msgpack uint32), hashes random uint64 or 32-byte SHA-256
digests; plus an eviction burst (vLLM sends one BlockRemoved per evicted block) and a real capture.
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `epp`

import msgspec

from epp.kvcache import events

VECTORS = Path(__file__).resolve().parent / "data" / "vllm-0.32-cpu-capture-1.json"
ENCODE = msgspec.msgpack.Encoder().encode
TS = 1767225600.5


def stored_fields(rng: random.Random, n_blocks: int, block_size: int, digest: bool) -> dict[str, Any]:
    def new_hash() -> int | bytes:
        return rng.randbytes(32) if digest else rng.getrandbits(64)

    return {
        "block_hashes": [new_hash() for _ in range(n_blocks)],
        "parent_block_hash": new_hash(),
        "token_ids": [rng.randrange(151_936) for _ in range(n_blocks * block_size)],
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * n_blocks,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def as_map(tag: str, fields: dict[str, Any]) -> dict[str, Any]:
    """vLLM 0.24+: a tagged map, defaults (None) left out except the fields without a default."""
    required = {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"}
    required.add("lora_name")
    body = {k: v for k, v in fields.items() if v is not None or k in required}
    return {"type": tag, **body}


def as_array(tag: str, fields: dict[str, Any]) -> list[Any]:
    """vLLM 0.22-0.23: a tagged 12-element array (every field written, sliding window nil)."""
    if tag == "BlockStored":
        return [tag, *fields.values(), None]
    return [tag, *fields.values()]


def stored_batch(form: str, digest: bool, events_n: int = 8, blocks: int = 16, bsize: int = 16) -> bytes:
    rng = random.Random(42)
    wrap = as_map if form == "map" else as_array
    evs = [wrap("BlockStored", stored_fields(rng, blocks, bsize, digest)) for _ in range(events_n)]
    return ENCODE([TS, evs, 0])


def tolerant_batches() -> tuple[bytes, bytes]:
    """Payloads only tier 2 takes: vLLM 0.9.0 (2-element batch, 6-element events, `builtin` hashes,
    negative about half the time), and a current batch ending with an event type unknown here."""
    rng = random.Random(9)
    old = []
    for _ in range(8):
        f = stored_fields(rng, 16, 16, False)
        signed = [h - (1 << 64) if h >= 1 << 63 else h for h in [*f["block_hashes"], f["parent_block_hash"]]]
        old.append(["BlockStored", signed[:-1], signed[-1], f["token_ids"], 16, None])
    current = [as_map("BlockStored", stored_fields(rng, 16, 16, False)) for _ in range(8)]
    current.append({"type": "BlockPinned", "block_hashes": [1]})
    return ENCODE([TS, old]), ENCODE([TS, current, 0])


def removed_batch(form: str, n: int = 128) -> bytes:
    rng = random.Random(7)
    wrap = as_map if form == "map" else as_array
    fields = [{"block_hashes": [rng.getrandbits(64)], "medium": "GPU", "group_idx": 0} for _ in range(n)]
    return ENCODE([TS, [wrap("BlockRemoved", f) for f in fields], 0])


def blocks_in(batch: events.EventBatch) -> int:
    return sum(len(e.block_hashes) for e in batch.events if not isinstance(e, events.AllBlocksCleared))


def bench(cases: list[tuple[str, Callable[[], object]]], runs: int, rounds: int = 5) -> list[float]:
    """Median seconds per call of each case. The cases take turns in `rounds` rounds, so that a
    noisy neighbour on this shared VM spreads over all of them; warm-up first, GC collected before
    each round (the GC stays on: its cost on the lists a decode creates is part of the real cost).
    """
    times: list[list[float]] = [[] for _ in cases]
    for _, fn in cases:
        for _ in range(min(runs, 200)):
            fn()
    for _ in range(rounds):
        for i, (_, fn) in enumerate(cases):
            gc.collect()
            for _ in range(runs // rounds):
                t0 = time.perf_counter()
                fn()
                times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def main() -> None:
    runs = 2_000 if "--quick" in sys.argv else 20_000
    capture = json.loads(VECTORS.read_text())["captures"]
    real = {c["name"][0]: bytes.fromhex(c["messages"][3]["payload_hex"]) for c in capture}
    cases = [
        ("map 0.24+, int hashes      8x16 blocks x16 tok", stored_batch("map", False)),
        ("array 0.22, int hashes     8x16 blocks x16 tok", stored_batch("array", False)),
        ("map 0.24+, 32-byte hashes  8x16 blocks x16 tok", stored_batch("map", True)),
        ("array 0.22, 32-byte hashes 8x16 blocks x16 tok", stored_batch("array", True)),
        ("map 0.24+, int hashes      1x128 blocks x16 tok", stored_batch("map", False, 1, 128)),
        ("map, eviction burst 128 BlockRemoved x1 block", removed_batch("map")),
        ("array, eviction burst 128 BlockRemoved x1 block", removed_batch("array")),
        ("0.9.0, negative int64 hashes 8x16 blocks x16 tok", tolerant_batches()[0]),
        ("map, int hashes, 8x16 blocks + 1 unknown event", tolerant_batches()[1]),
        ("real vLLM 0.32 capture A#3: 15 blocks x32 tok", real["A"]),
        ("real vLLM 0.32 capture C#3: same, bytes hashes", real["C"]),
    ]
    untyped = msgspec.msgpack.Decoder()

    def calls(payload: bytes) -> list[tuple[str, Callable[[], object]]]:
        return [
            ("decode_batch", lambda: events.decode_batch(payload)),
            ("floor", lambda: untyped.decode(payload)),
        ]

    timed = [call for _, payload in cases for call in calls(payload)]
    medians = bench(timed, runs)
    print(f"decode_batch, median of {runs} runs per case, cases interleaved; 'floor' = untyped msgspec")
    print(f"decode of the same bytes: msgpack parsing alone.  python {sys.version.split()[0]}")
    for i, (name, payload) in enumerate(cases):
        batch = events.decode_batch(payload)
        assert batch.invalid == 0 and batch.skipped == ("unknown" in name)
        n = blocks_in(batch)
        med, floor = medians[2 * i], medians[2 * i + 1]
        tier = "fast" if events._decode_fast(payload) is not None else "tolerant"
        print(
            f"  {name:50} {len(payload):6} B {n:4} blk  {med * 1e6:6.1f} us"
            f"  {n / med / 1e6:5.2f} M blocks/s  (floor {n / floor / 1e6:5.2f} M)  {tier}"
        )


if __name__ == "__main__":
    main()
