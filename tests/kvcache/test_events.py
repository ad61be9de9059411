"""epp.kvcache.events: vLLM KV-event decoding.

- conformance against frames captured from a real vLLM 0.32 (data/vllm-0.32-cpu-capture-1.json,
  a copy of shared/vectors/, so the tests do not depend on a path outside the repo);
- every vLLM version's encoding built by hand (0.9.0 to 0.33), and the byte-level example of the
  reference notes (shared/reference/kv-events.md, section 8);
- fuzzing: random bytes, random msgpack values, mutated real frames. Nothing but EventDecodeError
  ever escapes, decoded batches are always well formed, and events are decoded independently
  (a bad event never takes a good one with it).
"""

from __future__ import annotations

import json
import struct
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.kvcache import events as ev_mod
from epp.kvcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    EventDecodeError,
    decode_batch,
)

VECTORS = Path(__file__).resolve().parent / "data" / "vllm-0.32-cpu-capture-1.json"
TS = 1767225600.5
U64 = 1 << 64
encode = msgspec.msgpack.encode


@cache
def vectors() -> dict[str, Any]:
    # JSON integers are exact in Python (the file warns that hashes exceed 2**53).
    data: dict[str, Any] = json.loads(VECTORS.read_text())
    return data


def captured_payloads() -> list[bytes]:
    return [bytes.fromhex(m["payload_hex"]) for c in vectors()["captures"] for m in c["messages"]]


def assert_well_formed(batch: EventBatch) -> None:
    """What every decoded batch guarantees, whatever the payload was."""
    assert type(batch) is EventBatch
    assert type(batch.ts) is float
    assert batch.data_parallel_rank is None or type(batch.data_parallel_rank) is int
    assert batch.skipped >= 0 and batch.invalid >= 0
    assert (batch.invalid_reason is not None) == (batch.invalid > 0)
    if batch.invalid_reason is not None:
        assert "\n" not in batch.invalid_reason
    for e in batch.events:
        assert type(e) in (BlockStored, BlockRemoved, AllBlocksCleared)
        if isinstance(e, AllBlocksCleared):
            continue
        assert all(type(h) is int and 0 <= h < U64 for h in e.block_hashes)
        assert e.medium is None or (type(e.medium) is str and e.medium == e.medium.lower())
        assert e.group_idx is None or type(e.group_idx) is int
        if isinstance(e, BlockStored):
            assert e.parent_block_hash is None or (
                type(e.parent_block_hash) is int and 0 < e.parent_block_hash < U64
            )
            assert all(type(t) is int for t in e.token_ids)
            assert type(e.block_size) is int
            assert e.lora_id is None or type(e.lora_id) is int
            assert e.lora_name is None or type(e.lora_name) is str
            assert e.extra_keys is None or type(e.extra_keys) is list


def decode_or_error(payload: bytes) -> EventBatch | None:
    """The fuzz oracle. Drives the unguarded `_decode`, so a bug cannot hide behind decode_batch's
    last-resort conversion of unexpected exceptions."""
    try:
        batch = ev_mod._decode(payload)
    except EventDecodeError as exc:
        assert str(exc) and "\n" not in str(exc)
        return None
    assert_well_formed(batch)
    return batch


# ---------------------------------------------------------------------------------------------
# Conformance: real vLLM 0.32 frames


def wire_hash(value: int | str) -> int:
    """The documented rule: uint64 as is; 'bin:<hex>' digests -> last 8 bytes, big-endian."""
    if isinstance(value, str):
        assert value.startswith("bin:")
        return int.from_bytes(bytes.fromhex(value[4:])[-8:], "big")
    return value


def last_stored(batch: EventBatch) -> BlockStored:
    event = batch.events[-1]
    assert isinstance(event, BlockStored)
    return event


def expected_event(d: dict[str, Any]) -> Event:
    if d["type"] == "AllBlocksCleared":
        return AllBlocksCleared()
    hashes = [wire_hash(h) for h in d["block_hashes"]]
    medium = d["medium"].lower() if d.get("medium") is not None else None
    if d["type"] == "BlockRemoved":
        return BlockRemoved(hashes, medium, d.get("group_idx"))
    return BlockStored(
        hashes,
        None if d["parent_block_hash"] is None else wire_hash(d["parent_block_hash"]),
        d["token_ids"],
        d["block_size"],
        d["lora_id"],
        medium,
        d["lora_name"],
        d.get("extra_keys"),
        d.get("group_idx"),
    )


CAPTURES = [c["name"] for c in vectors()["captures"]]


def capture(name: str) -> dict[str, Any]:
    return next(c for c in vectors()["captures"] if c["name"] == name)


def decoded_capture(name: str) -> list[EventBatch]:
    return [decode_batch(bytes.fromhex(m["payload_hex"])) for m in capture(name)["messages"]]


@pytest.mark.parametrize("name", CAPTURES)
def test_every_captured_frame_decodes_to_what_the_file_says(name: str) -> None:
    for i, m in enumerate(capture(name)["messages"]):
        assert m["frames_count"] == 3
        assert int(m["seq_hex"], 16) == m["seq"] == i  # +1 per message from 0
        assert bytes.fromhex(m["topic_hex"]) == b"kv-events"
        payload = bytes.fromhex(m["payload_hex"])
        ts, evs, dp = m["decoded"]
        batch = decode_batch(payload)
        assert_well_formed(batch)
        assert batch == EventBatch(ts, [expected_event(e) for e in evs], dp)
        # The same frame as a memoryview (what zmq hands over with copy=False) and through the
        # tolerant tier alone: identical.
        assert decode_batch(memoryview(payload)) == batch
        assert ev_mod._decode_tolerant(payload) == batch
        # Real frames never need the tolerant tier: ints and 32-byte digests both have a fast path.
        assert ev_mod._decode_fast(payload) == batch


def test_captured_events_match_the_requests_that_produced_them() -> None:
    steps = {s["step"].split(":")[0]: s for s in vectors()["steps"]}
    bs = 32
    for name in CAPTURES:
        msgs = decoded_capture(name)
        # 9 steps, 7 messages: "P1 again" was a full prefix hit (no event at all), and the reset's
        # AllBlocksCleared was held back into the next step's batch.
        assert len(msgs) == 7
        kinds = [[type(e).__name__ for e in b.events] for b in msgs]
        assert kinds == [
            ["BlockStored"],
            ["BlockStored"],
            ["BlockStored"],
            ["BlockStored"],
            ["BlockStored"],
            ["BlockRemoved"] * 12 + ["BlockStored"],
            ["AllBlocksCleared", "BlockStored"],
        ]
        stored = [last_stored(b) for b in msgs]
        p1, p2, p3, e1, e2, e3, p1_again = stored
        for s in stored:
            assert s.block_size == bs and s.medium == "gpu" and s.group_idx == 0
            assert s.lora_id is None and s.lora_name is None
            assert len(s.token_ids) == len(s.block_hashes) * bs  # only full blocks
            assert s.extra_keys == [None] * len(s.block_hashes)  # text only
        # P1: 100 tokens -> 3 full blocks, a chain from the root.
        assert p1.token_ids == steps["P1"]["prompt_token_ids"][:96]
        assert p1.parent_block_hash is None and len(p1.block_hashes) == 3
        # P2 shares 2 blocks with P1: only its third block is new, chained to P1's second.
        assert p2.token_ids == steps["P2"]["prompt_token_ids"][64:96]
        assert p2.parent_block_hash == p1.block_hashes[1]
        # P3: 30 prompt tokens + 8 generated; the block is completed by the first 2 generated.
        p3_seq = steps["P3"]["prompt_token_ids"] + steps["P3"]["output_token_ids"]
        assert p3.token_ids == p3_seq[:32] and p3.parent_block_hash is None
        for e, step in ((e1, "E1"), (e2, "E2"), (e3, "E3")):
            assert e.token_ids == steps[step]["prompt_token_ids"][:480]
            assert len(e.block_hashes) == 15 and e.parent_block_hash is None
        # Eviction, tail first: P2's own block, P1's blocks last to first, P3's, E1's 14 down to 8.
        removed = [e for e in msgs[5].events if isinstance(e, BlockRemoved)]
        assert all(len(r.block_hashes) == 1 and r.medium == "gpu" and r.group_idx == 0 for r in removed)
        want = [p2.block_hashes[0], *p1.block_hashes[::-1], p3.block_hashes[0], *e1.block_hashes[14:7:-1]]
        assert [r.block_hashes[0] for r in removed] == want
        # After the reset, P1 is stored again with the same hashes.
        assert p1_again == p1


@pytest.mark.parametrize("name", CAPTURES)
def test_captured_hashes_follow_the_documented_normalisation(name: str) -> None:
    c = capture(name)
    expected = c["expected_hashes"]
    if isinstance(expected, str):  # capture C: "same full_hash_hex values as capture A"
        expected = capture("A_sha256_default")["expected_hashes"]
    p1, p2, p3 = (last_stored(b) for b in decoded_capture(name)[:3])
    for stored, key in ((p1, "P1_blocks"), (p3, "P3_prompt_plus_output_blocks")):
        for blk in expected[key]:
            full = bytes.fromhex(blk["full_hash_hex"])
            # event hash = low 64 bits of the digest, read big-endian
            assert blk["event_block_hash_u64"] == int.from_bytes(full[-8:], "big")
            assert stored.block_hashes[blk["block_index"]] == blk["event_block_hash_u64"]
    # P2's first two blocks are P1's (a shared prefix, same hashes), so only its third was stored.
    p2_blocks = [blk["event_block_hash_u64"] for blk in expected["P2_blocks"]]
    assert p2_blocks[:2] == p1.block_hashes[:2]
    assert p2.block_hashes == p2_blocks[2:]


def test_bytes_digest_capture_normalises_to_the_integer_capture() -> None:
    """C (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, 32-byte digests) vs A (same run, int hashes)."""
    a, c = decoded_capture("A_sha256_default"), decoded_capture("C_sha256_default_bytes_hashes")
    assert [b.events for b in a] == [b.events for b in c]
    raw = msgspec.msgpack.decode(
        bytes.fromhex(capture("C_sha256_default_bytes_hashes")["messages"][0]["payload_hex"])
    )
    assert all(type(h) is bytes and len(h) == 32 for h in raw[1][0]["block_hashes"])


# ---------------------------------------------------------------------------------------------
# Every vLLM version's encoding, built by hand

H1, H2, H3 = 0x7479BBCA020B7614, 0xB95D139F9A1123C8, 0x0123456789ABCDEF
TOKENS = list(range(2000, 2032))

# BlockStored fields after the tag, in declaration order, from 0.22 (the last array-form release).
ALL_ARRAY_FIELDS: list[Any] = [
    [H1, H2],
    H3,
    TOKENS,
    16,
    None,
    "GPU",
    None,
    [None, None],
    0,
    "full_attention",
    None,
]
# (version, number of BlockStored fields, BlockRemoved fields, batch has dp rank)
ARRAY_VERSIONS = [
    ("0.9.0", 5, 1, False),
    ("0.9.1", 5, 1, True),
    ("0.10.2", 6, 2, True),
    ("0.14", 7, 2, True),
    ("0.17", 8, 2, True),
    ("0.20", 9, 3, True),
    ("0.22", 11, 3, True),
]


def expected_stored(n_fields: int) -> BlockStored:
    f = ALL_ARRAY_FIELDS[:n_fields] + [None] * (11 - n_fields)
    return BlockStored(f[0], f[1], f[2], f[3], f[4], f[5] and f[5].lower(), f[6], f[7], f[8])


@pytest.mark.parametrize(("version", "n_stored", "n_removed", "dp"), ARRAY_VERSIONS)
def test_array_form_of_each_version(version: str, n_stored: int, n_removed: int, dp: bool) -> None:
    stored = ["BlockStored", *ALL_ARRAY_FIELDS[:n_stored]]
    removed = ["BlockRemoved", *[[H1], "GPU", 0][:n_removed]]
    batch_list: list[Any] = [TS, [stored, removed, ["AllBlocksCleared"]]]
    if dp:
        batch_list.append(1)
    payload = encode(batch_list)
    want_removed = BlockRemoved([H1], "gpu" if n_removed >= 2 else None, 0 if n_removed >= 3 else None)
    want = EventBatch(TS, [expected_stored(n_stored), want_removed, AllBlocksCleared()], 1 if dp else None)
    assert decode_batch(payload) == want
    assert ev_mod._decode_fast(payload) == want


def test_vllm_0_9_0_builtin_hashes_are_negative_int64() -> None:
    """0.9.0 with `builtin` hashing: Python hash() values, so negative int64 on the wire."""
    stored = ["BlockStored", [-1, -(2**63), 5], -2, TOKENS[:16] * 3, 16, None]
    removed = ["BlockRemoved", [-(2**63) + 1]]
    batch = decode_batch(encode([TS, [stored, removed]]))  # 2-element batch: no dp rank
    assert batch == EventBatch(
        TS,
        [
            BlockStored([U64 - 1, 2**63, 5], U64 - 2, TOKENS[:16] * 3, 16, None),
            BlockRemoved([2**63 + 1]),
        ],
        None,
    )


def map_stored(**overrides: Any) -> dict[str, Any]:
    """vLLM 0.24+ map form as msgspec writes it: fields without a default always present, fields
    equal to their default (None) left out."""
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": [H1, H2],
        "parent_block_hash": None,
        "token_ids": TOKENS,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None, None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    event.update(overrides)
    return event


MAP_VERSIONS: dict[str, dict[str, Any]] = {
    "0.24": {},
    "0.26": {"locality": "local"},
    "0.29": {"locality": "remote", "ownership": "owned"},
    "0.30": {"ownership": "borrowed", "session_id": "s-1"},
    "0.33": {"session_id": "s-2", "lookahead_token_ids": [[1, 2], [3]]},
    "future": {"kv_cache_spec_sliding_window": 4096, "some_new_field": {"a": [1, b"x"]}},
}


@pytest.mark.parametrize("version", list(MAP_VERSIONS))
def test_map_form_of_each_version(version: str) -> None:
    extra = MAP_VERSIONS[version]
    removed = {"type": "BlockRemoved", "block_hashes": [H1], "medium": "GPU", "group_idx": 0, **extra}
    payload = encode([TS, [map_stored(**extra), removed, {"type": "AllBlocksCleared", **extra}], 0])
    want = EventBatch(
        TS,
        [
            BlockStored([H1, H2], None, TOKENS, 16, None, "gpu", None, [None, None], 0),
            BlockRemoved([H1], "gpu", 0),
            AllBlocksCleared(),
        ],
        0,
    )
    assert decode_batch(payload) == want
    assert ev_mod._decode_fast(payload) == want


def test_map_form_missing_optional_keys_are_none_and_key_order_is_free() -> None:
    minimal = {"block_size": 16, "token_ids": TOKENS[:16], "block_hashes": [H1], "type": "BlockStored"}
    removed = {"block_hashes": [H2], "type": "BlockRemoved"}
    batch = decode_batch(encode([TS, [minimal, removed], 3]))
    assert batch == EventBatch(TS, [BlockStored([H1], None, TOKENS[:16], 16), BlockRemoved([H2])], 3)


@pytest.mark.parametrize("size", [32, 16, 64, 96, 8, 12, 5, 1, 0])
def test_bytes_digests_are_read_as_their_last_8_bytes(size: int) -> None:
    """32 (sha256*), 16 (xxhash*), 64/96 (hybrid groups, 0.13-0.23), and odd sizes: shorter than
    8 bytes is read whole. Also enough hashes (9) for the vectorised path."""
    digests = [bytes((i * 37 + j) % 256 for j in range(size)) for i in range(9)]
    want = [int.from_bytes(d[-8:], "big") for d in digests]
    parent = bytes(range(100, 100 + size))
    want_parent = int.from_bytes(parent[-8:], "big") or None
    for event in (
        ["BlockStored", digests, parent, TOKENS[:9], 1, None, "CPU"],
        map_stored(block_hashes=digests, parent_block_hash=parent, token_ids=TOKENS[:9], block_size=1),
    ):
        batch = decode_batch(encode([TS, [event, ["BlockRemoved", digests[:1]]], 0]))
        stored, removed = batch.events
        assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
        assert stored.block_hashes == want and stored.parent_block_hash == want_parent
        assert removed.block_hashes == want[:1]
    if size >= 8:  # the vectorised path agrees with the per-hash one
        assert ev_mod._digests(digests) == want == [int.from_bytes(struct.pack(">Q", w), "big") for w in want]


def test_mixed_hash_types_and_mixed_event_forms_in_one_batch() -> None:
    d32 = bytes(range(32))
    events: list[Any] = [
        ["BlockStored", [H1, d32, -1], None, TOKENS[:3], 1, None, "Gpu"],
        map_stored(block_hashes=[d32], parent_block_hash=-5, token_ids=[7], block_size=1),
        {"type": "BlockRemoved", "block_hashes": [H2, d32]},
        ["BlockRemoved", [-3], "cpu", 1],
    ]
    batch = decode_batch(encode([TS, events, 0]))
    low = int.from_bytes(d32[-8:], "big")
    assert batch.events == [
        BlockStored([H1, low, U64 - 1], None, TOKENS[:3], 1, None, "gpu"),
        BlockStored([low], U64 - 5, [7], 1, None, "gpu", None, [None, None], 0),
        BlockRemoved([H2, low]),
        BlockRemoved([U64 - 3], "cpu", 1),
    ]
    assert batch.skipped == batch.invalid == 0


def test_parent_zero_means_no_parent() -> None:
    """The llm-d simulator's array form writes 0 for a missing parent."""
    for parent in (0, bytes(32)):
        batch = decode_batch(encode([TS, [["BlockStored", [H1], parent, TOKENS[:16], 16]], 0]))
        assert batch.events == [BlockStored([H1], None, TOKENS[:16], 16)]


def test_placeholder_and_partial_blocks_pass_through() -> None:
    """Offload connectors store a known hash with token_ids=[] and block_size=0; 0.24+ hybrid models
    send partial blocks. Not the decoder's business to judge either."""
    events = [
        map_stored(block_hashes=[H1], token_ids=[], block_size=0, medium="STORAGE"),
        map_stored(block_hashes=[H2], token_ids=[1, 2, 3], block_size=3, group_idx=1),
    ]
    stored = decode_batch(encode([TS, events, 0])).events
    assert stored == [
        BlockStored([H1], None, [], 0, None, "storage", None, [None, None], 0),
        BlockStored([H2], None, [1, 2, 3], 3, None, "gpu", None, [None, None], 1),
    ]


def test_medium_is_lower_cased_and_uncommon_media_are_not_cached_forever() -> None:
    for medium in ("GPU", "CPU", "FS", "OBJ", "STORAGE", "gpu", "Weird-Tier"):
        batch = decode_batch(encode([TS, [["BlockRemoved", [H1], medium]], 0]))
        assert batch.events == [BlockRemoved([H1], medium.lower())]
    for i in range(200):  # garbage media: still lower-cased, the cache stays bounded
        batch = decode_batch(encode([TS, [["BlockRemoved", [H1], f"X{i}"]], 0]))
        assert batch.events == [BlockRemoved([H1], f"x{i}")]
    assert len(ev_mod._MEDIA) <= 64


def test_batch_variants() -> None:
    stored = ["BlockStored", [H1], None, TOKENS[:16], 16]
    want_event = BlockStored([H1], None, TOKENS[:16], 16)
    # trailing batch elements, an explicit nil rank, an int timestamp, no events at all
    assert decode_batch(encode([TS, [stored], 2, "future", [1]])) == EventBatch(TS, [want_event], 2)
    assert decode_batch(encode([TS, [stored], None])) == EventBatch(TS, [want_event], None)
    assert decode_batch(encode([1767225600, [], 0])) == EventBatch(1767225600.0, [], 0)
    # a map-encoded batch (a vLLM development snapshot), unknown keys ignored, rank optional
    as_map = {"events": [stored], "ts": TS, "data_parallel_rank": 4, "new": True}
    assert decode_batch(encode(as_map)) == EventBatch(TS, [want_event], 4)
    assert decode_batch(encode({"ts": TS, "events": []})) == EventBatch(TS, [], None)
    # buffers other than bytes
    assert decode_batch(bytearray(encode([TS, [stored], 0]))) == EventBatch(TS, [want_event], 0)


def test_extra_trailing_event_fields_are_ignored_even_when_odd() -> None:
    stored = ["BlockStored", *ALL_ARRAY_FIELDS, "locality?", {"x": 1}, [b"\x00"], 3.5]
    removed = ["BlockRemoved", [H1], "GPU", 0, "later", None]
    batch = decode_batch(encode([TS, [stored, removed, ["AllBlocksCleared", 1, 2]], 0]))
    assert batch.events == [expected_stored(11), BlockRemoved([H1], "gpu", 0), AllBlocksCleared()]
    assert ev_mod._decode_fast(encode([TS, [stored, removed], 0])) is not None


def test_unknown_event_types_are_skipped_and_counted() -> None:
    good = ["BlockRemoved", [H1]]
    events: list[Any] = [
        ["BlockEvicted", [H1]],
        good,
        {"type": "KVConnectorStats", "x": 1},
        ["blockstored", [H1], None, [], 0],  # tags are case-sensitive class names
    ]
    batch = decode_batch(encode([TS, events, 0]))
    assert batch == EventBatch(TS, [BlockRemoved([H1])], 0, skipped=3, invalid=0)


INVALID_EVENTS: list[tuple[Any, str]] = [
    (["BlockStored", [1.5], None, [1], 1], "float hash"),
    (["BlockStored", ["abc"], None, [1], 1], "str hash"),
    (["BlockStored", [H1], "parent", [1], 1], "str parent"),
    (["BlockStored", [H1], None, [1]], "array too short"),
    (["BlockStored", [H1], None, [1], True], "bool block_size"),
    (["BlockStored", [H1], None, [1.0], 1], "float token"),
    (["BlockStored", [H1], None, [1], 1, "lora"], "str lora_id"),
    (["BlockStored", [H1], None, [1], 1, None, 7], "int medium"),
    (["BlockStored", [H1], None, [1], 1, None, "GPU", None, "keys"], "str extra_keys"),
    (["BlockStored", H1, None, [1], 1], "hashes not a list"),
    (["BlockRemoved"], "no hashes"),
    (["BlockRemoved", [H1], "GPU", "0"], "str group_idx"),
    ({"type": "BlockStored", "block_hashes": [H1], "token_ids": [1]}, "map without block_size"),
    ({"type": "BlockRemoved", "block_hashes": [None]}, "nil hash"),
    ({"type": "BlockRemoved", "block_hashes": [H1], "medium": ["GPU"]}, "list medium"),
    ({"type": "BlockRemoved", 5: "x", "block_hashes": [H1]}, "non-str map key"),
    ({"block_hashes": [H1]}, "map without type"),
    ({"type": 3}, "int type"),
    ([], "empty array"),
    ([7, [H1]], "int tag"),
    (7, "not an array or a map"),
    ("BlockStored", "a bare string"),
    (None, "nil"),
]


@pytest.mark.parametrize(("bad", "why"), INVALID_EVENTS, ids=[w for _, w in INVALID_EVENTS])
def test_invalid_events_are_dropped_alone_with_a_reason(bad: Any, why: str) -> None:
    good_before, good_after = ["BlockRemoved", [H1]], map_stored()
    batch = decode_batch(encode([TS, [good_before, bad, good_after], 0]))
    assert batch.events == [
        BlockRemoved([H1]),
        BlockStored([H1, H2], None, TOKENS, 16, None, "gpu", None, [None, None], 0),
    ]
    assert (batch.skipped, batch.invalid) == (0, 1), why
    assert batch.invalid_reason is not None and batch.invalid_reason.startswith("event 1: ")
    assert "\n" not in batch.invalid_reason


NOT_A_BATCH: list[tuple[bytes, str]] = [
    (b"", "empty"),
    (b"\xc1", "invalid msgpack opcode"),
    (b"garbage!", "text"),
    (encode(7), "an int"),
    (encode("batch"), "a string"),
    (encode([]), "empty array"),
    (encode([TS]), "no events"),
    (encode(["ts", []]), "str ts"),
    (encode([True, []]), "bool ts"),
    (encode([None, []]), "nil ts"),
    (encode([TS, {"a": 1}]), "events not a list"),
    (encode([TS, None]), "nil events"),
    (encode([TS, [], "0"]), "str dp rank"),
    (encode({"ts": TS}), "map without events"),
    (encode({"events": []}), "map without ts"),
    (encode([TS, [["BlockRemoved", [H1]]], 0])[:-3], "truncated"),
    (encode([TS, [], 0]) + b"\x00", "trailing bytes"),
    (b"\x93\xcb" + struct.pack(">d", TS) + b"\xdd\xff\xff\xff\xff", "huge declared length"),
    (b"\x93\xcb" + struct.pack(">d", TS) + b"\x91" * 5000 + b"\xc0", "nesting beyond the recursion limit"),
]


@pytest.mark.parametrize(("payload", "why"), NOT_A_BATCH, ids=[w for _, w in NOT_A_BATCH])
def test_payloads_that_are_not_a_batch_raise_a_one_line_error(payload: bytes, why: str) -> None:
    with pytest.raises(EventDecodeError) as info:
        decode_batch(payload)
    message = str(info.value)
    assert message and "\n" not in message, why
    assert decode_or_error(payload) is None


def test_the_error_is_a_value_error_and_names_the_problem() -> None:
    with pytest.raises(ValueError, match=r"not a KV-event batch: .*array"):
        decode_batch(encode(7))
    with pytest.raises(EventDecodeError, match="truncated"):
        decode_batch(encode([TS, [], 0])[:-1])
    with pytest.raises(EventDecodeError, match=r"not a KV-event batch: .*events"):
        decode_batch(encode({"ts": TS}))  # a map batch: the map's own problem is reported


def test_anything_unexpected_is_still_an_event_decode_error() -> None:
    with pytest.raises(EventDecodeError, match="TypeError"):
        decode_batch("not bytes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# The byte-level example of shared/reference/kv-events.md, section 8


def fixstr(s: str) -> bytes:
    assert len(s) < 32
    return bytes([0xA0 + len(s)]) + s.encode()


def test_reference_byte_level_example_map_form() -> None:
    tokens = b"".join(b"\xcd" + t.to_bytes(2, "big") for t in range(2000, 2016))
    payload = b"".join(
        [
            b"\x93\xcb\x41\xda\x55\x6e\x40\x20\x00\x00\x91\x8b",
            fixstr("type") + fixstr("BlockStored"),
            fixstr("block_hashes") + bytes.fromhex("91cf7479bbca020b7614"),
            fixstr("parent_block_hash") + bytes.fromhex("cfb95d139f9a1123c8"),
            fixstr("token_ids") + b"\xdc\x00\x10" + tokens,
            fixstr("block_size") + b"\x10",
            fixstr("lora_id") + b"\xc0",
            fixstr("medium") + fixstr("GPU"),
            fixstr("lora_name") + b"\xc0",
            fixstr("extra_keys") + b"\x91\xc0",
            fixstr("group_idx") + b"\x00",
            fixstr("kv_cache_spec_kind") + fixstr("full_attention"),
            b"\x00",
        ]
    )
    assert len(payload) == 242
    want = EventBatch(
        1767225600.5,
        [
            BlockStored(
                [8392945856873723412],
                13356853646056301512,
                list(range(2000, 2016)),
                16,
                None,
                "gpu",
                None,
                [None],
                0,
            )
        ],
        0,
    )
    assert decode_batch(payload) == want
    # msgspec writes exactly these bytes for the equivalent map (the reference's claim).
    event = map_stored(
        block_hashes=[8392945856873723412],
        parent_block_hash=13356853646056301512,
        token_ids=list(range(2000, 2016)),
        extra_keys=[None],
    )
    assert encode([1767225600.5, [event], 0]) == payload

    # The same event, array form of 0.22-0.23: 121 bytes, fixarray of 12.
    array_payload = b"".join(
        [
            b"\x93\xcb\x41\xda\x55\x6e\x40\x20\x00\x00\x91\x9c",
            fixstr("BlockStored"),
            bytes.fromhex("91cf7479bbca020b7614cfb95d139f9a1123c8dc0010"),
            tokens,
            b"\x10\xc0" + fixstr("GPU") + b"\xc0\x91\xc0\x00" + fixstr("full_attention") + b"\xc0\x00",
        ]
    )
    assert len(array_payload) == 121
    assert decode_batch(array_payload) == want

    # The bytes variant: c4 20 <32 bytes>, whose last 8 bytes are the uint64 above.
    digest = bytes.fromhex("aaf99057") + bytes(20) + (8392945856873723412).to_bytes(8, "big")
    bytes_payload = payload.replace(bytes.fromhex("91cf7479bbca020b7614"), b"\x91\xc4\x20" + digest)
    assert decode_batch(bytes_payload) == want


# ---------------------------------------------------------------------------------------------
# Fuzzing

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=U64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=40)
)
# Anything msgpack can carry (map keys: str or int, as other encoders may write).
msgpack_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(st.text(max_size=10) | st.integers(min_value=-5, max_value=5), inner, max_size=6)
    ),
    max_leaves=25,
)
hashes = st.integers(min_value=-(2**63), max_value=U64 - 1) | st.binary(max_size=70)
tags = st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Unknown"])


@st.composite
def plausible_events(draw: st.DrawFn) -> Any:
    """Events near the valid boundary: right or wrong tags, fields of the right type or not,
    arrays cut or extended, map keys dropped or added."""
    n = draw(st.integers(min_value=0, max_value=4))
    fields: dict[str, Any] = {
        "block_hashes": draw(st.lists(hashes, max_size=n + 1)),
        "parent_block_hash": draw(st.none() | hashes),
        "token_ids": draw(st.lists(st.integers(min_value=0, max_value=200_000), max_size=n * 2)),
        "block_size": draw(st.integers(min_value=0, max_value=64)),
        "lora_id": draw(st.none() | st.integers(min_value=0, max_value=9)),
        "medium": draw(st.sampled_from([None, "GPU", "CPU", "Storage"])),
        "lora_name": draw(st.none() | st.text(max_size=5)),
        "extra_keys": draw(
            st.none() | st.lists(st.none() | st.lists(st.integers(0, 99), max_size=2), max_size=n)
        ),
        "group_idx": draw(st.none() | st.integers(min_value=0, max_value=3)),
    }
    tag = draw(tags)
    if tag == "BlockRemoved":
        fields = {k: fields[k] for k in ("block_hashes", "medium", "group_idx")}
    elif tag == "AllBlocksCleared":
        fields = {}
    for key in draw(st.lists(st.sampled_from(sorted(fields) or ["x"]), max_size=2)):
        if draw(st.booleans()):  # make one field wrong
            fields[key] = draw(msgpack_values)
    if draw(st.booleans()):
        event: Any = [tag, *fields.values()]
        cut = draw(st.integers(min_value=0, max_value=len(event) + 2))
        return event[:cut] + draw(st.lists(msgpack_values, max_size=2)) if cut > len(event) else event[:cut]
    event = {"type": tag, **fields}
    for key in draw(st.lists(st.sampled_from([*sorted(fields), "type", "extra"]), max_size=2)):
        if draw(st.booleans()):
            event.pop(key, None)
        else:
            event[key] = draw(msgpack_values)
    return event


any_event = plausible_events() | msgpack_values
real_events = st.sampled_from(
    [e for p in captured_payloads() for e in msgspec.msgpack.decode(p)[1]]
    + [["BlockStored", *ALL_ARRAY_FIELDS[:n]] for _, n, _, _ in ARRAY_VERSIONS]
    + [["BlockRemoved", [H1], "GPU", 0][:n] for n in (2, 3, 4)]
    + [map_stored(**extra) for extra in MAP_VERSIONS.values()]
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(payload: bytes) -> None:
    decode_or_error(payload)


@FUZZ
@given(msgpack_values)
def test_fuzz_random_msgpack_values(value: Any) -> None:
    decode_or_error(encode(value))
    decode_or_error(encode([TS, value, 0]))
    decode_or_error(encode([TS, [value], 0]))


@FUZZ
@given(st.sampled_from(captured_payloads()), st.data())
def test_fuzz_mutated_real_frames(payload: bytes, data: st.DataObject) -> None:
    mutated = bytearray(payload)
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        if not mutated:
            break
        op = data.draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        i = data.draw(st.integers(min_value=0, max_value=len(mutated) - 1))
        if op == "flip":
            mutated[i] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
        elif op == "set":
            mutated[i] = data.draw(st.integers(min_value=0, max_value=255))
        elif op == "insert":
            mutated[i:i] = data.draw(st.binary(min_size=1, max_size=9))
        elif op == "delete":
            del mutated[i : i + data.draw(st.integers(min_value=1, max_value=9))]
        else:
            del mutated[i:]
    decode_or_error(bytes(mutated))


def same(a: object, b: object) -> bool:
    """Equality where NaN (a fuzzed float inside extra_keys) equals itself."""
    return encode(a) == encode(b)


def decode_alone(event: Any) -> EventBatch:
    batch = decode_or_error(encode([TS, [event], 0]))
    assert batch is not None  # the batch is fine; only the event may be dropped
    assert len(batch.events) + batch.skipped + batch.invalid == 1
    return batch


@FUZZ
@given(st.lists(real_events | any_event, max_size=8))
def test_fuzz_events_are_decoded_independently(evs: list[Any]) -> None:
    """A batch decodes to the concatenation of its events decoded alone, whichever tier takes it:
    a bad event never takes a good one with it, and good events never change with company."""
    batch = decode_or_error(encode([TS, evs, 0]))
    assert batch is not None
    alone = [decode_alone(e) for e in evs]
    assert same(batch.events, [e for b in alone for e in b.events])
    assert batch.skipped == sum(b.skipped for b in alone)
    assert batch.invalid == sum(b.invalid for b in alone)


@FUZZ
@given(st.lists(real_events, max_size=6), st.integers(min_value=0, max_value=6), any_event)
def test_fuzz_one_bad_event_among_real_ones(good: list[Any], at: int, bad: Any) -> None:
    want = decode_or_error(encode([TS, good, 0]))
    assert want is not None and want.skipped == want.invalid == 0
    at = min(at, len(good))
    batch = decode_or_error(encode([TS, [*good[:at], bad, *good[at:]], 0]))
    assert batch is not None
    if batch.skipped + batch.invalid == 1:
        assert same(batch.events, want.events)
    else:  # the "bad" one happened to be valid
        assert same(batch.events[:at] + batch.events[at + 1 :], want.events)


@FUZZ
@given(st.lists(plausible_events(), max_size=6))
def test_fuzz_fast_and_tolerant_tiers_agree(evs: list[Any]) -> None:
    payload = encode([TS, evs, 0])
    fast = ev_mod._decode_fast(payload)
    tolerant = ev_mod._decode_tolerant(payload)
    assert_well_formed(tolerant)
    if fast is not None:
        assert same(fast, tolerant)
