"""request-latency-scorer with latency targets (x-slo-ttft-ms / x-slo-tpot-ms): a candidate predicted
to meet them beats a cheaper one that misses them, the running requests' TPOT targets are kept,
nothing changes without targets, and explain says which target drove the choice."""

from __future__ import annotations

from typing import Any

import pytest

from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces
from epp.scheduling.plugins import slo_targets

from . import builders
from .fleet import Clock, feed, result, toks
from .fleet import clock as clock  # the fixture
from .test_request_latency_scorer import Stack, request, teach

PROMPT = toks(2000, start=1)  # 2,000 tokens: 0.2 s of prefill at the prior 10,000 tokens/s


def targeted(ttft: float | None = None, tpot: float | None = None, **kw: Any) -> Any:
    req = request(PROMPT, **kw)
    req.slo_ttft, req.slo_tpot = ttft, tpot
    return req


def explained(s: Stack, cycle: interfaces.CycleState) -> tuple[dict[str, Any], dict[str, Any]]:
    facts = s.scorer.explain(cycle)
    return facts["request"], facts["endpoints"]


def queued_holder(clock: Clock) -> tuple[Stack, list[Endpoint]]:
    """pod-1 holds PROMPT behind 0.25 s of queued prefill; pod-0 is idle and cold. A constant step
    time (no decode terms differ), so the objective is TTFT plus pod-0's miss penalty: pod-1 is
    the cheaper pick, though its TTFT (~0.26 s) is above pod-0's (0.21 s)."""
    eps = builders.pool(2)
    s = Stack()
    teach(s.scorer.step_model, 0.018, 0.0, 0.0)
    s.route(request(toks(2500, start=500_000), rid="bg"), [eps[1]])
    feed(s.index, eps[1].name, PROMPT)
    return s, eps


def busy_holder(clock: Clock) -> tuple[Stack, list[Endpoint]]:
    """pod-1 holds PROMPT and decodes 5 sequences at 1 ms per sequence per step; pod-0 is idle
    and cold. For a 10-token answer the hit is the cheaper pick, though it decodes at 24 ms a
    token against pod-0's 19 ms."""
    eps = builders.pool(2)
    s = Stack()
    teach(s.scorer.step_model, 0.018, 1e-3, 0.0)
    for i in range(5):
        s.route(request(toks(100, start=100_000 * (i + 1)), rid=f"bg{i}"), [eps[1]])
    feed(s.index, eps[1].name, PROMPT)
    clock.now += 10.0  # their prefills drained
    return s, eps


def test_a_candidate_meeting_the_ttft_target_beats_a_cheaper_one_missing_it(clock: Clock) -> None:
    s, eps = queued_holder(clock)
    scores, cycle = s.score(targeted(), eps)
    assert scores[1] > scores[0]  # the objective alone: the queued holder
    _, rows = explained(s, cycle)
    assert rows["pod-0"]["predicted_ttft_s"] < 0.23 < rows["pod-1"]["predicted_ttft_s"]
    assert "slo" not in rows["pod-0"]  # no targets: nothing about them

    scores, cycle = s.score(targeted(ttft=0.23), eps)
    assert scores[0] > scores[1]
    about, rows = explained(s, cycle)
    slo = about["slo"]
    assert slo["ttft_target_s"] == 0.23 and "tpot_target_s" not in slo
    assert slo["meeting"] == ["pod-0"]
    assert slo["preferred"] == "pod-0" and slo["objective_best"] == "pod-1"
    assert slo["driven_by"] == "ttft" and slo["binding"] == "ttft" and slo["preferred_met"]
    assert "pod-1" in slo["summary"] and "TTFT" in slo["summary"]
    assert rows["pod-1"]["slo"]["ttft_met"] is False and rows["pod-1"]["slo"]["tier"] == 1
    assert rows["pod-0"]["slo"]["ttft_met"] is True and rows["pod-0"]["slo"]["tier"] == 0
    assert rows["pod-0"]["slo"]["ttft_predicted_s"] == pytest.approx(rows["pod-0"]["predicted_ttft_s"])
    assert rows["pod-0"]["slo"]["ttft_headroom_s"] == pytest.approx(0.23 - rows["pod-0"]["predicted_ttft_s"])


def test_a_candidate_meeting_the_tpot_target_beats_a_cheaper_one_missing_it(clock: Clock) -> None:
    s, eps = busy_holder(clock)
    scores, cycle = s.score(targeted(max_tokens=10), eps)
    assert scores[1] > scores[0]
    _, rows = explained(s, cycle)
    assert rows["pod-0"]["step_s"] < 0.021 < rows["pod-1"]["step_s"]

    scores, cycle = s.score(targeted(tpot=0.021, max_tokens=10), eps)
    assert scores[0] > scores[1]
    about, rows = explained(s, cycle)
    assert about["slo"]["driven_by"] == "tpot" and about["slo"]["preferred"] == "pod-0"
    row = rows["pod-1"]["slo"]
    assert row["tpot_predicted_s"] == pytest.approx(rows["pod-1"]["step_s"])
    assert row["tpot_met"] is False and row["tpot_target_from"] == "request" and row["tier"] == 1

    # With a TTFT target the cold pod misses, no candidate meets both: one misses TPOT, the other
    # TTFT. Neither miss is ranked above the other: the objective decides, as without targets.
    plain, _ = s.score(targeted(max_tokens=10), eps)
    scores, cycle = s.score(targeted(ttft=0.1, tpot=0.021, max_tokens=10), eps)
    assert scores == plain
    about, rows = explained(s, cycle)
    assert rows["pod-0"]["slo"]["ttft_met"] is False and rows["pod-0"]["slo"]["tpot_met"] is True
    assert about["slo"]["meeting"] == [] and not about["slo"]["preferred_met"]
    assert about["slo"]["preferred"] == "pod-1" and about["slo"]["binding"] == "tpot"
    assert about["slo"]["driven_by"] == ""
    assert about["slo"]["summary"].startswith("no candidate is predicted to meet every target")


def test_when_every_candidate_shares_a_tier_the_objective_decides_alone(clock: Clock) -> None:
    s, eps = busy_holder(clock)
    plain, _ = s.score(targeted(max_tokens=10), eps)
    easy, cycle = s.score(targeted(ttft=3600.0, tpot=3600.0, max_tokens=10), eps)
    assert easy == plain  # all meet: the same scores, exactly
    about, _ = explained(s, cycle)
    assert about["slo"]["meeting"] == ["pod-0", "pod-1"] and about["slo"]["driven_by"] == ""
    hopeless, cycle = s.score(targeted(ttft=1e-6, tpot=1e-6, max_tokens=10), eps)
    assert hopeless == plain  # none meets: the same scores, exactly (nobody is excluded)
    about, _ = explained(s, cycle)
    assert about["slo"]["meeting"] == [] and about["slo"]["preferred"] == "pod-1"


def test_the_running_requests_tpot_targets_are_kept(clock: Clock) -> None:
    """A request with a tight TPOT target decodes on pod-1; a request without targets that pod-1
    would serve cheapest goes to pod-0 instead, since joining pod-1 would slow the first past its
    target. Once the first completes, pod-1 is free to take it again."""

    def stack(first_target: float | None) -> tuple[Stack, list[Endpoint], Any]:
        eps = builders.pool(2)
        s = Stack()
        teach(s.scorer.step_model, 0.018, 0.0, 4.7e-7)
        first = request(toks(4000, start=700_000), rid="first")
        first.slo_tpot = first_target
        s.route(first, [eps[1]])
        feed(s.index, eps[1].name, PROMPT)
        clock.now += 10.0
        return s, eps, first

    s, eps, _ = stack(None)
    scores, _ = s.score(targeted(max_tokens=10), eps)
    assert scores[1] > scores[0]  # no target anywhere: the hit on pod-1

    s, eps, first = stack(0.0205)
    scores, cycle = s.score(targeted(max_tokens=10), eps)
    assert scores[0] > scores[1]
    about, rows = explained(s, cycle)
    row = rows["pod-1"]["slo"]
    assert row["tpot_target_from"] == "running" and row["tpot_target_s"] == 0.0205
    assert rows["pod-1"]["step_s"] > 0.0205 and row["tpot_met"] is False
    assert "tpot_target_s" not in rows["pod-0"]["slo"]  # nothing in play there
    assert about["slo"]["driven_by"] == "tpot" and "running request" in about["slo"]["summary"]

    # A tighter target of the request itself binds instead.
    _, cycle = s.score(targeted(tpot=0.019, max_tokens=10), eps)
    _, rows = explained(s, cycle)
    assert rows["pod-1"]["slo"]["tpot_target_from"] == "request"

    s.scorer.response_complete(first, interfaces.RequestOutcome(endpoint=eps[1], status=200, ok=True))
    scores, cycle = s.score(targeted(max_tokens=10), eps)
    assert scores[1] > scores[0]
    about, _ = explained(s, cycle)
    assert "slo" not in about  # released: no target in play


def test_a_running_requests_tpot_counts_the_stall_of_the_newcomers_prefill(clock: Clock) -> None:
    """Joining pod-1 keeps the step time (18 ms) under the running request's 20.5 ms target, but
    the newcomer's cold prefill stalls that stream: spread over what is left of it (half a mean
    output), its time per token goes past the target. Pod-1 misses; idle pod-0 does not."""
    eps = builders.pool(2)
    s = Stack()
    teach(s.scorer.step_model, 0.018, 0.0, 0.0)
    first = request(toks(100, start=700_000), rid="first")
    first.slo_tpot = 0.0205
    s.route(first, [eps[1]])
    clock.now += 10.0  # its prefill drained: it decodes
    long_prompt = toks(8000, start=1)  # 0.8 s of prefill at the prior rate, cached nowhere
    req = request(long_prompt, max_tokens=10)
    scores, cycle = s.score(req, eps)
    _, rows = explained(s, cycle)
    row = rows["pod-1"]["slo"]
    assert rows["pod-1"]["step_s"] < 0.0205  # the step alone would meet it
    assert row["tpot_target_from"] == "running" and row["tpot_met"] is False
    stall = 0.8 / (s.scorer._mean_out / 2.0)  # prefill / half a mean output
    assert row["tpot_predicted_s"] == pytest.approx(rows["pod-1"]["step_s"] + stall, rel=0.05)
    assert scores[0] > scores[1]
    assert slo_targets.verdict(0.1, 0.018, None, None, 0.0205, 0.019).tier == 0
    assert slo_targets.verdict(0.1, 0.018, None, None, 0.0205, 0.021).tier == 1


def test_targets_of_requests_routed_and_released_leave_nothing_behind(clock: Clock) -> None:
    eps = builders.pool(2)
    s = Stack()
    reqs = []
    for i in range(6):
        req = targeted(tpot=0.05 + i * 0.01, rid=f"r{i}")
        s.scorer.score({}, req, eps)  # what pre_request pairs its decision with
        s.scorer.pre_request(req, result(eps[i % 2]))
        reqs.append(req)
    assert sum(sum(c.values()) for c in s.scorer._tpot_targets.values()) == 6
    for req in reqs:
        s.scorer.response_complete(req, interfaces.RequestOutcome(endpoint=eps[0], status=200, ok=True))
    assert s.scorer._tpot_targets == {}


# --- the tiers ---------------------------------------------------------------------------------


def test_tiers_order_and_band_the_scores() -> None:
    v = slo_targets.verdict
    assert v(0.1, 0.01, 0.2, 0.02, None).tier == 0
    assert v(0.1, 0.03, 0.2, 0.02, None).tier == 1  # TPOT missed
    assert v(0.3, 0.01, 0.2, 0.02, None).tier == 1  # TTFT missed
    assert v(0.3, 0.03, 0.2, 0.02, None).tier == 1
    assert v(0.1, 0.03, None, None, 0.02).tier == 1  # a running request's target
    assert v(0.1, 0.015, None, 0.02, 0.01).tpot_target == 0.01  # the tightest binds
    # Every score of the meeting tier outranks every score of the missing one; within a tier,
    # the order is kept.
    banded = slo_targets.tiered([1.0, 0.2, 1e-9, 0.9, 0.5], [1, 0, 0, 1, 1])
    assert banded[1] > banded[2] > banded[0] > banded[3] > banded[4]
    assert all(0.0 < b <= 1.0 for b in banded)
    assert slo_targets.tiered([0.3, 1.0], [1, 1]) == [0.3, 1.0]
