"""The simulator's vLLM hashes equal vLLM 0.32's own (vectors from scripts/vllm_hash_vectors.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from epp.sim import blocks
from epp.sim.blocks import BlockHasher

VECTORS = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "vllm_hashes.jsonl").read_text().splitlines()
]


@pytest.mark.parametrize("case", VECTORS, ids=lambda c: f"{c['algo']}-seed{c['seed']}-bs{c['block_size']}")
def test_block_hashes_equal_vllms(case: dict[str, Any]) -> None:
    seed = case["seed"] if case["seed"] is not None else blocks.VLLM_NONE_HASH_SEED
    hasher = BlockHasher(case["algo"], seed=seed)
    lora = case["lora"]
    got = hasher.digests(
        case["token_ids"],
        case["block_size"],
        lora_name=lora[0] if lora else None,
        lora_path=lora[1] if lora else None,
        cache_salt=case["cache_salt"],
    )
    assert [d.hex() for d in got] == case["digests"]


def test_the_seed_comes_from_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "42")
    assert BlockHasher("sha256_cbor").none_hash == BlockHasher("sha256_cbor", seed="42").none_hash
    monkeypatch.delenv("PYTHONHASHSEED")
    assert BlockHasher("sha256").seed == "vllm-none-hash"


def test_extending_equals_hashing_at_once() -> None:
    hasher = BlockHasher("sha256")
    tokens = list(range(100))
    grown: list[blocks.Digest] = []
    assert hasher.extend(grown, tokens[:40], 16) == 2
    assert hasher.extend(grown, tokens, 16) == 4
    assert grown == hasher.digests(tokens, 16)


def test_an_unknown_algorithm_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown hash algorithm 'xxhash'"):
        BlockHasher("xxhash")  # type: ignore[arg-type]
