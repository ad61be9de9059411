"""InferenceModelRewrite precedence and weighting (llm-d v0.10's rules), on the store alone."""

from __future__ import annotations

import collections
import random

import pytest

from epp.datastore.model_rewrites import ModelRewrite, ModelRewriteStore, Rule, Target


def rewrite(name: str, *rules: Rule, created: str = "2026-01-01T00:00:00Z") -> ModelRewrite:
    return ModelRewrite(name=name, created=created, rules=rules)


def rule(*models: str, **targets: int | None) -> Rule:
    return Rule(frozenset(models), tuple(Target(m.replace("_", "-"), w) for m, w in targets.items()))


def store(*rewrites: ModelRewrite, seed: int = 0) -> ModelRewriteStore:
    s = ModelRewriteStore(random.Random(seed))
    s.replace(rewrites)
    return s


def test_no_rule_no_decision() -> None:
    s = store(rewrite("a", rule("alias", real=None)))
    assert s.decide("other") is None
    assert not ModelRewriteStore()
    assert s


def test_exact_match_any_of_its_matches() -> None:
    s = store(rewrite("a", rule("alias", "nick", real=None)))
    for model in ("alias", "nick"):
        decision = s.decide(model)
        assert decision is not None and (decision.rewrite, decision.model) == ("a", "real")


def test_exact_beats_generic_whatever_their_age_and_order() -> None:
    s = store(
        rewrite("old-generic", rule(fallback=None), created="2025-01-01T00:00:00Z"),
        rewrite("new-exact", rule("alias", exact=None), created="2026-06-01T00:00:00Z"),
    )
    assert s.decide("alias").model == "exact"  # type: ignore[union-attr]
    assert s.decide("anything").model == "fallback"  # type: ignore[union-attr]


def test_oldest_rewrite_wins_a_tie_then_the_first_rule() -> None:
    s = store(
        rewrite("young", rule("alias", young=None), created="2026-02-01T00:00:00Z"),
        rewrite("old", rule("alias", first=None), rule("alias", second=None), created="2026-01-01T00:00:00Z"),
    )
    decision = s.decide("alias")
    assert decision is not None and (decision.rewrite, decision.model) == ("old", "first")
    s.replace([r for r in s.rewrites if r.name != "old"])  # deleting the old one hands over
    assert s.decide("alias").model == "young"  # type: ignore[union-attr]


def test_same_second_is_broken_by_name() -> None:
    same = "2026-01-01T00:00:00Z"
    s = store(
        rewrite("b", rule("m", from_b=None), created=same), rewrite("a", rule("m", from_a=None), created=same)
    )
    assert s.decide("m").model == "from-a"  # type: ignore[union-attr]


def test_oldest_generic_rule_wins() -> None:
    s = store(
        rewrite("young", rule(young=None), created="2026-02-01T00:00:00Z"),
        rewrite("old", rule(old=None), created="2026-01-01T00:00:00Z"),
    )
    assert s.decide("x").model == "old"  # type: ignore[union-attr]


def test_no_targets_decides_the_empty_model() -> None:
    s = store(rewrite("a", rule("alias")))
    assert s.decide("alias").model == ""  # type: ignore[union-attr]


def counts(s: ModelRewriteStore, model: str, n: int) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    for _ in range(n):
        decision = s.decide(model)
        assert decision is not None
        out[decision.model] += 1
    return out


WEIGHTS = [
    {"stable": 90, "canary": 10},
    {"a": 1, "b": 1, "c": 1},
    {"a": 1, "b": 2, "c": 3, "d": 994},
    {"big": 1_000_000, "tiny": 1},
    {"x": 7, "y": 13},
]


@pytest.mark.parametrize("weights", WEIGHTS, ids=lambda w: "/".join(map(str, w.values())))
@pytest.mark.parametrize("seed", range(5))
def test_weights_are_held_within_2_percent_over_10000_requests(weights: dict[str, int], seed: int) -> None:
    s = store(rewrite("split", rule("alias", **weights)), seed=seed)  # type: ignore[arg-type]
    n = 10_000
    got = counts(s, "alias", n)
    total = sum(weights.values())
    for model, weight in weights.items():
        expected = n * weight / total
        # within 2% of the expected count, and never more than 2 requests off (a share of 1 in a
        # million is 0.01 requests in 10,000: 0 is right)
        assert abs(got[model] - expected) <= max(0.02 * expected, 2), (model, got, expected)


def test_every_window_holds_the_weights() -> None:
    """A 1-in-10 canary gets 1 request in every 10 (give or take one), not just on average."""
    s = store(rewrite("split", rule("alias", stable=9, canary=1)))
    picks = [s.decide("alias").model for _ in range(2_000)]  # type: ignore[union-attr]
    for start in range(0, 2_000 - 100, 37):
        assert 8 <= picks[start : start + 100].count("canary") <= 12


def test_unweighted_targets_share_evenly_and_mixed_ones_are_never_chosen() -> None:
    even = counts(store(rewrite("e", rule("m", a=None, b=None, c=None, d=None))), "m", 10_000)
    assert all(abs(v - 2_500) <= 50 for v in even.values()) and len(even) == 4
    mixed = counts(store(rewrite("x", rule("m", a=3, b=None, c=1))), "m", 4_000)
    assert set(mixed) == {"a", "c"} and abs(mixed["a"] - 3_000) <= 60


def test_a_rule_keeps_its_position_when_another_rewrite_changes() -> None:
    s = store(rewrite("split", rule("alias", stable=1, canary=1)))
    first = [s.decide("alias").model for _ in range(3)]  # type: ignore[union-attr]
    s.replace([*s.rewrites, rewrite("other", rule("x", y=None))])
    after = [s.decide("alias").model for _ in range(1_000)]  # type: ignore[union-attr]
    picks = first + after
    assert abs(picks.count("canary") - len(picks) / 2) <= 2  # the sequence did not restart


def test_replicas_do_not_choose_in_lockstep() -> None:
    a = store(rewrite("split", rule("alias", stable=99, canary=1)), seed=1)
    b = store(rewrite("split", rule("alias", stable=99, canary=1)), seed=2)
    first_a = [s.model for s in (a.decide("alias") for _ in range(200)) if s is not None]
    first_b = [s.model for s in (b.decide("alias") for _ in range(200)) if s is not None]
    assert first_a.index("canary") != first_b.index("canary")
