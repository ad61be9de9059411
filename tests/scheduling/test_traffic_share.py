"""traffic_share: a scheduler's learned share of the fleet's requests (own bookings against the
pods' scraped finished-request counters), and predicted-ttft-scorer booking its prefill 1/share
times."""

from __future__ import annotations

from typing import Any

import pytest

from epp.datastore import promtext
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import traffic_share
from epp.scheduling.plugins.traffic_share import TrafficShare

from .test_predicted_ttft_scorer import Clock, _result, request, toks
from .test_predicted_ttft_scorer import clock as clock  # the fixture


class Fleet:
    """Pods whose `vllm:request_success_total` the test advances, in a real Datastore."""

    def __init__(self, pods: int = 4) -> None:
        self.store = Datastore()
        self.store.sync(
            "t", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i}", port=8000) for i in range(pods)]
        )
        self.eps = self.store.endpoints()
        for ep in self.eps:
            ep.metrics.requests_total = 0.0

    def finish(self, n: int) -> None:
        """`n` more requests finished, spread over the pods in turn."""
        for i in range(n):
            m = self.eps[i % len(self.eps)].metrics
            if m.requests_total is not None:  # else the pod exports no counter
                m.requests_total += 1.0


def drive(
    share: TrafficShare, fleet: Fleet, *, own: int, fleet_per_own: float, seconds: int, t0: float = 0.0
) -> float:
    """`seconds` of steady traffic: each second this scheduler books `own` requests and the pods
    finish `own * fleet_per_own`. Returns the time reached."""
    t = t0
    for _ in range(seconds):
        fleet.finish(round(own * fleet_per_own))
        for k in range(own):
            share.book(t + k / own)
        t += 1.0
    return t


def test_alone_the_share_is_one() -> None:
    fleet = Fleet()
    share = TrafficShare(fleet.store.endpoints)
    drive(share, fleet, own=5, fleet_per_own=1.0, seconds=120)
    assert share.scale == pytest.approx(1.0)
    assert share.explain()["source"] == "learned" and share.explain()["share"] == pytest.approx(1.0)


def test_a_quarter_of_the_fleets_traffic_books_four_times() -> None:
    fleet = Fleet()
    share = TrafficShare(fleet.store.endpoints)
    drive(share, fleet, own=5, fleet_per_own=4.0, seconds=120)
    assert share.scale == pytest.approx(4.0, rel=0.02)
    facts = share.explain()
    assert facts["share"] == pytest.approx(0.25, rel=0.02)
    assert facts["fleet_requests_per_s"] / facts["own_requests_per_s"] == pytest.approx(4.0, rel=0.02)


def test_the_scale_follows_a_change_within_tens_of_seconds() -> None:
    fleet = Fleet()
    share = TrafficShare(fleet.store.endpoints)
    t = drive(share, fleet, own=5, fleet_per_own=1.0, seconds=60)
    t = drive(share, fleet, own=5, fleet_per_own=2.0, seconds=10, t0=t)  # another replica joins
    assert 1.0 < share.scale < 1.5  # smoothed: ten seconds move it part of the way
    drive(share, fleet, own=5, fleet_per_own=2.0, seconds=120, t0=t)
    assert share.scale == pytest.approx(2.0, rel=0.02)


def test_one_until_there_is_evidence() -> None:
    fleet = Fleet()
    share = TrafficShare(fleet.store.endpoints)
    drive(share, fleet, own=1, fleet_per_own=4.0, seconds=10)  # ten own requests: too few
    assert share.scale == 1.0 and share.explain()["source"] == "default"
    # Pods that export no counter (not vLLM): never any evidence.
    for ep in fleet.eps:
        ep.metrics.requests_total = None
    bare = TrafficShare(fleet.store.endpoints)
    drive(bare, fleet, own=5, fleet_per_own=4.0, seconds=60)
    assert bare.scale == 1.0 and bare.explain()["source"] == "default"


def test_counter_resets_and_new_pods_count_nothing() -> None:
    fleet = Fleet()
    share = TrafficShare(fleet.store.endpoints)
    t = drive(share, fleet, own=5, fleet_per_own=4.0, seconds=60)
    before = share.scale
    # pod-0 restarts (its counter back near 0) and a new pod appears with a large counter.
    fleet.eps[0].metrics.requests_total = 3.0
    fleet.store.sync(
        "t", [ep.spec for ep in fleet.eps] + [EndpointSpec(name="pod-9", address="10.0.0.9", port=8000)]
    )
    new = next(ep for ep in fleet.store.endpoints() if ep.name == "pod-9")
    new.metrics.requests_total = 1e6
    fleet.eps = fleet.store.endpoints()
    t = drive(share, fleet, own=5, fleet_per_own=4.0, seconds=1, t0=t)
    assert share.scale == pytest.approx(before, rel=0.1)  # not 1e6 requests in one second
    drive(share, fleet, own=5, fleet_per_own=4.0, seconds=60, t0=t)
    assert share.scale == pytest.approx(4.0, rel=0.02)


def test_the_scale_is_clamped_to_one_and_the_maximum() -> None:
    fleet = Fleet()
    share = TrafficShare(fleet.store.endpoints)
    drive(share, fleet, own=5, fleet_per_own=0.2, seconds=120)  # counters lag or undercount
    assert share.scale == 1.0
    huge = TrafficShare(fleet.store.endpoints)
    drive(huge, fleet, own=2, fleet_per_own=500.0, seconds=120)
    assert huge.scale == traffic_share.MAX_SCALE


def test_a_pinned_share_is_not_learned() -> None:
    fleet = Fleet()
    share = TrafficShare(fleet.store.endpoints, pinned=0.5)
    drive(share, fleet, own=5, fleet_per_own=4.0, seconds=60)
    assert share.scale == 2.0 and share.explain() == {"booking_scale": 2.0, "share": 0.5, "source": "pinned"}
    for bad in (0.0, 1.5, 1 / 65, float("nan")):
        with pytest.raises(ValueError, match="traffic share must be in"):
            TrafficShare(fleet.store.endpoints, pinned=bad)


# --- in predicted-ttft-scorer -------------------------------------------------------------------


def _scorer(store: Datastore, **params: object) -> Any:
    handle = interfaces.Handle(datastore=store, kv_index=None)
    return registry.default.build("predicted-ttft-scorer", "ttft", dict(params), handle)


def test_the_scorer_books_its_prefill_one_over_share_times(clock: Clock) -> None:
    fleet = Fleet(pods=2)
    scorer = _scorer(fleet.store, prefixScorer="none", trafficShare="auto")
    eps = fleet.eps

    def queue_after_booking(rid: str) -> float:
        req = request(toks(1000, start=7), rid=rid)
        scorer.score({}, req, [eps[1]])
        scorer.pre_request(req, _result(eps[1]))
        cycle: dict[str, Any] = {}
        scorer.score(cycle, request(toks(10, start=99), rid="probe"), [eps[1]])
        return float(cycle["ttft"].predictions["pod-1"][2])

    # Alone: 1000 uncached tokens at the 1e-4 s prior = 0.1 s of queue.
    assert queue_after_booking("a") == pytest.approx(0.1)
    # Then 60 s in which the pods finish four times what this scheduler routes: a quarter share.
    for _ in range(60):
        clock.now += 1.0
        fleet.finish(20)
        for k in range(5):
            req = request(toks(10, start=1000 * k), rid=f"x{k}")
            scorer.score({}, req, [eps[0]])
            scorer.pre_request(req, _result(eps[0]))
    clock.now += 1.0
    assert queue_after_booking("b") == pytest.approx(0.4, rel=0.05)
    cycle: dict[str, Any] = {}
    req = request(toks(10, start=5), rid="e")
    scorer.score(cycle, req, [eps[1]])
    facts = scorer.explain(cycle)["request"]["traffic_share"]
    assert facts["source"] == "learned" and facts["booking_scale"] == pytest.approx(4.0, rel=0.05)


def test_the_scorer_takes_a_pinned_share_and_refuses_a_bad_one(clock: Clock) -> None:
    fleet = Fleet(pods=1)
    scorer = _scorer(fleet.store, prefixScorer="none", trafficShare=0.25)
    req = request(toks(1000, start=7))
    scorer.score({}, req, fleet.eps)
    scorer.pre_request(req, _result(fleet.eps[0]))
    cycle: dict[str, Any] = {}
    scorer.score(cycle, request(toks(10, start=99), rid="p"), fleet.eps)
    assert cycle["ttft"].predictions["pod-0"][2] == pytest.approx(0.4)
    for bad in (2.0, 0.0, "half"):
        with pytest.raises(registry.ConfigError, match="trafficShare"):
            _scorer(fleet.store, trafficShare=bad)


def test_the_scraper_reads_the_finished_request_counter_summed() -> None:
    page = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0"} 1.0\n'
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{engine="0",finished_reason="length"} 7.0\n'
        'vllm:request_success_total{engine="0",finished_reason="stop"} 5.0\n'
        'vllm:request_success_total{engine="0",finished_reason="abort"} NaN\n'
    )
    assert promtext.parse(page).requests_total == 12.0
    assert promtext.parse("vllm:num_requests_waiting 1.0\n").requests_total is None
