"""Fast mode's memos (a group's prefix hashes, a resent prompt's encoded body) are pure speedups:
a run with them gives the same decisions and times as one that hashes and encodes every request."""

from __future__ import annotations

import dataclasses

from epp.bench import fast
from epp.bench.policies import POLICIES
from epp.bench.workload import Prompt
from epp.sim import blocks

from . import helpers


class _Mislabelled(helpers.SmallStress):
    """Every prompt claims one group and that all its tokens are shared: wrong for most of them."""

    def next_request(self, user: int, now: float) -> tuple[float, Prompt] | None:
        nxt = super().next_request(user, now)
        if nxt is None:
            return None
        t, p = nxt
        return t, dataclasses.replace(p, group="everyone", shared_tokens=len(p.token_ids))


def _outcome(run: fast.FastRun) -> list[tuple[object, ...]]:
    result = run.run()
    assert not result.stopped_early
    return [(r.arrival, r.pod, r.status, r.cached_tokens, r.first_token, r.finish) for r in result.records]


def test_prefix_memo_and_bodies_change_nothing() -> None:
    def new(workload: helpers.SmallStress) -> fast.FastRun:
        return fast.FastRun(workload, POLICIES["epp"], profile=helpers.PROFILE, pods=helpers.PODS, seed=3)

    memo = new(helpers.small(3))
    fresh = new(helpers.small(3))
    fresh._prefix_digests = blocks.PrefixDigests(helpers.PROFILE.block_size, max_labels=0)  # keeps nothing
    wrong = new(_Mislabelled(seed=3, scale=0.01, fleet=helpers.FLEET))
    expected = _outcome(fresh)
    assert sum(1 for o in expected if o[3]) > 100  # prefix hits happen, so digests matter
    assert _outcome(memo) == expected
    assert _outcome(wrong) == expected


def test_a_resent_prompt_is_encoded_once() -> None:
    r = fast.FastRun(helpers.small(), POLICIES["random"], profile=helpers.PROFILE, pods=2, seed=1)
    ids = list(range(50))
    body = r._body(Prompt(ids, 8, "", 0))
    assert r._body(Prompt(ids, 8, "g", 0)) is body
    assert r._body(Prompt(list(ids), 8, "", 0)) == body  # an equal list: encoded again, same bytes
    assert r._body(Prompt(ids, 9, "", 0)) != body
