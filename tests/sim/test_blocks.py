"""The simulator's block pool (epp.sim.blocks): hashing, hits, eviction order, duplicates, events."""

from __future__ import annotations

import pytest

from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored
from epp.sim.blocks import Block, BlockPool, block_digests, extra_keys, wire_hash

BS = 4


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def run(pool: BlockPool, tokens: list[int], **keys: str | None) -> list[Block]:
    """One request through the pool as the engine drives it: hit, allocate, cache; still held."""
    digests = block_digests(tokens, BS, **keys)
    hit = pool.lookup(digests)[: (len(tokens) - 1) // BS]
    pool.touch(hit)
    blocks = hit + pool.allocate(-(-len(tokens) // BS) - len(hit))
    pool.cache(blocks, digests, tokens, lora_name=keys.get("lora_name"), cache_salt=keys.get("cache_salt"))
    return blocks


def test_digests_chain_over_full_blocks_and_keys() -> None:
    a = block_digests(toks(0, 10), BS)
    assert len(a) == 2  # the partial third block has no hash
    assert block_digests(toks(0, 8), BS) == a
    assert block_digests([99, *toks(1, 7)], BS)[1] != a[1]  # block 1's hash covers block 0
    assert block_digests(toks(0, 8), BS, lora_name="ad") != a
    salted = block_digests(toks(0, 8), BS, cache_salt="s")
    assert salted[0] != a[0] and salted[1] != a[1]
    assert wire_hash(a[0]) == int.from_bytes(a[0][-8:], "big") < 2**64
    assert extra_keys(0, "ad", "s") == ["ad", "s"] and extra_keys(1, "ad", "s") == ["ad"]
    assert extra_keys(0, None, "s") == ["s"] and extra_keys(1, None, "s") is None


def test_hits_are_capped_below_the_last_prompt_token() -> None:
    pool = BlockPool(17, BS)
    first = run(pool, toks(0, 8))
    pool.free(first)
    assert pool.cached == 2
    # 8 tokens again: block 1 holds the last prompt token, so only block 0 is a usable hit.
    digests = block_digests(toks(0, 8), BS)
    assert len(pool.lookup(digests)) == 2
    second = run(pool, toks(0, 8))
    assert second[0] is first[0] and second[1] is not first[1]
    assert pool.cached == 3  # block 1 is cached twice: vLLM keeps the duplicate


def test_eviction_takes_the_least_recently_freed_tail_first() -> None:
    pool = BlockPool(9, BS, record_events=True)
    a, b, c = toks(0, 12), toks(100, 12), toks(200, 12)
    blocks_a = run(pool, a)
    stored_a = pool.take_events()
    assert len(stored_a) == 1 and isinstance(stored_a[0], BlockStored)
    hashes_a = stored_a[0].block_hashes
    pool.free(blocks_a)
    pool.free(run(pool, b))
    pool.take_events()
    assert pool.held == 0 and pool.cached == 6
    # a's and b's last blocks were full (12 tokens), so every freed block is cached and goes to
    # the back. c needs 3 blocks: the 2 never used, then the head of the queue: a's last block.
    pool.free(run(pool, c))
    removed = [e for e in pool.take_events() if isinstance(e, BlockRemoved)]
    assert [e.block_hashes for e in removed] == [[hashes_a[2]]]
    assert len(pool.lookup(block_digests(a, BS))) == 2
    # a's first two blocks hit (taken out of the queue); its third needs a new block: b's last.
    run(pool, a)
    events = pool.take_events()
    assert isinstance(events[0], BlockRemoved)
    assert isinstance(events[1], BlockStored) and events[1].parent_block_hash == hashes_a[1]
    assert events[1].block_hashes == [hashes_a[2]]


def test_block_zero_is_the_null_block() -> None:
    """vLLM takes block 0 out of the pool at start: `num_blocks` 4 (the flag) leaves 3 usable."""
    pool = BlockPool(4, BS)
    assert pool.num_free == 3 and pool.usage() == 0.0
    held = pool.allocate(3)
    assert [b.id for b in held] == [1, 2, 3]
    assert pool.num_free == 0 and pool.usage() == 1.0
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0, BS)


def test_hashless_blocks_are_reused_before_fresh_and_cached_ones() -> None:
    """vLLM's free_blocks prepends blocks without a hash (LIFO) and appends cached ones (LRU)."""
    pool = BlockPool(4, BS, record_events=True)  # blocks 1-3
    a = run(pool, toks(0, 6))  # block 0 full and cached, block 1 partial
    assert [b.id for b in a] == [1, 2]
    pool.free(a)
    pool.take_events()
    # Queue: 2 (partial, at the front), 3 (never used), 1 (cached, at the back).
    assert [b.id for b in pool.allocate(2)] == [2, 3]
    assert pool.take_events() == []  # nothing cached was evicted
    assert [b.id for b in pool.allocate(1)] == [1]
    (removed,) = pool.take_events()
    assert isinstance(removed, BlockRemoved)


def test_freed_runs_keep_their_order_at_the_front() -> None:
    pool = BlockPool(8, BS)
    first = pool.allocate(3)  # 1, 2, 3: no hashes
    second = pool.allocate(2)  # 4, 5
    pool.free(first)  # front: 3, 2, 1 (tail first)
    pool.free(second)  # front: 5, 4, then 3, 2, 1
    assert [b.id for b in pool.allocate(7)] == [5, 4, 3, 2, 1, 6, 7]


def test_block_stored_event_fields() -> None:
    pool = BlockPool(9, BS, record_events=True)
    tokens = toks(0, 9)
    run(pool, tokens, lora_name="ad", cache_salt="s")
    (ev,) = pool.take_events()
    assert isinstance(ev, BlockStored)
    assert ev.parent_block_hash is None and ev.block_size == BS and ev.medium == "GPU"
    assert ev.token_ids == tokens[:8] and ev.lora_name == "ad"
    assert ev.extra_keys == [["ad", "s"], ["ad"]]
    assert ev.block_hashes == [
        wire_hash(d) for d in block_digests(tokens, BS, lora_name="ad", cache_salt="s")
    ]


def test_duplicates_are_removed_one_copy_at_a_time() -> None:
    pool = BlockPool(5, BS, record_events=True)
    first = run(pool, toks(0, 4))
    second = run(pool, toks(0, 4))  # overlapping identical requests: both compute block 0
    assert first[0] is not second[0] and pool.cached == 2
    pool.free(first)
    pool.free(second)
    pool.take_events()
    pool.allocate(3)  # 2 fresh, then the first copy
    (removed,) = pool.take_events()
    assert isinstance(removed, BlockRemoved)
    assert len(pool.lookup(block_digests(toks(0, 4), BS))) == 1  # the other copy still serves


def test_exhausted_pool_runs_outside_it_uncached() -> None:
    pool = BlockPool(3, BS)
    held = run(pool, toks(0, 12))
    assert [b.id >= 0 for b in held] == [True, True, False]
    assert pool.usage() == 1.0 and pool.cached == 2
    pool.free(held)
    assert pool.usage() == 0.0 and pool.outside == 0


def test_reset_is_refused_while_blocks_are_held_unless_forced() -> None:
    pool = BlockPool(9, BS, record_events=True)
    held = run(pool, toks(0, 8))
    pool.take_events()
    assert not pool.reset() and pool.cached == 2 and pool.take_events() == []
    assert pool.reset(force=True) and pool.cached == 0
    assert pool.take_events() == [AllBlocksCleared()]
    # The running request caches its blocks again, from block 0.
    pool.cache(held, block_digests(toks(0, 8), BS), toks(0, 8))
    (ev,) = pool.take_events()
    assert isinstance(ev, BlockStored) and ev.parent_block_hash is None and len(ev.block_hashes) == 2
    pool.free(held)
    assert pool.reset()


def test_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        BlockPool(5, 0)
