"""The block -> pods index fed by vLLM KV events: which pods hold which token prefixes, in which tier.

Two keys, as llm-d does it. An engine's block hash cannot be derived from a prompt, nor an epp key
(`epp.kvcache.keys`) from an engine hash, so ingestion builds the bridge: `BlockStored` carries
token ids, from which epp computes its keys chained from the parent's key, and each pod maps
engine hash -> key, which is all `BlockRemoved` and later stores need.

Records: one per (pod, tier, engine hash), held by `epp.kvcache._records.RecordTable` (C: ~30
bytes a record; the same records as Python dicts and ints took 215-314,
docs/bench/microbenchmarks.md#kv-index). This module turns events into its calls and keeps what is
per pod (name, slot, block size, model, tiers). Extra copies of a record (vLLM may store a hash
twice) are counted; a removal drops one copy. Tiers: `medium` lower-cased, None is "gpu", 16 at
most; a block on GPU and CPU is two records, matched as GPU. Pod slots: the longest free first
(when shared, free for `SLOT_QUARANTINE_S` at least), reused after `remove_pod` purged all; 65,535
at most.

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

Cap and recency: past `max_entries` records, whole keys go, least recently used first (to 1/64 of
the cap: the table stamps records with epochs of max_entries/64 stamps); storing or matching a
key touches it, and an event's first block ends youngest (a prefix match needs the leading
blocks, and losing one voids every block after it; vLLM frees a request's blocks tail first for
the same reason). An evicted key's engine hashes go too, orphaning events chained to them: size
`max_entries` above the pods' cached blocks (all tiers); the cap is a safety net.
`AllBlocksCleared` and `remove_pod` walk the whole table (~4 bytes read per record).

Synchronous and single-threaded by design: the asyncio ingestion task calls `apply` between
awaits and the scheduler `match` on the same loop, so no call sees another half done (the table's
methods hold the GIL throughout). `BlockIndex(shared=True)` keeps its records in a memfd that
other processes read (`IndexReader`: match and the per-pod facts, which the writer's process
sends them, `pods_table`): `epp serve --workers N` ingests once, in the supervisor, and every
worker matches against that one index (epp.workers.shared_kv; the table's seqlock makes each
block's lookup consistent, see epp/kvcache/_records.c).
Costs: tests/kvcache/bench_index.py.
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Collection, Sequence
from typing import Any, Final

import msgspec

from epp.kvcache._records import MAX_SLOTS, RecordTable
from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from epp.kvcache.keys import BlockKey, block_keys, seed_for
from epp.observability.histogram import Histogram

GPU: Final = "gpu"
# llm-d's lookup-latency buckets (Go's default ones).
LOOKUP_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MAX_TIERS: Final = 16

_E_MASK: Final = (1 << 64) - 1


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
    # removed by BlockRemoved, removals that only dropped a copy (the writer's: a reader's are 0);
    # `match` calls, and the longest leading run any pod held, summed over them (this process's).
    admissions: int = 0
    removals: int = 0
    deduplicated: int = 0
    lookups: int = 0
    lookup_hits: int = 0


class _Pod:
    """One pod's side of the index."""

    __slots__ = ("block_size", "model", "name", "slot", "tiers")

    def __init__(self, name: str, slot: int) -> None:
        self.name = name
        self.slot = slot
        self.tiers = 0  # a bit per tier stored in (parent lookups try those)
        self.block_size: int | None = None
        self.model = ""


class KVIndexView:
    """What the scheduler reads of a KV index: matches and, per pod, how its prompts are keyed."""

    def __init__(self, table: RecordTable) -> None:
        self._table = table
        self._pods: dict[str, _Pod] = {}
        self._slots: list[_Pod | None] = []
        self._live: list[int] = []  # slots of every pod, for a match over all of them
        self._lookups = 0
        self._lookup_hits = 0
        # Seconds per `match` (llm-d's lookup latency), in plain numbers: no lock per lookup.
        self.lookup_seconds = Histogram(LOOKUP_BUCKETS)

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
            slots: Sequence[int] = self._live
        else:
            known = self._pods
            slots = [p.slot for p in (known.get(name) for name in pods) if p is not None]
        if not slots or not keys:
            return {}
        found = self._table.match(keys, slots)
        if not found:
            return {}
        names = self._slots
        out: dict[str, MatchResult] = {}
        for slot, blocks, gpu_blocks in found:
            p = names[slot] if slot < len(names) else None
            if p is not None:  # (a reader's pod list may lag the writer's by a moment)
                out[p.name] = MatchResult(blocks, gpu_blocks)
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
        entries, keys, evictions = self._table.stats()
        return IndexStats(
            entries=entries,
            keys=keys,
            pods=len(self._pods),
            evictions=evictions,
            orphans=0,
            missed_removals=0,
            malformed=0,
            lookups=self._lookups,
            lookup_hits=self._lookup_hits,
        )

    def nbytes(self) -> int:
        """Bytes the records use (the table's slab and indexes; the per-pod objects are not counted)."""
        return self._table.nbytes()


class IndexReader(KVIndexView):
    """Another process's `BlockIndex(shared=True)`, read through its memfd `fd`: matches (which
    mark the matched records for the writer's eviction order) and the pod facts `set_pods` gives."""

    def __init__(self, fd: int) -> None:
        super().__init__(RecordTable(fd=fd, attach=True))

    def set_pods(self, rows: Sequence[Sequence[Any]]) -> None:
        """The writer's `pods_table()`: [[name, slot, block_size, model], ...]."""
        pods: dict[str, _Pod] = {}
        slots: list[_Pod | None] = []
        for name, slot, block_size, model in rows:
            p = _Pod(str(name), int(slot))
            p.block_size = None if block_size is None else int(block_size)
            p.model = str(model)
            pods[p.name] = p
            slots.extend([None] * (p.slot + 1 - len(slots)))
            slots[p.slot] = p
        self._pods = pods
        self._slots = slots
        self._live = [p.slot for p in pods.values()]


class BlockIndex(KVIndexView):
    """Which pods hold which blocks (by epp key), fed by `apply`, read by `match`.

    Args:
        max_entries: cap on records (`IndexStats.entries`); past it the least recently used keys
            are evicted with all their records.
        shared: keep the records in a memfd other processes can read (`shared_fd`, `IndexReader`).
    """

    SLOT_QUARANTINE_S = 5.0
    """A removed pod's slot is not given to another for this long: a reader's pod list lags the
    writer's by its message's trip (epp.workers: one flush interval), and must never name a new
    pod's records after the old one."""

    def __init__(self, *, max_entries: int = 10_000_000, shared: bool = False) -> None:
        if max_entries <= 0:
            raise ValueError(f"max_entries must be > 0, got {max_entries}")
        self.shared_fd: int | None = os.memfd_create("epp-kv-index") if shared else None
        super().__init__(RecordTable(max_entries, -1 if self.shared_fd is None else self.shared_fd))
        self._free: list[tuple[float, int]] = []  # heap of (released at, slot)
        self._tiers: dict[str | None, int] = {None: 0, GPU: 0}  # medium, also lower-cased -> tier
        self._tier_count = 1
        self._orphans = 0
        self._missed = 0
        self._malformed = 0
        self._admissions = 0
        self._removals = 0
        self._deduplicated = 0
        self.pods_version = 0  # goes up when a pod, its block size or its model changes

    def close(self) -> None:
        """Close the memfd (the mapping stays until the index is freed)."""
        if self.shared_fd is not None:
            os.close(self.shared_fd)
            self.shared_fd = None

    def pods_table(self) -> list[list[Any]]:
        """[[name, slot, block_size, model], ...]: what an `IndexReader` needs besides the records."""
        return [[p.name, p.slot, p.block_size, p.model] for p in self._pods.values()]

    # --- ingestion ------------------------------------------------------------------------------

    def apply(
        self, pod: str, batch: EventBatch, *, model: str, default_block_size: int | None = None
    ) -> ApplyStats:
        """Apply one event batch from `pod`, whose engine serves `model` (the base of key seeds);
        `default_block_size` stands in for a BlockStored's `block_size` of 0."""
        st = ApplyStats()
        p = self._pods.get(pod) or self._add_pod(pod)
        if p.model != model:
            p.model = model
            self.pods_version += 1
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(p, ev, model, default_block_size, st)
            elif isinstance(ev, BlockRemoved):
                self._removed(p, ev, st)
            elif isinstance(ev, AllBlocksCleared):
                self._table.clear(p.slot)
                p.tiers = 0
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
        self._table.clear(p.slot)
        self._slots[p.slot] = None
        heapq.heappush(self._free, (time.monotonic(), p.slot))
        self._live.remove(p.slot)
        self.pods_version += 1

    def _add_pod(self, name: str) -> _Pod:
        if self._free and (
            self.shared_fd is None or time.monotonic() - self._free[0][0] > self.SLOT_QUARANTINE_S
        ):
            _, slot = heapq.heappop(self._free)
        elif len(self._slots) < MAX_SLOTS:
            slot = len(self._slots)
            self._slots.append(None)
        else:
            raise ValueError(f"KV index: more than {MAX_SLOTS} pods")
        p = self._slots[slot] = self._pods[name] = _Pod(name, slot)
        self._live.append(slot)
        self.pods_version += 1
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
        # Hashes outside uint64 would not fit the table; min and max run in C.
        if tier < 0 or n == 0 or min(hashes) < 0 or max(hashes) > _E_MASK:
            st.malformed += 1
            return
        tokens = ev.token_ids
        if not tokens:
            stored, orphans, _, evicted = self._table.retier(p.slot, tier, p.tiers, hashes)
            p.tiers |= 1 << tier
            st.stored += stored
            st.orphans += orphans
            st.evicted += evicted
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
            pk = self._table.resolve(p.slot, tier, p.tiers, parent & _E_MASK)
            if pk is None:
                st.orphans += n
                return
            new = block_keys(tokens, size, seed=0, parent=pk)
        if p.block_size != size:
            p.block_size = size
            self.pods_version += 1
        p.tiers |= 1 << tier
        _, evicted = self._table.store(p.slot, tier, hashes, new)
        st.stored += n
        st.evicted += evicted

    def _removed(self, p: _Pod, ev: BlockRemoved, st: ApplyStats) -> None:
        tier = self._tiers.get(ev.medium)
        if tier is None:
            tier = self._tier(ev.medium)
            if tier < 0:
                st.malformed += 1
                return
        hashes = ev.block_hashes
        if hashes and (min(hashes) < 0 or max(hashes) > _E_MASK):
            hashes = [e & _E_MASK for e in hashes]
        removed, missed, deduplicated = self._table.remove(p.slot, tier, hashes)
        st.removed += removed
        st.missed_removals += missed
        st.deduplicated += deduplicated

    def stats(self) -> IndexStats:
        view = super().stats()
        return IndexStats(
            entries=view.entries,
            keys=view.keys,
            pods=view.pods,
            evictions=view.evictions,
            orphans=self._orphans,
            missed_removals=self._missed,
            malformed=self._malformed,
            admissions=self._admissions,
            removals=self._removals,
            deduplicated=self._deduplicated,
            lookups=view.lookups,
            lookup_hits=view.lookup_hits,
        )


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
