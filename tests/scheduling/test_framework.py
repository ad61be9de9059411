"""The profile pipeline: filter order, clamping and weights, explain, errors and timing metrics."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.api import errors
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.observability import metrics
from epp.scheduling import framework, interfaces

from . import builders


class FixedScorer:
    """Returns the given scores as they are (out of range on purpose)."""

    type = "fixed-scorer"

    def __init__(self, name: str, scores: Sequence[float]) -> None:
        self.name = name
        self.scores = list(scores)

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        return self.scores[: len(endpoints)]


class DropFilter:
    """Removes the endpoints with the given names; records the order it was called in."""

    type = "drop-filter"

    def __init__(self, name: str, drop: set[str], calls: list[str]) -> None:
        self.name = name
        self.drop = drop
        self.calls = calls

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        self.calls.append(self.name)
        return [ep for ep in endpoints if ep.name not in self.drop]


class RecordingPicker:
    """Picks the best total (first on ties) and keeps what it was given."""

    type = "recording-picker"

    def __init__(self, name: str = "rec") -> None:
        self.name = name
        self.seen: list[interfaces.ScoredEndpoint] = []

    def pick(
        self, cycle: interfaces.CycleState, request: InferenceRequest, scored: list[interfaces.ScoredEndpoint]
    ) -> list[Endpoint]:
        self.seen = scored
        return [max(scored, key=lambda s: s.score).endpoint] if scored else []


class EmptyPicker(RecordingPicker):
    def pick(
        self, cycle: interfaces.CycleState, request: InferenceRequest, scored: list[interfaces.ScoredEndpoint]
    ) -> list[Endpoint]:
        return []


def totals(picker: RecordingPicker) -> dict[str, float]:
    return {s.endpoint.name: s.score for s in picker.seen}


@pytest.mark.parametrize(
    ("raw", "weight", "expected"),
    [
        ([0.5, 0.25], 1.0, [0.5, 0.25]),
        ([1.5, -0.5], 1.0, [1.0, 0.0]),  # clamped to [0, 1]
        ([math.nan, math.inf], 1.0, [0.0, 1.0]),  # NaN counts as 0
        ([-math.inf, 0.75], 2.0, [0.0, 1.5]),  # clamped, then weighted
        ([1.0, 0.5], 0.0, [0.0, 0.0]),  # weight 0 switches a scorer off
    ],
)
def test_scores_are_clamped_then_weighted(raw: list[float], weight: float, expected: list[float]) -> None:
    picker = RecordingPicker()
    profile = framework.Profile("p", [], [(FixedScorer("s", raw), weight)], picker)
    profile.run({}, builders.request(), builders.pool(2))
    assert list(totals(picker).values()) == pytest.approx(expected)


def test_weighted_scores_are_summed_without_normalisation() -> None:
    picker = RecordingPicker()
    scorers: list[tuple[interfaces.Scorer, float]] = [
        (FixedScorer("a", [1.0, 0.0, 0.5]), 2.0),
        (FixedScorer("b", [0.0, 1.0, 0.5]), 3.0),
        (FixedScorer("c", [0.5, 0.5, 2.0]), 1.0),
    ]
    result = framework.Profile("p", [], scorers, picker).run({}, builders.request(), builders.pool(3))
    assert totals(picker) == pytest.approx({"pod-0": 2.5, "pod-1": 3.5, "pod-2": 3.5})
    assert [ep.name for ep in result.targets] == ["pod-1"]
    assert result.profile == "p"
    assert result.scores == {}  # no explain, no breakdown


def test_explain_keeps_clamped_per_scorer_scores() -> None:
    scorers: list[tuple[interfaces.Scorer, float]] = [
        (FixedScorer("a", [2.0, 0.25]), 2.0),
        (FixedScorer("b", [math.nan, 0.5]), 1.0),
    ]
    profile = framework.Profile("p", [], scorers, RecordingPicker())
    result = profile.run({}, builders.request(), builders.pool(2), explain=True)
    assert result.scores == {"pod-0": {"a": 1.0, "b": 0.0}, "pod-1": {"a": 0.25, "b": 0.5}}


class CountingExplainer(FixedScorer):
    """A scorer explaining the candidates it was scored over, as the load scorers do."""

    def explain(self, cycle: interfaces.CycleState) -> dict[str, object]:
        return framework.explain_inputs(cycle, lambda ep: {"blocks": len(ep.name)}, {"who": self.name})


def test_explain_keeps_each_explainers_findings_apart_and_merged() -> None:
    calls: list[str] = []
    scorers: list[tuple[interfaces.Scorer, float]] = [
        (CountingExplainer("first", [1.0, 1.0]), 1.0),
        (CountingExplainer("second", [1.0, 1.0]), 1.0),
    ]
    profile = framework.Profile("p", [DropFilter("f", {"pod-2"}, calls)], scorers, RecordingPicker())
    cycle: interfaces.CycleState = {}
    result = profile.run(cycle, builders.request(), builders.pool(3), explain=True)
    assert [ep.name for ep in cycle[framework.CANDIDATES]] == ["pod-0", "pod-1"]  # the survivors
    own = {"request": {"who": "first"}, "endpoints": {"pod-0": {"blocks": 5}, "pod-1": {"blocks": 5}}}
    assert result.facts["plugins"]["first"] == own
    assert result.facts["plugins"]["second"]["request"] == {"who": "second"}
    assert result.facts["request"] == {"who": "second"}  # merged: the later plugin wins a shared field
    # Without explain the candidates are not kept, and such explainers have nothing to say.
    cycle = {}
    profile.run(cycle, builders.request(), builders.pool(3))
    assert framework.CANDIDATES not in cycle
    assert profile.facts(cycle) == {"request": {}, "endpoints": {}, "plugins": {}}


def test_filters_run_in_order_and_scorers_see_only_survivors() -> None:
    calls: list[str] = []
    picker = RecordingPicker()
    filters: list[interfaces.Filter] = [
        DropFilter("f1", {"pod-0"}, calls),
        DropFilter("f2", {"pod-2"}, calls),
    ]
    profile = framework.Profile("p", filters, [(FixedScorer("s", [0.3, 0.4]), 1.0)], picker)
    result = profile.run({}, builders.request(), builders.pool(4))
    assert calls == ["f1", "f2"]
    assert totals(picker) == pytest.approx({"pod-1": 0.3, "pod-3": 0.4})
    assert [ep.name for ep in result.targets] == ["pod-3"]


def test_a_filter_leaving_nothing_is_no_capacity_naming_it() -> None:
    calls: list[str] = []
    filters: list[interfaces.Filter] = [
        DropFilter("keep-all", set(), calls),
        DropFilter("drop-all", {"pod-0", "pod-1"}, calls),
        DropFilter("never-reached", set(), calls),
    ]
    profile = framework.Profile("p", filters, [], RecordingPicker())
    with pytest.raises(errors.NoCapacity, match="filter 'drop-all'") as info:
        profile.run({}, builders.request(), builders.pool(2))
    assert info.value.status == 429
    assert calls == ["keep-all", "drop-all"]


def test_a_picker_choosing_nothing_is_no_capacity() -> None:
    profile = framework.Profile("p", [], [], EmptyPicker("empty"))
    with pytest.raises(errors.NoCapacity, match="picker 'empty'"):
        profile.run({}, builders.request(), builders.pool(2))


def test_a_scorer_returning_the_wrong_number_of_scores_is_a_bug_naming_it() -> None:
    profile = framework.Profile("p", [], [(FixedScorer("short", [0.5]), 1.0)], RecordingPicker())
    with pytest.raises(RuntimeError, match="scorer 'short' returned 1 scores for 3 endpoints"):
        profile.run({}, builders.request(), builders.pool(3))


@pytest.mark.parametrize("weight", [-1.0, math.nan, math.inf])
def test_a_profile_rejects_negative_or_non_finite_weights(weight: float) -> None:
    with pytest.raises(ValueError, match=r"weight .* of scorer 's' is not a finite number >= 0"):
        framework.Profile("p", [], [(FixedScorer("s", []), weight)], RecordingPicker())


def test_no_scorers_gives_every_endpoint_zero() -> None:
    picker = RecordingPicker()
    framework.Profile("p", [], [], picker).run({}, builders.request(), builders.pool(3))
    assert totals(picker) == {"pod-0": 0.0, "pod-1": 0.0, "pod-2": 0.0}


def _count(extension_point: str, plugin_type: str, plugin_name: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "inference_extension_plugin_duration_seconds_count",
        {"extension_point": extension_point, "plugin_type": plugin_type, "plugin_name": plugin_name},
    )
    return value or 0.0


def test_plugin_calls_are_sampled_and_every_whole_decision_is_timed() -> None:
    calls: list[str] = []
    profile = framework.Profile(
        "p",
        [DropFilter("timed-f", set(), calls)],
        [(FixedScorer("timed-s", [0.1, 0.2]), 1.0)],
        RecordingPicker("timed-p"),
    )
    scheduler = framework.Scheduler([profile], "p")
    points = [
        ("Filter", "drop-filter", "timed-f"),
        ("Scorer", "fixed-scorer", "timed-s"),
        ("Picker", "recording-picker", "timed-p"),
    ]
    before = [_count(*p) for p in points]
    e2e_before = (
        metrics.REGISTRY.get_sample_value("inference_extension_scheduler_e2e_duration_seconds_count") or 0
    )
    cycles = 3 * framework.PLUGIN_TIMING_EVERY
    for _ in range(cycles):
        scheduler.schedule(builders.request(), builders.pool(2))
    # the first cycle of every PLUGIN_TIMING_EVERY is timed: 3 of them here
    assert [_count(*p) - b for p, b in zip(points, before, strict=True)] == [3, 3, 3]
    e2e_after = metrics.REGISTRY.get_sample_value("inference_extension_scheduler_e2e_duration_seconds_count")
    assert e2e_after == e2e_before + cycles


def test_scheduler_returns_the_primary_profile_result() -> None:
    profile = framework.Profile("only", [], [(FixedScorer("s", [0.1, 0.9]), 1.0)], RecordingPicker())
    scheduler = framework.Scheduler([profile], "only")
    result = scheduler.schedule(builders.request(), builders.pool(2), explain=True)
    assert result.primary == "only"
    assert list(result.profiles) == ["only"]
    assert [ep.name for ep in result.targets] == ["pod-1"]
    assert result.profiles["only"].scores == {"pod-0": {"s": 0.1}, "pod-1": {"s": 0.9}}
    assert scheduler.profile_names() == ["only"]


def test_scheduler_with_no_endpoints_is_service_unavailable() -> None:
    scheduler = framework.Scheduler([framework.Profile("p", [], [], RecordingPicker())], "p")
    with pytest.raises(errors.ServiceUnavailable, match="no ready endpoints") as info:
        scheduler.schedule(builders.request(), [])
    assert info.value.status == 503


@pytest.mark.parametrize(
    ("names", "primary", "message"),
    [
        (["a", "b"], "a", "multi-profile handlers are not supported yet"),
        ([], "a", "exactly one profile"),
        (["a"], "b", "primary profile 'b'"),
    ],
)
def test_scheduler_supports_exactly_one_profile_which_is_primary(
    names: list[str], primary: str, message: str
) -> None:
    profiles = [framework.Profile(n, [], [], RecordingPicker()) for n in names]
    with pytest.raises(ValueError, match=message):
        framework.Scheduler(profiles, primary)


@given(
    raw=st.lists(
        st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=4, max_size=4),
        min_size=1,
        max_size=4,
    ),
    weights=st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=4, max_size=4),
)
def test_totals_lie_between_zero_and_the_sum_of_weights(raw: list[list[float]], weights: list[float]) -> None:
    picker = RecordingPicker()
    scorers: list[tuple[interfaces.Scorer, float]] = [
        (FixedScorer(f"s{i}", scores), weights[i]) for i, scores in enumerate(raw)
    ]
    framework.Profile("p", [], scorers, picker).run({}, builders.request(), builders.pool(4))
    bound = sum(weights[: len(raw)])
    for total in totals(picker).values():
        assert 0.0 <= total <= bound * (1 + 1e-12)
