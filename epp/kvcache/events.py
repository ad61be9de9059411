"""vLLM KV-cache events, normalised across every wire encoding from vLLM 0.9 to 0.33.

`decode_batch(payload)` turns the msgpack payload of one ZMQ message (its third frame) into an
`EventBatch` of `BlockStored` / `BlockRemoved` / `AllBlocksCleared`, whatever vLLM version sent it.

Normalisation: block hashes are engine keys, `int` in [0, 2**64): msgpack uints as they are,
negative int64 (vLLM 0.9 `builtin`) as their two's-complement uint64, bytes digests as their last
8 bytes read big-endian (what vLLM itself sends when int hashes are on; shorter digests are read
whole). A hash of any other type (float, str, ...) makes its event invalid. A `parent_block_hash`
of 0 means "no parent" (the llm-d simulator's array form writes 0 for None), so it becomes None.
`medium` is lower-cased ("gpu", "cpu", ...), None when absent.

Encodings accepted (see docs in shared/reference/kv-events.md, sections 1.4-1.7):

- Batch: the array `[ts, events]` (0.9.0) or `[ts, events, data_parallel_rank]` (0.9.1+), extra
  trailing elements ignored; also the map `{ts, events, data_parallel_rank}`, unknown keys ignored.
- Events: tagged arrays (up to 0.23: `["BlockStored", hashes, parent, token_ids, block_size,
  lora_id, medium, lora_name, extra_keys, group_idx, ...]`, everything after block_size optional,
  extra trailing fields ignored) and tagged maps (0.24+: `{"type": "BlockStored", ...}`, unknown
  keys ignored, missing optional keys -> None). A batch may even mix the two.

Errors are per event where possible. An event with an unknown tag (a newer vLLM) is dropped and
counted in `EventBatch.skipped`; a malformed event (a known tag with a wrong shape or field type)
is dropped and counted in `EventBatch.invalid`, the first one's reason in `invalid_reason`. The rest
of the batch is kept. Only a payload that is not a batch at all (garbage, truncated msgpack, wrong
top-level shape, a `ts` that is not a number) raises `EventDecodeError`; nothing else is raised.

Not judged here: whether `len(token_ids) == len(block_hashes) * block_size` (offload connectors
send placeholders with no tokens and block_size 0; 0.24+ hybrid models send partial blocks), nor
extra_keys' contents. Those are the index's business.

Design, for speed (the ingestion target is >= 500k blocks/s in one process): the work is per block
(a hash and 16-32 token ids each), so on the common paths every per-block step runs in msgspec's C
code, never in a Python loop. Three tiers, each tried only when the one before fails:

1. Fast: one typed decode of the whole batch into private wire structs: tagged `array_like` structs
   for the array form, `tag_field="type"` structs for the map form. msgspec cannot put both forms in
   one union, and hashes are typed either `int >= 0` (the C decoder itself proves they need no
   normalisation) or `bytes` (digests, turned into ints by one vectorised pass per event), so there
   are four decoders, tried in order of likelihood: maps with ints (vLLM 0.24+ defaults) first. A
   wrong guess fails at the first value that does not fit, well under a microsecond for real
   payloads. The Python left is per event: copy into the public struct, lower-case the medium.
2. Tolerant: the batch is decoded with its events left as `msgspec.Raw`, then each event on its own
   with hashes typed `int | bytes`, normalised one by one (negative int64, mixed types). Mixed
   array/map batches land here too. An event that fails is dropped alone.
3. Classification of a failed event: only its tag is decoded, to count it as skipped (unknown tag)
   or invalid (known tag, bad shape).

One typed schema instead of hand-written checks keeps the tiers consistent by construction (tier 2
accepts what tier 1 does, plus odd hashes and mixed forms; the fuzz tests check they agree). The
public types stay plain structs, not tied to any wire layout; copying into them costs ~0.1 us per
event. Measured by tests/kvcache/bench_events.py (one core of the dev VM): with int hashes 1.5-2.5 M
blocks/s, within ~5% of msgspec's untyped decode of the same bytes, whose cost is creating one
Python int per token id; 32-byte digests ~25% slower (a bytes object per hash first); tier 2
(vLLM 0.9.0's negative hashes, or a batch with an unknown event type) 0.8-1.4 M blocks/s.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable
from typing import Annotated, Any, Final, Generic, TypeVar

import msgspec


class BlockStored(msgspec.Struct, gc=False):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class BlockRemoved(msgspec.Struct, gc=False):
    block_hashes: list[int]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, gc=False):
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, gc=False):
    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None
    # Events dropped from this batch. `skipped`: unknown tag (an event type newer than this code:
    # expected, harmless). `invalid`: a known tag with a wrong shape or field type (a producer bug
    # worth logging); `invalid_reason` is the first such event's reason, one line.
    skipped: int = 0
    invalid: int = 0
    invalid_reason: str | None = None


class EventDecodeError(ValueError):
    """A payload that is not a KV-event batch in any known encoding."""


# ---------------------------------------------------------------------------------------------
# Wire schemas (private). Generic in the hash type: `_U64` for tier 1, `int | bytes` for tier 2.

_H = TypeVar("_H")
_E = TypeVar("_E")

# A constraint checked in C: a tier-1 success then needs no per-hash normalisation in Python.
_U64 = Annotated[int, msgspec.Meta(ge=0)]
_M64: Final = (1 << 64) - 1


class _ArrayStored(msgspec.Struct, Generic[_H], array_like=True, tag="BlockStored", gc=False):
    # Positional, vLLM <= 0.23. Fields after block_size have defaults so shorter arrays (0.9: 6
    # elements, other producers) decode; trailing fields beyond group_idx (0.22's
    # kv_cache_spec_kind, ...) are ignored by msgspec without being type-checked.
    block_hashes: list[_H]
    parent_block_hash: _H | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class _ArrayRemoved(msgspec.Struct, Generic[_H], array_like=True, tag="BlockRemoved", gc=False):
    block_hashes: list[_H]
    medium: str | None = None
    group_idx: int | None = None


class _ArrayCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared", gc=False):
    pass


class _MapStored(msgspec.Struct, Generic[_H], tag_field="type", tag="BlockStored", gc=False):
    # vLLM 0.24+. vLLM always writes parent_block_hash (no default there), but Go encoders with
    # `omitempty` drop a nil one, so a missing key means None here.
    block_hashes: list[_H]
    token_ids: list[int]
    block_size: int
    parent_block_hash: _H | None = None
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class _MapRemoved(msgspec.Struct, Generic[_H], tag_field="type", tag="BlockRemoved", gc=False):
    block_hashes: list[_H]
    medium: str | None = None
    group_idx: int | None = None


class _MapCleared(msgspec.Struct, tag_field="type", tag="AllBlocksCleared", gc=False):
    pass


class _Batch(msgspec.Struct, Generic[_E], array_like=True, gc=False):
    ts: float
    events: list[_E]
    data_parallel_rank: int | None = None


class _MapBatch(msgspec.Struct, Generic[_E], gc=False):
    ts: float
    events: list[_E]
    data_parallel_rank: int | None = None


class _ArrayTag(msgspec.Struct, array_like=True):
    tag: str


class _MapTag(msgspec.Struct):
    tag: str = msgspec.field(name="type")


# What a ZMQ frame's payload may arrive as (memoryview: a zmq.Frame's buffer, received with copy=False).
Payload = bytes | bytearray | memoryview

_KNOWN_TAGS: Final = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})

_Decoder = msgspec.msgpack.Decoder
# Built once: a Decoder compiles its type into a C-level plan at construction.
_FAST_MAP: Final = _Decoder(_Batch[_MapStored[_U64] | _MapRemoved[_U64] | _MapCleared])
_FAST_ARRAY: Final = _Decoder(_Batch[_ArrayStored[_U64] | _ArrayRemoved[_U64] | _ArrayCleared])
_FAST_MAP_DIGESTS: Final = _Decoder(_Batch[_MapStored[bytes] | _MapRemoved[bytes] | _MapCleared])
_FAST_ARRAY_DIGESTS: Final = _Decoder(_Batch[_ArrayStored[bytes] | _ArrayRemoved[bytes] | _ArrayCleared])
_RAW_ARRAY_BATCH: Final = _Decoder(_Batch[msgspec.Raw])
_RAW_MAP_BATCH: Final = _Decoder(_MapBatch[msgspec.Raw])
_EVENT_MAP: Final = _Decoder(_MapStored[int | bytes] | _MapRemoved[int | bytes] | _MapCleared)
_EVENT_ARRAY: Final = _Decoder(_ArrayStored[int | bytes] | _ArrayRemoved[int | bytes] | _ArrayCleared)
_TAG_MAP: Final = _Decoder(_MapTag)
_TAG_ARRAY: Final = _Decoder(_ArrayTag)

# What msgspec raises on bad input: DecodeError and ValidationError, but also UnicodeDecodeError for
# a str that is not UTF-8 (found by fuzzing) and RecursionError for nesting deeper than the
# interpreter's limit. The first three are ValueErrors. Only decoder calls sit inside these `try`s.
_DECODE_ERRORS: Final = (ValueError, RecursionError)

_WireEvent = (
    _ArrayStored[Any] | _ArrayRemoved[Any] | _ArrayCleared | _MapStored[Any] | _MapRemoved[Any] | _MapCleared
)
_Normaliser = Callable[[list[Any]], list[int]]


class _LowerCase(dict[str | None, str | None]):
    """medium -> lower-cased medium, with one C-level lookup per event on a hit (events are many in
    an eviction burst: one BlockRemoved per block). Caching also shares one str per medium instead
    of one per event, which the index may hold per block. Bounded, so garbage media cannot grow it.
    """

    def __missing__(self, medium: str | None) -> str | None:
        low = None if medium is None else medium.lower()
        if len(self) < 64:
            self[medium] = low
        return low


_MEDIA: Final = _LowerCase({None: None, "GPU": "gpu", "CPU": "cpu"})

# bytes digests -> uint64 in C for a whole event: join them, view as native uint64 words, take each
# digest's last word, swap to big-endian. 5x faster than int.from_bytes per hash at 128 hashes.
_WORDS_ARE_U64: Final = array("Q").itemsize == 8
_LITTLE_ENDIAN: Final = sys.byteorder == "little"


def _digests(hashes: list[bytes]) -> list[int]:
    """Last 8 bytes, big-endian, of each digest (shorter digests: all of it)."""
    size = len(hashes[0]) if hashes else 0
    # Below ~8 hashes (BlockRemoved carries one) the set-up costs more than the loop (measured).
    if len(hashes) >= 8 and size and size % 8 == 0 and _WORDS_ARE_U64 and len(set(map(len, hashes))) == 1:
        step = size // 8
        low = array("Q", b"".join(hashes))[step - 1 :: step]
        if _LITTLE_ENDIAN:
            low.byteswap()
        return low.tolist()
    return [int.from_bytes(h[-8:], "big") for h in hashes]


def _mixed(hashes: list[int | bytes]) -> list[int]:
    """Tier 2: any mix of uints, negative int64 (two's complement) and digests."""
    return [h & _M64 if isinstance(h, int) else int.from_bytes(h[-8:], "big") for h in hashes]


def _hash(h: int | bytes) -> int:
    return h & _M64 if isinstance(h, int) else int.from_bytes(h[-8:], "big")


def _public(wire: list[_WireEvent], normalise: _Normaliser | None) -> list[Event]:
    """The public events for wire events. `normalise`: None when hashes are known to be uint64."""
    out: list[Event] = []
    append = out.append
    media = _MEDIA
    for ev in wire:
        # Removed first: it is the most numerous event (one per evicted block).
        if isinstance(ev, (_MapRemoved, _ArrayRemoved)):
            hashes = ev.block_hashes if normalise is None else normalise(ev.block_hashes)
            append(BlockRemoved(hashes, media[ev.medium], ev.group_idx))
        elif isinstance(ev, (_MapStored, _ArrayStored)):
            hashes = ev.block_hashes
            parent = ev.parent_block_hash
            if normalise is not None:
                hashes = normalise(hashes)
                if parent is not None:
                    parent = _hash(parent)
            append(
                BlockStored(
                    hashes,
                    parent or None,  # 0 = no parent (llm-d simulator)
                    ev.token_ids,
                    ev.block_size,
                    ev.lora_id,
                    media[ev.medium],
                    ev.lora_name,
                    ev.extra_keys,
                    ev.group_idx,
                )
            )
        else:
            append(AllBlocksCleared())
    return out


# Tier 1, in order of likelihood: current vLLM (maps, int hashes) first. A wrong guess fails at the
# first event or hash that does not fit, well under a microsecond for real payloads (the first
# event already tells the form and the hash type); only a late misfit, e.g. an unknown event type
# at the end of a batch, wastes a whole decode before tier 2.
_FAST: Final[tuple[tuple[msgspec.msgpack.Decoder[Any], _Normaliser | None], ...]] = (
    (_FAST_MAP, None),
    (_FAST_ARRAY, None),
    (_FAST_MAP_DIGESTS, _digests),
    (_FAST_ARRAY_DIGESTS, _digests),
)


def _is_map_marker(first_byte: int) -> bool:
    """Whether a msgpack value starting with this byte is a map (fixmap, map16, map32)."""
    return 0x80 <= first_byte <= 0x8F or first_byte in (0xDE, 0xDF)


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _decode_fast(payload: Payload) -> EventBatch | None:
    """Tier 1: the whole batch in one typed decode; None if the payload needs the tolerant path."""
    for decoder, normalise in _FAST:
        try:
            batch = decoder.decode(payload)
        except _DECODE_ERRORS:
            continue
        return EventBatch(batch.ts, _public(batch.events, normalise), batch.data_parallel_rank)
    return None


def _decode_event(raw: msgspec.Raw) -> tuple[Event | None, str | None]:
    """Tiers 2 and 3 for one event: (event, None), (None, None) for an unknown tag, or
    (None, reason) for an invalid event."""
    view = memoryview(raw)
    is_map = len(view) > 0 and _is_map_marker(view[0])
    try:
        wire = (_EVENT_MAP if is_map else _EVENT_ARRAY).decode(raw)
    except _DECODE_ERRORS as exc:
        reason = _reason(exc)
    else:
        return _public([wire], _mixed)[0], None
    try:
        tag = (_TAG_MAP if is_map else _TAG_ARRAY).decode(raw).tag
    except _DECODE_ERRORS:
        return None, reason
    return None, (reason if tag in _KNOWN_TAGS else None)


def _decode_tolerant(payload: Payload) -> EventBatch:
    """Tier 2: batch shape first (any failure here is the whole payload's), then event by event."""
    batch: _Batch[msgspec.Raw] | _MapBatch[msgspec.Raw]
    try:
        batch = _RAW_ARRAY_BATCH.decode(payload)
    except _DECODE_ERRORS as array_exc:
        try:
            batch = _RAW_MAP_BATCH.decode(payload)
        except _DECODE_ERRORS as map_exc:
            # Report the error of the shape the payload claims to be.
            exc = map_exc if len(payload) and _is_map_marker(payload[0]) else array_exc
            raise EventDecodeError(f"not a KV-event batch: {_reason(exc)}") from None
    events: list[Event] = []
    skipped = invalid = 0
    first_reason: str | None = None
    for i, raw in enumerate(batch.events):
        event, reason = _decode_event(raw)
        if event is not None:
            events.append(event)
        elif reason is None:
            skipped += 1
        else:
            invalid += 1
            if first_reason is None:
                first_reason = f"event {i}: {reason}"
    return EventBatch(batch.ts, events, batch.data_parallel_rank, skipped, invalid, first_reason)


def _decode(payload: Payload) -> EventBatch:
    batch = _decode_fast(payload)
    return _decode_tolerant(payload) if batch is None else batch


def decode_batch(payload: Payload) -> EventBatch:
    """Decode one msgpack payload (the third ZMQ frame). Raises EventDecodeError, never others.

    `payload` may be any buffer (bytes, memoryview, a zmq.Frame's buffer). Dropped events are
    counted in the batch's `skipped` / `invalid`, not raised.
    """
    try:
        return _decode(payload)
    except EventDecodeError:
        raise
    except Exception as exc:
        # Belt and braces for the ingestion loop, which must survive any payload: the fuzz tests
        # drive `_decode` directly, so a bug here still fails them instead of hiding behind this.
        raise EventDecodeError(f"undecodable payload: {type(exc).__name__}: {_reason(exc)}") from exc
