"""Pickers: ordering of the fallback list, tie-breaking and sampling distributions.

Randomised pickers use the global `random` module; the `seeded` fixture seeds it (and restores its
state afterwards), so the statistical assertions below are deterministic. Their bounds are loose
enough to hold for any seed (several standard deviations), so a change of seed does not flake.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Iterator
from typing import Any

import pytest

from . import builders

E = builders.endpoint
RUNS = 2000


@pytest.fixture
def seeded() -> Iterator[None]:
    state = random.getstate()
    random.seed(20260521)
    yield
    random.setstate(state)


def pick(type_name: str, scores: list[float], parameters: dict[str, Any] | None = None) -> list[str]:
    eps = builders.pool(len(scores))
    chosen = builders.plugin(type_name, parameters).pick(
        {}, builders.request(), builders.scored(*zip(eps, scores, strict=True))
    )
    return [ep.name for ep in chosen]


def counts(
    type_name: str, scores: list[float], parameters: dict[str, Any] | None = None
) -> collections.Counter[str]:
    eps = builders.pool(len(scores))
    picker = builders.plugin(type_name, parameters)
    scored = builders.scored(*zip(eps, scores, strict=True))
    request = builders.request()
    return collections.Counter(picker.pick({}, request, scored)[0].name for _ in range(RUNS))


# ---- max-score-picker ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "parameters", "expected"),
    [
        ([0.1, 0.9, 0.5], None, ["pod-1"]),
        ([0.1, 0.9, 0.5], {"maxNumOfEndpoints": 2}, ["pod-1", "pod-2"]),
        ([0.1, 0.9, 0.5], {"maxNumOfEndpoints": 3}, ["pod-1", "pod-2", "pod-0"]),
        ([0.1, 0.9, 0.5], {"maxNumOfEndpoints": 10}, ["pod-1", "pod-2", "pod-0"]),  # fewer than asked
        ([3.0, 5.0, 0.0, 4.0], {"maxNumOfEndpoints": 4}, ["pod-1", "pod-3", "pod-0", "pod-2"]),
        ([0.0], None, ["pod-0"]),
    ],
)
def test_max_score_picker_orders_best_first(
    scores: list[float], parameters: dict[str, Any] | None, expected: list[str]
) -> None:
    assert pick("max-score-picker", scores, parameters) == expected


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize("parameters", [None, {"maxNumOfEndpoints": 2}])
def test_max_score_picker_breaks_ties_uniformly(parameters: dict[str, Any] | None) -> None:
    # pod-0 and pod-3 share the highest score; pod-1 and pod-2 never come first.
    got = counts("max-score-picker", [0.9, 0.2, 0.5, 0.9], parameters)
    assert set(got) == {"pod-0", "pod-3"}
    assert abs(got["pod-0"] - RUNS / 2) < 150  # sd 22: ~7 sd


@pytest.mark.usefixtures("seeded")
def test_max_score_picker_tie_break_is_uniform_over_many() -> None:
    got = counts("max-score-picker", [1.0] * 5 + [0.5])
    assert set(got) == {f"pod-{i}" for i in range(5)}
    assert all(abs(n - RUNS / 5) < 120 for n in got.values())  # sd 18


@pytest.mark.usefixtures("seeded")
def test_max_score_picker_fallbacks_after_a_tie_are_the_other_tied_then_next() -> None:
    results = {
        tuple(pick("max-score-picker", [0.7, 0.9, 0.9, 0.1], {"maxNumOfEndpoints": 3})) for _ in range(200)
    }
    assert results == {("pod-1", "pod-2", "pod-0"), ("pod-2", "pod-1", "pod-0")}


def test_max_score_picker_does_not_reorder_its_input() -> None:
    eps = builders.pool(4)
    scored = builders.scored(*zip(eps, [0.1, 0.4, 0.4, 0.2], strict=True))
    before = list(scored)
    builders.plugin("max-score-picker", {"maxNumOfEndpoints": 4}).pick({}, builders.request(), scored)
    assert scored == before


# ---- random-picker -------------------------------------------------------------------------------


@pytest.mark.usefixtures("seeded")
def test_random_picker_is_uniform_and_ignores_scores() -> None:
    got = counts("random-picker", [1.0, 0.0, 0.0, 0.0])
    assert set(got) == {"pod-0", "pod-1", "pod-2", "pod-3"}
    assert all(abs(n - RUNS / 4) < 130 for n in got.values())  # sd 19


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize(("n", "maximum", "expected_len"), [(5, 3, 3), (2, 3, 2), (1, 1, 1)])
def test_random_picker_returns_distinct_endpoints(n: int, maximum: int, expected_len: int) -> None:
    for _ in range(50):
        chosen = pick("random-picker", [0.5] * n, {"maxNumOfEndpoints": maximum})
        assert len(chosen) == expected_len == len(set(chosen))


# ---- weighted-random-picker ----------------------------------------------------------------------


@pytest.mark.usefixtures("seeded")
def test_weighted_random_picker_is_proportional_to_score() -> None:
    got = counts("weighted-random-picker", [1.0, 3.0, 0.0, 4.0])
    assert "pod-2" not in got  # score 0 is never picked
    # expected 1/8, 3/8, 4/8 of the runs; sd at most 22
    assert abs(got["pod-0"] - RUNS / 8) < 120
    assert abs(got["pod-1"] - RUNS * 3 / 8) < 150
    assert abs(got["pod-3"] - RUNS / 2) < 150


@pytest.mark.usefixtures("seeded")
def test_weighted_random_picker_all_zero_is_uniform() -> None:
    got = counts("weighted-random-picker", [0.0, 0.0, 0.0])
    assert set(got) == {"pod-0", "pod-1", "pod-2"}
    assert all(abs(n - RUNS / 3) < 150 for n in got.values())  # sd 21


@pytest.mark.usefixtures("seeded")
def test_weighted_random_picker_several_excludes_non_positive_and_is_distinct() -> None:
    firsts: collections.Counter[str] = collections.Counter()
    for _ in range(300):
        chosen = pick("weighted-random-picker", [0.5, 0.0, 2.0, -1.0, 1.0], {"maxNumOfEndpoints": 4})
        assert sorted(chosen) == ["pod-0", "pod-2", "pod-4"]  # fewer than asked: 0 and below excluded
        firsts[chosen[0]] += 1
    assert firsts["pod-2"] > firsts["pod-4"] > firsts["pod-0"]


@pytest.mark.usefixtures("seeded")
def test_weighted_random_picker_all_zero_several_is_a_uniform_sample() -> None:
    for _ in range(50):
        chosen = pick("weighted-random-picker", [0.0] * 4, {"maxNumOfEndpoints": 2})
        assert len(chosen) == 2 == len(set(chosen))


# ---- round-robin-picker --------------------------------------------------------------------------


def test_round_robin_picker_cycles_by_name_ignoring_scores() -> None:
    eps = [E("c"), E("a"), E("b")]
    picker = builders.plugin("round-robin-picker")
    scored = builders.scored(*zip(eps, [1.0, 0.0, 0.5], strict=True))
    got = [picker.pick({}, builders.request(), scored)[0].name for _ in range(7)]
    assert got == ["a", "b", "c", "a", "b", "c", "a"]


def test_round_robin_picker_returns_the_next_n_and_advances_by_one() -> None:
    eps = [E("a"), E("b"), E("c")]
    picker = builders.plugin("round-robin-picker", {"maxNumOfEndpoints": 2})
    scored = builders.scored(*((ep, 0.0) for ep in eps))
    got = [[ep.name for ep in picker.pick({}, builders.request(), scored)] for _ in range(4)]
    assert got == [["a", "b"], ["b", "c"], ["c", "a"], ["a", "b"]]


def test_round_robin_picker_keeps_its_place_when_the_set_changes() -> None:
    a, b, c, d = E("a"), E("b"), E("c"), E("d")
    picker = builders.plugin("round-robin-picker")

    def next_name(*eps: Any) -> str:
        name: str = picker.pick({}, builders.request(), builders.scored(*((ep, 0.0) for ep in eps)))[0].name
        return name

    assert next_name(a, b, c) == "a"
    assert next_name(a, b, c) == "b"
    assert next_name(a, c, d) == "c"  # b is gone: continue after it, not from a position
    assert next_name(a, d) == "d"
    assert next_name(a, b, c, d) == "a"  # wrapped around
