"""epp block keys: determinism across processes, chaining, full blocks only, seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.kvcache.keys import KEY_MASK, block_keys, seed_for

# CPython's tuple hash (Objects/tupleobject.c, 3.8+, 64-bit), written over plain integers so that
# it cannot depend on the interpreter's hash secret.
_P = (1 << 61) - 1
_M64 = (1 << 64) - 1
_XXPRIME_1 = 11400714785074694791
_XXPRIME_2 = 14029467366897019727
_XXPRIME_5 = 2870177450012600261


def _int_lane(n: int) -> int:
    h = abs(n) % _P
    h = -h if n < 0 else h
    return (-2 if h == -1 else h) & _M64


def _tuple_lane(lanes: list[int]) -> int:
    acc = _XXPRIME_5
    for lane in lanes:
        acc = (acc + lane * _XXPRIME_2) & _M64
        acc = ((acc << 31) | (acc >> 33)) & _M64
        acc = (acc * _XXPRIME_1) & _M64
    acc = (acc + (len(lanes) ^ (_XXPRIME_5 ^ 3527539))) & _M64
    return 1546275796 if acc == _M64 else acc


def reference_keys(tokens: list[int], size: int, start: int) -> list[int]:
    out = []
    h = start
    for i in range(0, len(tokens) - size + 1, size):
        block = _tuple_lane([_int_lane(t) for t in tokens[i : i + size]])
        h = _tuple_lane([_int_lane(h), block]) & KEY_MASK
        out.append(h)
    return out


TOKENS = list(range(1000, 1040)) + [7] * 8  # 48 tokens: 3 blocks of 16


def test_golden_values() -> None:
    # Pinned: a change here means keys differ between epp builds or interpreters.
    seed = seed_for("Qwen/Qwen3-32B")
    assert seed == 0x02F0BAC5332EB1E9
    assert block_keys(TOKENS, 16, seed=seed) == [
        0x0C1C8B24DF38D666,
        0x0630A28F28C477BF,
        0x073F1C7414FC9C7C,
    ]


@given(
    tokens=st.lists(st.integers(0, 300_000), max_size=80),
    size=st.sampled_from([1, 2, 3, 16]),
    start=st.integers(0, KEY_MASK),
)
def test_equal_to_the_tuple_hash_spec(tokens: list[int], size: int, start: int) -> None:
    assert block_keys(tokens, size, seed=start) == reference_keys(tokens, size, start)


@given(
    tokens=st.lists(st.integers(-(1 << 70), 1 << 70) | st.integers(-3, 3), max_size=60),
    size=st.sampled_from([1, 2, 5, 16]),
    start=st.integers(0, KEY_MASK),
)
def test_equal_to_pythons_own_tuple_hash(tokens: list[int], size: int, start: int) -> None:
    # The C chain (epp/kvcache/_keys.c) writes out CPython's tuple hash; ints of any size and sign
    # take CPython's own int hash.
    expected = []
    h = start
    for blk in zip(*[iter(tokens)] * size, strict=False):
        h = hash((h, blk)) & KEY_MASK
        expected.append(h)
    assert block_keys(tokens, size, seed=start) == expected


def test_same_in_processes_with_other_hash_seeds() -> None:
    seed = seed_for("m", lora_name="a", cache_salt="s")
    expected = [seed, block_keys(TOKENS, 16, seed=seed), block_keys(TOKENS, 8, seed=1, parent=99)]
    code = (
        "import json; from epp.kvcache.keys import block_keys as k, seed_for;"
        "s = seed_for('m', lora_name='a', cache_salt='s');"
        f"t = {TOKENS!r};"
        "print(json.dumps([hash('salted?'), [s, k(t, 16, seed=s), k(t, 8, seed=1, parent=99)]]))"
    )
    str_hashes = set()
    for hashseed in ("1", "12345", "random"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        str_hash, keys = json.loads(out.stdout)
        str_hashes.add(str_hash)
        assert keys == expected, hashseed
    assert len(str_hashes) == 3  # the seeds took effect: str hashes differ, keys do not


def test_chained_over_the_whole_prefix() -> None:
    seed = seed_for("m")
    whole = block_keys(TOKENS, 16, seed=seed)
    head = block_keys(TOKENS[:16], 16, seed=seed)
    tail = block_keys(TOKENS[16:], 16, seed=12345, parent=head[-1])  # the parent wins over the seed
    assert whole == head + tail
    # The same block after another prefix is another key.
    other = block_keys([1] * 16 + TOKENS[16:32], 16, seed=seed)
    assert other[1] != whole[1]
    assert len(set(whole)) == 3


def test_full_blocks_only() -> None:
    seed = seed_for("m")
    assert block_keys(TOKENS[:15], 16, seed=seed) == []
    assert block_keys([], 16, seed=seed) == []
    assert block_keys(TOKENS[:47], 16, seed=seed) == block_keys(TOKENS[:32], 16, seed=seed)
    assert len(block_keys(TOKENS, 16, seed=seed)) == 3


def test_block_size_changes_keys() -> None:
    seed = seed_for("m")
    assert block_keys(TOKENS[:32], 32, seed=seed)[0] not in block_keys(TOKENS[:32], 16, seed=seed)


def test_any_int_sequence_gives_the_same_keys() -> None:
    # Requests may carry lists, events lists, tests tuples or arrays: only the ints matter.
    seed = seed_for("m")
    expected = block_keys(TOKENS, 16, seed=seed)
    assert block_keys(tuple(TOKENS), 16, seed=seed) == expected
    assert block_keys(array("q", TOKENS), 16, seed=seed) == expected


@given(tokens=st.lists(st.integers(0, 1 << 40), max_size=64), seed=st.integers(0, KEY_MASK))
def test_keys_are_60_bit(tokens: list[int], seed: int) -> None:
    assert all(0 <= k <= KEY_MASK for k in block_keys(tokens, 4, seed=seed))


def test_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        block_keys(TOKENS, 0, seed=1)


def test_seeds_differ_by_model_lora_and_salt() -> None:
    seeds = {
        seed_for("m"),
        seed_for("m2"),
        seed_for("m", lora_name="a"),
        seed_for("m", lora_name=""),
        seed_for("m", cache_salt="a"),
        seed_for("m", lora_name="a", cache_salt="a"),
        # No field boundary can be moved: length-prefixed encoding.
        seed_for("ma"),
        seed_for("m", lora_name="ab"),
        seed_for("ma", lora_name="b"),
    }
    assert len(seeds) == 9
    assert all(0 <= s <= KEY_MASK for s in seeds)
    assert seed_for("m", lora_name="a") == seed_for("m", lora_name="a")
