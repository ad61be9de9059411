"""The block -> pods index fed by vLLM KV events: which pods hold which token prefixes, in which tier.

Two keys, as llm-d does it. An engine's block hash cannot be derived from a prompt, nor an epp key
(`epp.kvcache.keys`) from an engine hash, so ingestion builds the bridge: `BlockStored` carries
token ids, from which epp computes its keys chained from the parent's key, and each pod maps
engine hash -> key, which is all `BlockRemoved` and later stores need.

Records: one per (pod, tier, engine hash), one int, the "pe" `(slot << 4 | tier) << 64 | hash`.
A pod maps `engine: dict[pe, key]`; key -> holders holds that same pe object when one record holds
the key (the common case), else a tuple `(pod mask, gpu mask, pe, ...)`. A record thus allocates
one int shared by both maps, holders of a key share one key object (vLLM's union-typed
BlockHashToBlockMap, PR #24830), and the masks make each block of `match` a few int operations.
Extra copies of a pe (vLLM may store a hash twice) are counted in the pod's `dups`; a removal
drops one copy. Tiers: `medium` lower-cased, None is "gpu", 16 at most; a block on GPU and CPU is
two records, matched as GPU. Pod slots: lowest free first, reused after `remove_pod` purged all.

Events (reference kv-events.md 1.6):
- `BlockStored`: keys from its tokens at its `block_size` (else `default_block_size`), from
  `seed_for(model, lora_name=..., cache_salt=...)` without a parent, else from the parent's key on
  this pod (any tier). An unknown parent (missed events, or evicted here) makes its blocks orphans:
  counted, skipped, never guessed. The salt is the last bare string of block 0's `extra_keys`
  other than the LoRA name (vLLM >= 0.19); misreading one (a 0.17-0.18 bare multimodal id) only
  makes keys differ: a missed match, never a false one.
- Without tokens (an offloading connector's placeholder: a known hash now also lives on `medium`):
  each hash known on the pod gets a record in that tier; others are orphans.
- `BlockRemoved` drops one copy per hash; `AllBlocksCleared` every record of the pod.
- Malformed events (token count != blocks * block_size, no block size, hashes outside uint64, a
  17th tier, unknown types) are counted and skipped: nothing raises on event content.
Prompts must be hashed at the pods' block size (`block_size_of`). Not in the keys: multimodal ids,
prompt-embedding digests. kv_cache_report_mode="full" re-reports reused blocks, which the
reference counts cannot tell from copies.

Cap and recency: past `max_entries` records, whole keys go, least recently used first; storing or
matching a key touches it. Exact LRU moves a key per touch: with a plain dict (pop, re-insert)
`match` was 3-6x slower and its p99 spiky (touches use up dict slots: a 1M-key dict rebuilt every
~1M touches); an OrderedDict costs ~49 more bytes per key (tracemalloc, 2M keys). So recency lives
in three generations (segmented LRU): `_young` (stored or touched since the last rotation; touching
is free), `_probation` (a touch moves a key back to `_young`) and `_old` (eviction walks it in
insertion order; a touch still rescues). When `_old` is used up all age by one; while `_probation`
is empty, `_young` moves there after `max_entries // 3` records entered it, and each generation
then lasts about as long as the one before: a key touched once per third of the cap's worth of
stores is never evicted. `_old` loses keys by value (None), never by deletion, so one iterator walks
it across calls (deleting from a dict's front leaves dead slots each `next(iter(d))` scans again:
1.3 ms per million, measured). An evicted key's engine hashes go too, orphaning events chained to
them: size `max_entries` above the pods' cached blocks (all tiers); the cap is a safety net.

Synchronous and single-threaded by design: the asyncio ingestion task calls `apply` between
awaits and the scheduler `match` on the same loop, so no call sees another half done.
Costs: tests/kvcache/bench_index.py.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Collection, Iterator, Sequence
from typing import Any, Final, TypeAlias, cast

import msgspec

from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from epp.kvcache.keys import BlockKey, block_keys, seed_for
from epp.observability.histogram import Histogram

GPU: Final = "gpu"
# llm-d's lookup-latency buckets (Go's default ones).
LOOKUP_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MAX_TIERS: Final = 16

_E_MASK: Final = (1 << 64) - 1
_SLOT_SHIFT: Final = 68  # pe >> 68 is the pod slot, (pe >> 64) & 15 the tier

# A key's holders: one record (pe), or (pod mask, gpu mask, pe, pe, ...) for several.
_Holders: TypeAlias = "int | tuple[int, ...]"


class MatchResult(msgspec.Struct, frozen=True, gc=False):
    """A pod's cached prefix of a request: leading blocks held in any tier, and how many on GPU."""

    blocks: int
    gpu_blocks: int


class ApplyStats(msgspec.Struct, gc=False):
    """What one `apply` call did, in blocks unless said otherwise."""

    stored: int = 0  # recorded, duplicates and re-tiered placeholders included
    removed: int = 0  # copies removed by BlockRemoved
    missed_removals: int = 0  # BlockRemoved hashes not in the index (evicted, orphaned, unseen)
    orphans: int = 0  # skipped: parent unknown (for placeholders: the block itself)
    cleared: int = 0  # AllBlocksCleared events
    malformed: int = 0  # events skipped as garbage
    evicted: int = 0  # entries evicted by the `max_entries` cap
    deduplicated: int = 0  # of `removed`: a copy dropped while another remains (the record stays)


class IndexStats(msgspec.Struct, frozen=True, gc=False):
    """Index size and cumulative counters, for metrics."""

    entries: int  # records: (key, pod, tier); (key, pod) entries when a pod uses one tier
    keys: int
    pods: int
    evictions: int  # entries evicted by the cap since creation
    orphans: int
    missed_removals: int
    malformed: int
    # Cumulative, for llm-d's `kv_cache_*` series: blocks stored (records and copies), records
    # removed by BlockRemoved, removals that only dropped a copy; `match` calls, and the longest
    # leading run any pod held, summed over them.
    admissions: int = 0
    removals: int = 0
    deduplicated: int = 0
    lookups: int = 0
    lookup_hits: int = 0


class _Pod:
    """One pod's side of the index."""

    __slots__ = ("block_size", "dups", "engine", "mask", "model", "name", "prefixes", "slot", "tiers")

    def __init__(self, name: str, slot: int) -> None:
        self.name = name
        self.slot = slot
        self.mask = 1 << slot
        self.prefixes = [((slot << 4) | t) << 64 for t in range(MAX_TIERS)]  # | hash: a pe
        self.engine: dict[int, int] = {}  # pe -> key
        self.dups: dict[int, int] = {}  # pe -> extra copies, only while > 0
        self.tiers = 0  # a bit per tier stored in (parent lookups try those)
        self.block_size: int | None = None
        self.model = ""


class BlockIndex:
    """Which pods hold which blocks (by epp key), fed by `apply`, read by `match`.

    Args:
        max_entries: cap on records (`IndexStats.entries`); past it the least recently used keys
            are evicted with all their records.
    """

    def __init__(self, *, max_entries: int = 10_000_000) -> None:
        if max_entries <= 0:
            raise ValueError(f"max_entries must be > 0, got {max_entries}")
        self._max = max_entries
        self._young_added = 0  # records that entered `_young` (stored, promoted) since it was new
        self._rotate_at = max(1, max_entries // 3)
        self._young: dict[int, _Holders] = {}
        self._probation: dict[int, _Holders] = {}
        self._old: dict[int, _Holders | None] = {}
        self._old_live = 0
        self._old_iter: Iterator[int] = iter(self._old)
        self._pods: dict[str, _Pod] = {}
        self._slots: list[_Pod | None] = []
        self._free: list[int] = []  # heap of released slots
        self._all = 0  # mask of every pod's slot
        self._tiers: dict[str | None, int] = {None: 0, GPU: 0}  # medium, also lower-cased -> tier
        self._tier_count = 1
        self._masks: dict[int, int] = {}  # interned holder masks (a few distinct pod sets)
        self._entries = 0
        self._evictions = 0
        self._orphans = 0
        self._missed = 0
        self._malformed = 0
        self._admissions = 0
        self._removals = 0
        self._deduplicated = 0
        self._lookups = 0
        self._lookup_hits = 0
        # Seconds per `match` (llm-d's lookup latency), in plain numbers: no lock per lookup.
        self.lookup_seconds = Histogram(LOOKUP_BUCKETS)

    # --- ingestion ------------------------------------------------------------------------------

    def apply(
        self, pod: str, batch: EventBatch, *, model: str, default_block_size: int | None = None
    ) -> ApplyStats:
        """Apply one event batch from `pod`, whose engine serves `model` (the base of key seeds);
        `default_block_size` stands in for a BlockStored's `block_size` of 0."""
        st = ApplyStats()
        p = self._pods.get(pod) or self._add_pod(pod)
        p.model = model
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(p, ev, model, default_block_size, st)
                if self._entries > self._max:
                    self._evict(st)
            elif isinstance(ev, BlockRemoved):
                self._removed(p, ev, st)
            elif isinstance(ev, AllBlocksCleared):
                self._clear(p)
                st.cleared += 1
            else:
                st.malformed += 1
        self._orphans += st.orphans
        self._missed += st.missed_removals
        self._malformed += st.malformed
        self._admissions += st.stored
        self._removals += st.removed - st.deduplicated
        self._deduplicated += st.deduplicated
        return st

    def remove_pod(self, pod: str) -> None:
        """Forget `pod` and all its records (it left the pool, or its event stream restarted)."""
        p = self._pods.pop(pod, None)
        if p is None:
            return
        self._clear(p)
        self._slots[p.slot] = None
        heapq.heappush(self._free, p.slot)
        self._all &= ~p.mask

    def _add_pod(self, name: str) -> _Pod:
        if self._free:
            slot = heapq.heappop(self._free)
        else:
            slot = len(self._slots)
            self._slots.append(None)
        p = self._slots[slot] = self._pods[name] = _Pod(name, slot)
        self._all |= p.mask
        return p

    def _tier(self, medium: str | None) -> int:
        """Tier id of `medium` (None -> GPU), registering a new name; -1 past MAX_TIERS."""
        t = self._tiers.get(medium)
        if t is None:
            assert medium is not None
            name = medium.lower()
            t = self._tiers.get(name)
            if t is None:
                if self._tier_count == MAX_TIERS:
                    return -1
                t = self._tiers[name] = self._tier_count
                self._tier_count += 1
            self._tiers[medium] = t
        return t

    def _stored(
        self, p: _Pod, ev: BlockStored, model: str, default_block_size: int | None, st: ApplyStats
    ) -> None:
        hashes = ev.block_hashes
        n = len(hashes)
        tier = self._tiers.get(ev.medium)
        if tier is None:
            tier = self._tier(ev.medium)
        # Hashes outside uint64 would corrupt the pod and tier bits of their records; min and max
        # run in C, cheaper than masking each hash.
        if tier < 0 or n == 0 or min(hashes) < 0 or max(hashes) > _E_MASK:
            st.malformed += 1
            return
        tokens = ev.token_ids
        if not tokens:
            self._retier(p, tier, hashes, st)
            return
        size = ev.block_size if ev.block_size > 0 else (default_block_size or 0)
        if size <= 0 or len(tokens) != n * size:
            st.malformed += 1
            return
        parent = ev.parent_block_hash
        if parent is None:
            seed = seed_for(model, lora_name=ev.lora_name, cache_salt=_cache_salt(ev))
            new = block_keys(tokens, size, seed=seed)
        else:
            pk = self._resolve(p, parent, tier)
            if pk is None:
                st.orphans += n
                return
            new = block_keys(tokens, size, seed=0, parent=pk)
        p.block_size = size
        p.tiers |= 1 << tier
        prefix = p.prefixes[tier]
        engine = p.engine
        young = self._young
        probation = self._probation
        added = 0
        # Last block first, so the event's first block ends youngest: a prefix match needs the
        # leading blocks, and losing one voids every block after it (vLLM frees a request's
        # blocks tail first for the same reason).
        for e, key in zip(reversed(hashes), reversed(new), strict=True):
            pe = prefix | e
            # `_add` inlined for a key no one holds (the bulk of prefill): the call alone cost
            # ~25% of apply (cProfile, 128-block events).
            if (
                pe in engine
                or key in young
                or (probation and key in probation)
                or (self._old_live and self._old.get(key) is not None)
            ):
                added += self._add(p, pe, key)
            else:
                engine[pe] = key
                young[key] = pe
                added += 1
        self._entries += added
        self._young_added += added
        st.stored += n
        self._maybe_rotate()

    def _retier(self, p: _Pod, tier: int, hashes: list[int], st: ApplyStats) -> None:
        prefix = p.prefixes[tier]
        p.tiers |= 1 << tier
        for e in hashes:
            k = self._resolve(p, e, tier)
            if k is None:
                st.orphans += 1
            else:
                added = self._add(p, prefix | e, k)
                self._entries += added
                self._young_added += added
                st.stored += 1

    def _resolve(self, p: _Pod, engine_hash: int, tier: int) -> int | None:
        """The key `engine_hash` stands for on `p`, looked up in `tier` first, then its others."""
        e = engine_hash & _E_MASK
        k = p.engine.get(p.prefixes[tier] | e)
        for t in _bits(p.tiers & ~(1 << tier)) if k is None else ():
            k = p.engine.get(p.prefixes[t] | e)
            if k is not None:
                break
        return k

    def _add(self, p: _Pod, pe: int, key: int) -> int:
        """Record `pe` -> `key` and touch `key`; 1 if a new entry, 0 if another copy."""
        engine = p.engine
        known = engine.get(pe)
        if known is not None:
            # Another copy of a block this pod+tier already holds; its key stays the first one.
            p.dups[pe] = p.dups.get(pe, 0) + 1
            if known not in self._young:
                self._promote(known)  # a use all the same
            return 0
        young = self._young
        v = young.get(key)
        if v is None:
            v = self._promote(key)
        if v is None:
            engine[pe] = key
            young[key] = pe
        else:
            # Updating in place keeps the key object the other holders' engine maps reference;
            # this record references it too (a second int would cost 32 bytes).
            engine[pe] = self._key_object(v)
            young[key] = self._pack((v, pe) if isinstance(v, int) else (*v[2:], pe))
        return 1

    def _removed(self, p: _Pod, ev: BlockRemoved, st: ApplyStats) -> None:
        # Most events are removals of one hash (vLLM sends one per evicted block), so this path
        # avoids calls and second lookups: ~40% of apply time on a decode-heavy stream (cProfile).
        tier = self._tiers.get(ev.medium)
        if tier is None:
            tier = self._tier(ev.medium)
            if tier < 0:
                st.malformed += 1
                return
        prefix = p.prefixes[tier]
        engine = p.engine
        dups = p.dups
        young = self._young
        for e in ev.block_hashes:
            pe = prefix | (e & _E_MASK)
            k = engine.pop(pe, None)
            if k is None:
                st.missed_removals += 1
                continue
            st.removed += 1
            if dups:
                extra = dups.get(pe)
                if extra is not None:
                    engine[pe] = k  # another copy remains
                    st.deduplicated += 1
                    if extra == 1:
                        del dups[pe]
                    else:
                        dups[pe] = extra - 1
                    continue
            self._entries -= 1
            if isinstance(young.get(k), int):
                del young[k]  # its only record, this one
            else:
                self._unlink(k, pe)

    def _clear(self, p: _Pod) -> None:
        for pe, k in p.engine.items():
            self._unlink(k, pe)
        self._entries -= len(p.engine)
        p.engine = {}
        p.dups = {}
        p.tiers = 0

    # --- holders and recency --------------------------------------------------------------------

    def _pack(self, records: tuple[int, ...]) -> _Holders:
        """Holders value for `records` (pe ints, one per (pod, tier, engine hash))."""
        if len(records) == 1:
            return records[0]
        mask = gpu = 0
        for pe in records:
            pt = pe >> 64
            bit = 1 << (pt >> 4)
            mask |= bit
            if not pt & 15:
                gpu |= bit
        masks = self._masks
        if len(masks) > 4096:  # only sharing is lost; values already stored stay valid
            masks.clear()
        return (masks.setdefault(mask, mask), masks.setdefault(gpu, gpu), *records)

    def _key_object(self, v: _Holders) -> int:
        """The key int object the engine maps reference for a key whose holders are `v`."""
        pe = v if isinstance(v, int) else v[2]
        p = self._slots[pe >> _SLOT_SHIFT]
        assert p is not None
        return p.engine[pe]

    def _unlink(self, key: int, pe: int) -> None:
        """Drop record `pe` from `key`'s holders (a removal, not a use: recency unchanged)."""
        gen: dict[int, _Holders] | dict[int, _Holders | None] = self._young
        v = self._young.get(key)
        if v is None and self._probation:
            gen = self._probation
            v = gen.get(key)
        if v is None:
            gen = self._old
            v = gen.get(key)
            if v is None:
                return
        rest = None if isinstance(v, int) else self._pack(tuple(r for r in v[2:] if r != pe))
        if rest is not None:
            gen[key] = rest
        elif gen is self._old:
            self._old[key] = None  # never deleted: `_old_iter` must stay valid
            self._old_live -= 1
        else:
            del gen[key]

    def _promote(self, key: int) -> _Holders | None:
        """Move `key` from an older generation to the young one; its holders, or None if absent."""
        v = self._probation.pop(key, None) if self._probation else None
        if v is None:
            if not self._old_live:
                return None
            v = self._old.get(key)
            if v is None:
                return None
            self._old[key] = None
            self._old_live -= 1
        self._young[self._key_object(v)] = v  # the key object the engine maps reference
        self._young_added += 1 if isinstance(v, int) else len(v) - 2
        return v

    def _maybe_rotate(self) -> None:
        # A key is safe if touched once on probation, so a short probation (say, one event long)
        # would let hot keys go. Records are the unit, not keys (a key may have many holders).
        if not self._probation and self._young_added >= self._rotate_at:
            self._probation = self._young
            self._young = {}
            self._young_added = 0

    def _evict(self, st: ApplyStats) -> None:
        while self._entries > self._max:
            old = self._old
            for key in self._old_iter:
                v = old[key]
                if v is None:
                    continue
                old[key] = None
                self._old_live -= 1
                records = (v,) if isinstance(v, int) else v[2:]
                for pe in records:
                    p = self._slots[pe >> _SLOT_SHIFT]
                    assert p is not None
                    del p.engine[pe]
                    if p.dups:
                        p.dups.pop(pe, None)
                n = len(records)
                self._entries -= n
                self._evictions += n
                st.evicted += n
                if self._entries <= self._max:
                    return
            # `_old` is used up: every generation ages by one.
            nxt = self._probation or self._young
            if not nxt:
                return  # nothing left to evict; cannot happen while records exist
            if self._probation:
                self._probation = self._young
            self._young = {}
            self._young_added = 0
            self._old = cast("dict[int, _Holders | None]", nxt)
            self._old_live = len(nxt)
            self._old_iter = iter(nxt)

    # --- queries --------------------------------------------------------------------------------

    def match(self, keys: Sequence[BlockKey], pods: Collection[str] | None = None) -> dict[str, MatchResult]:
        """Each pod's run of leading blocks of `keys` it holds (pods with none are left out).

        Only `pods` are considered when given (unknown names are ignored). The walk stops at the
        first block no pod still in the running holds. The matched blocks are touched.
        """
        started = time.perf_counter()
        found = self._match(keys, pods)
        self.lookup_seconds.observe(time.perf_counter() - started)
        self._lookups += 1
        if found:
            self._lookup_hits += max(m.blocks for m in found.values())
        return found

    def _match(self, keys: Sequence[BlockKey], pods: Collection[str] | None) -> dict[str, MatchResult]:
        if pods is None:
            alive = self._all
        else:
            alive = 0
            known = self._pods
            for name in pods:
                p = known.get(name)
                if p is not None:
                    alive |= p.mask
        if not alive or not keys:
            return {}
        yget = self._young.get
        pget = self._probation.get if self._probation else None
        oget = self._old.get if self._old_live else None
        older: list[int] = []  # matched keys to move back to the young generation
        ended: list[tuple[int, int]] = []  # (mask of pods that dropped out, their run)
        off_gpu: dict[int, int] = {}  # slot -> blocks of its run held off GPU only
        # The previous block's holders (pod+tier of a single record, or a tuple's masks) when
        # every pod still alive has it on GPU; -1 otherwise.
        same_pt = same_mask = same_gpu = -1
        run = 0
        for k in keys:
            v = yget(k)
            if v is None:
                if pget is not None:
                    v = pget(k)
                if v is None and oget is not None:
                    v = oget(k)
                if v is None:
                    break
                older.append(k)
            # Fast path: a block held like the previous one changes nothing. That is most blocks
            # of a prompt, and it skips ~8 int operations (~40% of the walk).
            if isinstance(v, int):
                pt = v >> 64
                if pt == same_pt:
                    run += 1
                    continue
                mask = 1 << (pt >> 4)
                gpu = 0 if pt & 15 else mask
            else:
                mask = v[0]
                gpu = v[1]
                if mask == same_mask and gpu == same_gpu:
                    run += 1
                    continue
                pt = -1
            held = alive & mask
            if held != alive:
                if not held:
                    if older and older[-1] is k:
                        older.pop()
                    break
                if run:
                    ended.append((alive ^ held, run))
                alive = held
            if gpu & alive != alive:
                for slot in _bits(alive & ~gpu):
                    off_gpu[slot] = off_gpu.get(slot, 0) + 1
                same_pt = same_mask = same_gpu = -1
            elif pt >= 0:
                same_pt = pt
                same_mask = same_gpu = -1
            else:
                same_pt = -1
                same_mask = mask
                same_gpu = gpu
            run += 1
        if not run:
            return {}
        ended.append((alive, run))
        # Leading blocks last, so they end youngest.
        for i in range(len(older) - 1, -1, -1):
            self._promote(older[i])
        if older:
            self._maybe_rotate()
        out: dict[str, MatchResult] = {}
        slots = self._slots
        for mask, blocks in ended:
            for slot in _bits(mask):
                p = slots[slot]
                assert p is not None
                out[p.name] = MatchResult(blocks, blocks - off_gpu.get(slot, 0))
        return out

    def block_size_of(self, pod: str) -> int | None:
        """The block size of `pod`'s last stored event (prompts must be hashed at it to match)."""
        p = self._pods.get(pod)
        return None if p is None else p.block_size

    def pod_info(self, pod: str) -> tuple[int | None, str] | None:
        """(`block_size_of`, `model_of`) in one lookup, None for a pod without events: what a
        scorer needs per endpoint to key a prompt as the pod's events were keyed."""
        p = self._pods.get(pod)
        return None if p is None else (p.block_size, p.model)

    def model_of(self, pod: str) -> str | None:
        """The model `pod`'s last batch was applied with (the base of its key seeds); None if the
        pod has no events. A request must seed its keys with the same name to match."""
        p = self._pods.get(pod)
        return None if p is None else p.model

    def stats(self) -> IndexStats:
        return IndexStats(
            entries=self._entries,
            keys=len(self._young) + len(self._probation) + self._old_live,
            pods=len(self._pods),
            evictions=self._evictions,
            orphans=self._orphans,
            missed_removals=self._missed,
            malformed=self._malformed,
            admissions=self._admissions,
            removals=self._removals,
            deduplicated=self._deduplicated,
            lookups=self._lookups,
            lookup_hits=self._lookup_hits,
        )


def _bits(mask: int) -> Iterator[int]:
    """The positions of the set bits of `mask` (pod slots, tiers), lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _cache_salt(ev: BlockStored) -> str | None:
    """The cache salt of a sequence's first block: the last bare string of its extra keys other
    than the LoRA name (vLLM publishes lora + mm + salt + embeds, untagged), or None."""
    extra: Any = ev.extra_keys
    if not extra:
        return None
    first = extra[0]
    if isinstance(first, str):
        first = (first,)
    elif not isinstance(first, list | tuple):
        return None
    for part in reversed(first):
        if isinstance(part, str) and part != ev.lora_name:
            return part
    return None
