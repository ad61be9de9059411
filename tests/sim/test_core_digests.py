"""`blocks.PrefixDigests`: a shared prefix is hashed once per label, and a label never makes a
digest wrong (the tokens are compared before hashes are reused)."""

from __future__ import annotations

from epp.sim import blocks

BS = 4


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_reused_digests_equal_fresh_ones_and_are_not_rehashed() -> None:
    memo = blocks.PrefixDigests(BS)
    system = toks(0, 40)
    a, b = [*system, *toks(100, 9)], [*system, *toks(200, 3)]
    assert memo.prefix("t", a, 40) == blocks.block_digests(system, BS)
    first = memo.prefix("t", b, 40)
    assert first == blocks.block_digests(system, BS)
    first.clear()  # the caller's copy: the memo is unaffected
    assert memo.prefix("t", a, 40) == blocks.block_digests(system, BS)
    # Fewer shared tokens than a block, or a partial last block: only full blocks.
    assert memo.prefix("t", a, 3) == []
    assert memo.prefix("t", a, 42) == blocks.block_digests(system, BS)


def test_a_wrong_label_or_a_branch_costs_a_hash_not_a_wrong_digest() -> None:
    memo = blocks.PrefixDigests(BS)
    one, other = toks(0, 40), toks(1000, 40)
    memo.prefix("same-label", one, 40)
    assert memo.prefix("same-label", other, 40) == blocks.block_digests(other, BS)
    # A conversation that grew, then one that branched after 5 blocks.
    grown = [*other, *toks(5000, 16)]
    assert memo.prefix("same-label", grown, 56) == blocks.block_digests(grown, BS)
    branch = [*other[:20], *toks(7000, 30)]
    assert memo.prefix("same-label", branch, 50) == blocks.block_digests(branch, BS)
    # The same prompt object asked for more blocks than were checked: compared again.
    short = [*one[:8], *toks(9000, 32)]
    memo2 = blocks.PrefixDigests(BS)
    memo2.prefix("x", one, 40)
    assert memo2.prefix("x", short, 8) == blocks.block_digests(one[:8], BS)
    assert memo2.prefix("x", short, 40) == blocks.block_digests(short, BS)


def test_labels_are_bounded_least_recently_used_first() -> None:
    memo = blocks.PrefixDigests(BS, max_labels=2)
    for label in ("a", "b", "a", "c"):
        memo.prefix(label, toks(ord(label) * 100, 8), 8)
    assert list(memo._known) == ["a", "c"]
    # max_labels=0 keeps nothing: every call hashes afresh.
    none = blocks.PrefixDigests(BS, max_labels=0)
    assert none.prefix("a", toks(0, 8), 8) == blocks.block_digests(toks(0, 8), BS) and not none._known
