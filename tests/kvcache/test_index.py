"""BlockIndex: events -> records, match semantics, tiers, cap and recency, against a reference model."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from epp.kvcache._records import RecordTable
from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from epp.kvcache.index import BlockIndex, MatchResult
from epp.kvcache.keys import BlockKey, block_keys, seed_for

MODEL = "m"
BS = 4
SEED = seed_for(MODEL)
_hashes = itertools.count(1000)


def seq(n_blocks: int, start: int = 0) -> list[int]:
    """Tokens of `n_blocks` blocks; sequences with different `start` share no block."""
    return list(range(start, start + n_blocks * BS))


def keys_of(tokens: list[int], **seed: Any) -> list[BlockKey]:
    return block_keys(tokens, BS, seed=seed_for(MODEL, **seed) if seed else SEED)


def stored(tokens: list[int], parent: int | None = None, **kw: Any) -> BlockStored:
    hashes = kw.pop("hashes", None) or [next(_hashes) for _ in range(len(tokens) // BS)]
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=BS, **kw)


def batch(*events: Any) -> EventBatch:
    return EventBatch(ts=0.0, events=list(events))


def apply(index: BlockIndex, pod: str, *events: Any, **kw: Any) -> Any:
    return index.apply(pod, batch(*events), model=MODEL, **kw)


def check_consistency(index: BlockIndex) -> None:
    """Every internal structure agrees with the others (white box: the C table checks its own)."""
    index._table.check()
    for name, p in index._pods.items():
        assert p.name == name and index._slots[p.slot] is p
    assert sorted(index._live) == sorted(p.slot for p in index._pods.values())
    slots = {p.slot for p in index._pods.values()}
    assert all(slot in slots for slot, *_ in index._table.records())


def records_of(index: BlockIndex) -> dict[tuple[str, int, int], tuple[int, int]]:
    """(pod, tier, engine hash) -> (key, copies), as the table holds them."""
    names = {p.slot: name for name, p in index._pods.items()}
    return {(names[s], t, e): (k, n) for s, t, e, k, n, _ in index._table.records()}


# --- stores, removals, matches ------------------------------------------------------------------


def test_store_then_match() -> None:
    index = BlockIndex()
    tokens = seq(4)
    st_ = apply(index, "a", stored(tokens))
    assert (st_.stored, st_.orphans, st_.malformed) == (4, 0, 0)
    # A trailing partial block of the prompt has no key and does not matter.
    assert index.match(keys_of([*tokens, 1, 2])) == {"a": MatchResult(4, 4)}
    assert index.match(keys_of(tokens[: 2 * BS])) == {"a": MatchResult(2, 2)}
    assert index.match(keys_of(seq(4, start=500))) == {}
    assert index.match([]) == {}
    assert index.stats().entries == 4
    assert index.block_size_of("a") == BS
    assert index.block_size_of("nope") is None
    check_consistency(index)


def test_chained_stores_across_events_and_batches() -> None:
    index = BlockIndex()
    tokens = seq(6)
    first = stored(tokens[: 2 * BS])
    second = stored(tokens[2 * BS : 4 * BS], parent=first.block_hashes[-1])
    apply(index, "a", first, second)
    third = stored(tokens[4 * BS :], parent=second.block_hashes[-1])
    apply(index, "a", third)
    assert index.match(keys_of(tokens)) == {"a": MatchResult(6, 6)}
    check_consistency(index)


def test_unknown_parent_is_an_orphan_and_so_are_its_children() -> None:
    index = BlockIndex()
    tokens = seq(4)
    lost = stored(tokens[:BS])  # never applied: a missed event
    child = stored(tokens[BS : 3 * BS], parent=lost.block_hashes[0])
    grandchild = stored(tokens[3 * BS :], parent=child.block_hashes[-1])
    st_ = apply(index, "a", child, grandchild)
    assert (st_.stored, st_.orphans) == (0, 3)
    assert index.stats().orphans == 3
    assert index.stats().entries == 0
    assert index.match(keys_of(tokens)) == {}
    # The parent on another pod does not help: engine hashes are per pod.
    apply(index, "b", lost)
    assert apply(index, "a", child).orphans == 2


def test_removed_block_ends_the_leading_run() -> None:
    index = BlockIndex()
    tokens = seq(5)
    ev = stored(tokens)
    apply(index, "a", ev)
    st_ = apply(index, "a", BlockRemoved(block_hashes=[ev.block_hashes[2]]))
    assert (st_.removed, st_.missed_removals) == (1, 0)
    assert index.match(keys_of(tokens)) == {"a": MatchResult(2, 2)}
    # Its children are still cached on the pod; a store chained to them still resolves.
    more = stored(seq(5, start=40)[: 2 * BS], parent=ev.block_hashes[4])
    assert apply(index, "a", more).stored == 2
    assert index.stats().entries == 6
    check_consistency(index)


def test_duplicate_stores_are_reference_counted() -> None:
    index = BlockIndex()
    tokens = seq(2)
    ev = stored(tokens)
    apply(index, "a", ev, ev, ev)  # three physical copies of the same blocks
    assert index.stats().entries == 2
    for _ in range(2):
        st_ = apply(index, "a", BlockRemoved(block_hashes=[ev.block_hashes[0]]))
        assert (st_.removed, st_.deduplicated) == (1, 1)  # a copy went, the record stays
        assert index.match(keys_of(tokens)) == {"a": MatchResult(2, 2)}
    st_ = apply(index, "a", BlockRemoved(block_hashes=[ev.block_hashes[0]]))
    assert (st_.removed, st_.deduplicated) == (1, 0)
    assert index.match(keys_of(tokens)) == {}
    st_ = apply(index, "a", BlockRemoved(block_hashes=[ev.block_hashes[0], 424242]))
    assert (st_.removed, st_.missed_removals, st_.deduplicated) == (0, 2, 0)
    stats = index.stats()
    assert stats.missed_removals == 2
    # llm-d's counters: 6 blocks stored (copies too), 1 record removed, 2 removals of a copy.
    assert (stats.admissions, stats.removals, stats.deduplicated) == (6, 1, 2)
    assert (stats.lookups, stats.lookup_hits) == (3, 4)  # the three matches above: 2 + 2 + 0 blocks
    assert index.lookup_seconds.buckets()[-1][1] == 3
    check_consistency(index)


def test_the_tables_remove_tells_a_dropped_copy_from_a_removed_record() -> None:
    table = RecordTable(100)
    assert table.store(0, 0, [1, 2], [11, 12]) == (2, 0)
    assert table.store(0, 0, [1], [11]) == (0, 0)  # a second copy of engine hash 1
    # (removed, missed, deduplicated): hash 1 drops a copy, 2 its record, 3 is unknown.
    assert table.remove(0, 0, [1, 2, 3]) == (2, 1, 1)
    assert table.remove(0, 0, [1, 1]) == (1, 1, 0)
    assert table.records() == []
    table.check()


def test_one_key_under_two_engine_hashes() -> None:
    # Same tokens, different engine hashes on one pod (e.g. different extra keys in the engine):
    # the key stays held until both are removed.
    index = BlockIndex()
    tokens = seq(1)
    a, b = stored(tokens), stored(tokens)
    apply(index, "a", a, b)
    assert index.stats().entries == 2
    assert index.stats().keys == 1
    assert index.match(keys_of(tokens)) == {"a": MatchResult(1, 1)}
    apply(index, "a", BlockRemoved(block_hashes=a.block_hashes))
    assert index.match(keys_of(tokens)) == {"a": MatchResult(1, 1)}
    apply(index, "a", BlockRemoved(block_hashes=b.block_hashes))
    assert index.match(keys_of(tokens)) == {}
    check_consistency(index)


def test_all_blocks_cleared_drops_one_pod() -> None:
    index = BlockIndex()
    tokens = seq(3)
    ev_a, ev_b = stored(tokens), stored(tokens)
    apply(index, "a", ev_a)
    apply(index, "b", ev_b)
    st_ = apply(index, "a", AllBlocksCleared())
    assert st_.cleared == 1
    assert index.match(keys_of(tokens)) == {"b": MatchResult(3, 3)}
    assert index.stats().entries == 3
    # Its old hashes are unknown now.
    assert apply(index, "a", stored(seq(1, start=90), parent=ev_a.block_hashes[-1])).orphans == 1
    check_consistency(index)


def test_remove_pod() -> None:
    index = BlockIndex()
    tokens = seq(3)
    for pod in ("a", "b", "c"):
        apply(index, pod, stored(tokens))
    index.remove_pod("b")
    index.remove_pod("b")  # twice is fine
    index.remove_pod("never-seen")
    assert index.match(keys_of(tokens)) == {"a": MatchResult(3, 3), "c": MatchResult(3, 3)}
    assert index.stats().pods == 2
    assert index.stats().entries == 6
    # A new pod reuses the freed slot; nothing of "b" leaks into it.
    apply(index, "d", stored(tokens[:BS]))
    assert index._pods["d"].slot == 1
    assert index.match(keys_of(tokens)) == {
        "a": MatchResult(3, 3),
        "c": MatchResult(3, 3),
        "d": MatchResult(1, 1),
    }
    check_consistency(index)


def test_match_runs_per_pod_and_pods_filter() -> None:
    index = BlockIndex()
    tokens = seq(6)
    ks = keys_of(tokens)
    apply(index, "a", stored(tokens))
    apply(index, "b", stored(tokens[: 4 * BS]))
    apply(index, "c", stored(tokens[: 2 * BS]))
    gap = stored(tokens)
    apply(index, "d", gap, BlockRemoved(block_hashes=[gap.block_hashes[0]]))  # no first block
    assert index.match(ks) == {"a": MatchResult(6, 6), "b": MatchResult(4, 4), "c": MatchResult(2, 2)}
    assert index.match(ks, pods=["b", "c", "unknown"]) == {"b": MatchResult(4, 4), "c": MatchResult(2, 2)}
    assert index.match(ks, pods={"d"}) == {}
    assert index.match(ks, pods=[]) == {}
    # Any key sequence can be asked for; here one starting at block 1, which "d" holds too.
    assert index.match(ks[1:]) == {
        "a": MatchResult(5, 5),
        "b": MatchResult(3, 3),
        "c": MatchResult(1, 1),
        "d": MatchResult(5, 5),
    }
    # The walk stops at the first block no candidate holds, even if a later block is held.
    assert index.match([ks[0], keys_of(seq(1, start=700))[0], ks[2]]) == {
        "a": MatchResult(1, 1),
        "b": MatchResult(1, 1),
        "c": MatchResult(1, 1),
    }


def test_many_pods_beyond_64_slots() -> None:
    index = BlockIndex()
    tokens = seq(3)
    pods = [f"10.0.{i}.1:8000" for i in range(130)]
    for i, pod in enumerate(pods):
        apply(index, pod, stored(tokens[: (1 + i % 3) * BS]))
    res = index.match(keys_of(tokens))
    assert res == {pod: MatchResult(1 + i % 3, 1 + i % 3) for i, pod in enumerate(pods)}
    assert index.match(keys_of(tokens), pods=pods[-2:]) == {
        pods[-2]: MatchResult(3, 3),
        pods[-1]: MatchResult(1, 1),
    }
    check_consistency(index)


# --- tiers --------------------------------------------------------------------------------------


def test_tiers_and_gpu_counts() -> None:
    index = BlockIndex()
    tokens = seq(4)
    gpu = stored(tokens[: 2 * BS], medium="GPU")  # vLLM's spelling; lower-cased
    cpu = stored(tokens[2 * BS :], parent=gpu.block_hashes[-1], medium="cpu")  # parent on GPU
    apply(index, "a", gpu, cpu)
    assert index.match(keys_of(tokens)) == {"a": MatchResult(4, 2)}
    # Medium None is GPU too.
    apply(index, "b", stored(tokens, medium=None))
    assert index.match(keys_of(tokens))["b"] == MatchResult(4, 4)
    check_consistency(index)


def test_offload_placeholder_adds_a_tier() -> None:
    index = BlockIndex()
    tokens = seq(3)
    ev = stored(tokens)
    apply(index, "a", ev)
    placeholder = BlockStored(
        block_hashes=[*ev.block_hashes, 777], parent_block_hash=None, token_ids=[], block_size=0, medium="CPU"
    )
    st_ = apply(index, "a", placeholder)
    assert (st_.stored, st_.orphans) == (3, 1)  # 777 was never stored
    assert index.stats().entries == 6
    # The GPU copy of block 1 is evicted; the CPU copy keeps the run going.
    apply(index, "a", BlockRemoved(block_hashes=[ev.block_hashes[1]], medium="GPU"))
    assert index.match(keys_of(tokens)) == {"a": MatchResult(3, 2)}
    apply(index, "a", BlockRemoved(block_hashes=[ev.block_hashes[1]], medium="cpu"))
    assert index.match(keys_of(tokens)) == {"a": MatchResult(1, 1)}
    check_consistency(index)


def test_too_many_tiers_is_malformed() -> None:
    index = BlockIndex()
    for i in range(15):
        apply(index, "a", stored(seq(1, start=10 * i), medium=f"t{i}"))
    st_ = apply(index, "a", stored(seq(1, start=500), medium="one-too-many"))
    assert st_.malformed == 1
    assert apply(index, "a", BlockRemoved(block_hashes=[1], medium="another")).malformed == 1
    assert index.stats().entries == 15


# --- seeds ---------------------------------------------------------------------------------------


def test_model_lora_and_salt_separate_sequences() -> None:
    index = BlockIndex()
    tokens = seq(2)
    apply(index, "plain", stored(tokens))
    apply(
        index, "lora", stored(tokens, lora_name="sql-adapter", extra_keys=[["sql-adapter"], ["sql-adapter"]])
    )
    apply(index, "salted", stored(tokens, extra_keys=[["s3cret"], None]))
    apply(
        index, "both", stored(tokens, lora_name="sql-adapter", extra_keys=[["sql-adapter", "s3cret"], None])
    )
    index.apply("other-model", batch(stored(tokens)), model="other")
    assert index.match(keys_of(tokens)) == {"plain": MatchResult(2, 2)}
    assert index.match(keys_of(tokens, lora_name="sql-adapter")) == {"lora": MatchResult(2, 2)}
    assert index.match(keys_of(tokens, cache_salt="s3cret")) == {"salted": MatchResult(2, 2)}
    both = keys_of(tokens, lora_name="sql-adapter", cache_salt="s3cret")
    assert index.match(both) == {"both": MatchResult(2, 2)}
    assert index.match(block_keys(tokens, BS, seed=seed_for("other"))) == {"other-model": MatchResult(2, 2)}


def test_multimodal_extras_only_ever_cause_misses() -> None:
    # vLLM 0.19+ publishes [identifier, offset] pairs; not part of epp keys, and not a salt.
    index = BlockIndex()
    tokens = seq(2)
    apply(index, "a", stored(tokens, extra_keys=[[["img-1", 0]], None]))
    assert index.match(keys_of(tokens)) == {"a": MatchResult(2, 2)}


# --- garbage ------------------------------------------------------------------------------------


def test_malformed_events_are_counted_and_skipped() -> None:
    index = BlockIndex()
    bad = [
        stored(seq(2)[:-1], hashes=[1, 2]),  # tokens not a multiple of the block size
        stored(seq(2), hashes=[1, 2, 3]),  # more hashes than blocks
        stored(seq(2), hashes=[-1, 2]),  # not a uint64
        stored(seq(2), hashes=[1 << 64, 2]),
        BlockStored(block_hashes=[], parent_block_hash=None, token_ids=[], block_size=BS),
        BlockStored(block_hashes=[5], parent_block_hash=None, token_ids=seq(1), block_size=0),  # no size
        "not an event",
    ]
    st_ = apply(index, "a", *bad)
    assert (st_.malformed, st_.stored) == (7, 0)
    assert index.stats().malformed == 7
    assert index.stats().entries == 0
    # A default block size rescues an event that says 0.
    ok = BlockStored(block_hashes=[5, 6], parent_block_hash=None, token_ids=seq(2), block_size=0)
    assert apply(index, "a", ok, default_block_size=BS).stored == 2
    assert index.match(keys_of(seq(2))) == {"a": MatchResult(2, 2)}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(
                BlockStored,
                block_hashes=st.lists(st.integers(-5, 1 << 65), max_size=4),
                parent_block_hash=st.none() | st.integers(-5, 1 << 65),
                token_ids=st.lists(st.integers(0, 50), max_size=13),
                block_size=st.integers(-1, 5),
                medium=st.none() | st.sampled_from(["GPU", "cpu", "x"]),
                lora_name=st.none() | st.text(max_size=3),
                extra_keys=st.none() | st.lists(st.none() | st.lists(st.text(max_size=2) | st.integers())),
            ),
            st.builds(
                BlockRemoved,
                block_hashes=st.lists(st.integers(-5, 1 << 65), max_size=3),
                medium=st.none() | st.sampled_from(["GPU", "y"]),
            ),
            st.just(AllBlocksCleared()),
        ),
        max_size=12,
    ),
    st.integers(1, 8),
)
def test_garbage_never_raises(events: list[Any], cap: int) -> None:
    index = BlockIndex(max_entries=cap)
    for pod in ("a", "b"):
        apply(index, pod, *events, default_block_size=2)
        assert index.stats().entries <= cap
        check_consistency(index)
    index.match(keys_of(seq(3)))
    index.remove_pod("a")
    check_consistency(index)


# --- cap and recency ----------------------------------------------------------------------------


def test_cap_evicts_the_least_recently_used_keys() -> None:
    index = BlockIndex(max_entries=32)
    seqs = [seq(8, start=1000 * i) for i in range(6)]
    for s in seqs[:4]:
        apply(index, "a", stored(s))
    assert index.stats().entries == 32
    index.match(keys_of(seqs[0]))  # touch A
    st_ = apply(index, "a", stored(seqs[4]))
    assert st_.evicted == 8
    assert index.stats().evictions == 8
    assert index.stats().entries == 32
    held = {i for i, s in enumerate(seqs) if index.match(keys_of(s))}
    assert held == {0, 2, 3, 4}  # B, stored and never matched since, went first
    check_consistency(index)


def test_a_key_touched_every_generation_is_never_evicted() -> None:
    index = BlockIndex(max_entries=64)
    hot = seq(4, start=10**6)
    apply(index, "a", stored(hot))
    for i in range(200):
        apply(index, "b" if i % 2 else "a", stored(seq(4, start=1000 * i)))
        if i % 4 == 0:
            assert index.match(keys_of(hot)) == {"a": MatchResult(4, 4)}, i
        assert index.stats().entries <= 64
    assert index.stats().evictions == 200 * 4 + 4 - 64
    check_consistency(index)


def test_storing_again_touches() -> None:
    index = BlockIndex(max_entries=12)
    first, second, third = (seq(4, start=100 * i) for i in range(3))
    apply(index, "a", stored(first))
    apply(index, "a", stored(second))
    apply(index, "b", stored(first))  # another pod stores `first`: a use; 12 records
    apply(index, "a", stored(third))  # over the cap: `second` goes, `first` and `third` stay
    assert index.match(keys_of(first)) == {"a": MatchResult(4, 4), "b": MatchResult(4, 4)}
    assert index.match(keys_of(second)) == {}
    check_consistency(index)


def test_storing_a_copy_touches() -> None:
    index = BlockIndex(max_entries=8)
    first, second, third = (stored(seq(4, start=100 * i)) for i in range(3))
    apply(index, "a", first, second)
    apply(index, "a", first)  # a second copy of `first`: no new record, but a use
    apply(index, "a", third)
    assert index.match(keys_of(first.token_ids)) == {"a": MatchResult(4, 4)}
    assert index.match(keys_of(second.token_ids)) == {}


def test_eviction_forgets_engine_hashes() -> None:
    index = BlockIndex(max_entries=4)
    old = stored(seq(4))
    apply(index, "a", old)
    apply(index, "a", stored(seq(4, start=100)))
    st_ = apply(index, "a", BlockRemoved(block_hashes=old.block_hashes[:1]))
    assert st_.missed_removals == 1
    assert apply(index, "a", stored(seq(1, start=50), parent=old.block_hashes[-1])).orphans == 1


def test_bad_cap() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        BlockIndex(max_entries=0)


# --- reference model ----------------------------------------------------------------------------

ALPHABET = [seq(1, start=10 * i) for i in range(3)]  # 3 distinct blocks; paths of them overlap
PODS = ["a", "b", "c"]
MEDIA = [None, "GPU", "cpu"]


class Reference:
    """The index's contract written plainly: records (pod, tier, engine hash) -> [key, copies]."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str, int], list[int]] = {}
        # llm-d's counters: blocks stored (copies too), records removed, removals of a copy.
        self.admissions = self.removals = self.deduplicated = 0

    @staticmethod
    def tier(medium: str | None) -> str:
        return (medium or "gpu").lower()

    def resolve(self, pod: str, e: int, tier: str) -> int | None:
        if (pod, tier, e) in self.records:
            return self.records[(pod, tier, e)][0]
        for (p, _, h), (key, _) in sorted(self.records.items(), key=lambda r: r[0][1]):
            if p == pod and h == e:
                return key
        return None

    def store(self, pod: str, ev: BlockStored) -> None:
        tier = self.tier(ev.medium)
        if not ev.token_ids:
            for e in ev.block_hashes:
                key = self.resolve(pod, e, tier)
                if key is not None:
                    self.add(pod, tier, e, key)
            return
        if ev.parent_block_hash is None:
            keys = block_keys(ev.token_ids, BS, seed=SEED)
        else:
            parent = self.resolve(pod, ev.parent_block_hash, tier)
            if parent is None:
                return
            keys = block_keys(ev.token_ids, BS, seed=0, parent=parent)
        for e, key in zip(ev.block_hashes, keys, strict=True):
            self.add(pod, tier, e, key)

    def add(self, pod: str, tier: str, e: int, key: int) -> None:
        rec = self.records.setdefault((pod, tier, e), [key, 0])
        rec[1] += 1
        self.admissions += 1

    def remove(self, pod: str, ev: BlockRemoved) -> None:
        for e in ev.block_hashes:
            rec = self.records.get((pod, self.tier(ev.medium), e))
            if rec is not None:
                rec[1] -= 1
                if not rec[1]:
                    del self.records[(pod, self.tier(ev.medium), e)]
                    self.removals += 1
                else:
                    self.deduplicated += 1

    def clear(self, pod: str) -> None:
        self.records = {r: v for r, v in self.records.items() if r[0] != pod}

    def match(self, keys: list[BlockKey], pods: list[str] | None) -> dict[str, MatchResult]:
        out = {}
        for pod in PODS if pods is None else pods:
            tiers = [
                {t for (p, t, _), (k, _) in self.records.items() if p == pod and k == key} for key in keys
            ]
            run = next((i for i, ts in enumerate(tiers) if not ts), len(tiers))
            if run:
                out[pod] = MatchResult(run, sum("gpu" in ts for ts in tiers[:run]))
        return out


class IndexMachine(RuleBasedStateMachine):
    """Random event streams: uncapped, the index equals the reference; capped, it holds a subset."""

    def __init__(self) -> None:
        super().__init__()
        self.ref = Reference()
        self.engine_hash: dict[tuple[int, ...], int] = {}  # path of blocks -> engine hash
        self.cap: int | None = None
        self.index = BlockIndex()

    @initialize(cap=st.none() | st.integers(1, 12))
    def setup(self, cap: int | None) -> None:
        self.cap = cap
        self.index = BlockIndex(max_entries=cap or 1_000_000)

    def hash_of(self, path: tuple[int, ...]) -> int:
        return self.engine_hash.setdefault(path, 10_000 + len(self.engine_hash))

    def apply(self, pod: str, ev: Any) -> None:
        self.index.apply(pod, batch(ev), model=MODEL)
        if isinstance(ev, BlockStored):
            self.ref.store(pod, ev)
        elif isinstance(ev, BlockRemoved):
            self.ref.remove(pod, ev)
        else:
            self.ref.clear(pod)

    @rule(
        pod=st.sampled_from(PODS),
        path=st.lists(st.integers(0, 2), min_size=1, max_size=4).map(tuple),
        start=st.integers(0, 3),
        medium=st.sampled_from(MEDIA),
        orphan=st.booleans(),
    )
    def store(self, pod: str, path: tuple[int, ...], start: int, medium: str | None, orphan: bool) -> None:
        start = min(start, len(path) - 1)
        if start:
            parent: int | None = self.hash_of(path[:start]) + (10**6 if orphan else 0)
        else:
            parent = None
        hashes = [self.hash_of(path[: i + 1]) for i in range(start, len(path))]
        tokens = [t for b in path[start:] for t in ALPHABET[b]]
        self.apply(pod, stored(tokens, parent=parent, hashes=hashes, medium=medium))

    @rule(
        pod=st.sampled_from(PODS),
        path=st.lists(st.integers(0, 2), min_size=1, max_size=4).map(tuple),
        medium=st.sampled_from(MEDIA),
    )
    def remove(self, pod: str, path: tuple[int, ...], medium: str | None) -> None:
        self.apply(pod, BlockRemoved(block_hashes=[self.hash_of(path)], medium=medium))

    @rule(pod=st.sampled_from(PODS), paths=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=4)))
    def retier(self, pod: str, paths: list[list[int]]) -> None:
        hashes = [self.hash_of(tuple(p)) for p in paths] or [1]
        self.apply(
            pod,
            BlockStored(
                block_hashes=hashes, parent_block_hash=None, token_ids=[], block_size=0, medium="cpu"
            ),
        )

    @rule(pod=st.sampled_from(PODS))
    def clear(self, pod: str) -> None:
        self.apply(pod, AllBlocksCleared())

    @rule(pod=st.sampled_from(PODS))
    def remove_pod(self, pod: str) -> None:
        self.index.remove_pod(pod)
        self.ref.clear(pod)

    @precondition(lambda self: self.cap is None)
    @rule(
        path=st.lists(st.integers(0, 2), max_size=5),
        pods=st.none() | st.lists(st.sampled_from(PODS), unique=True),
    )
    def match(self, path: list[int], pods: list[str] | None) -> None:
        keys = keys_of([t for b in path for t in ALPHABET[b]])
        assert self.index.match(keys, pods) == self.ref.match(keys, pods)

    @precondition(lambda self: self.cap is not None)
    @rule(path=st.lists(st.integers(0, 2), max_size=5))
    def match_capped(self, path: list[int]) -> None:
        keys = keys_of([t for b in path for t in ALPHABET[b]])
        full = self.ref.match(keys, None)
        for pod, res in self.index.match(keys).items():
            assert res.blocks <= full[pod].blocks

    @invariant()
    def consistent(self) -> None:
        check_consistency(self.index)
        records = records_of(self.index)
        tiers = {name: t for name, t in self.index._tiers.items() if name and name.islower()}
        expected = {(pod, tiers[t], e): (key, n) for (pod, t, e), (key, n) in self.ref.records.items()}
        if self.cap is None:
            assert records == expected
            st_ = self.index.stats()
            ref = self.ref
            assert (st_.admissions, st_.removals, st_.deduplicated) == (
                ref.admissions,
                ref.removals,
                ref.deduplicated,
            )
        else:
            # Evictions only take away: whatever the index holds, the reference holds, with at
            # least as many copies.
            assert self.index.stats().entries <= self.cap
            for rec, (key, n) in records.items():
                assert expected[rec][0] == key and expected[rec][1] >= n


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_a_match_over_more_records_than_it_keeps_still_touches_them_all() -> None:
    """A match keeps its walk's records for its touch up to a bound (1,048,576); a longer run's
    remaining keys are looked up again and touched all the same."""
    n, slots = 120_000, 10  # 1.2M records in the run, past the bound
    table = RecordTable(1 << 22)
    keys = list(range(1, n + 1))
    for slot in range(slots):
        table.store(slot, 0, [slot * n + k for k in keys], keys)
    filler = list(range(10**9, 10**9 + slots * n))  # ages the run's records by ~18 epochs
    table.store(slots, 0, filler, filler)
    before = max(age for slot, _, _, _, _, age in table.records() if slot < slots)
    found = sorted(table.match(keys, list(range(slots))))
    assert found == [(slot, n, n) for slot in range(slots)]
    after = [age for slot, _, _, _, _, age in table.records() if slot < slots]
    assert max(after) * 2 < before  # every record stamped during the match, the last keys too
    table.check()
