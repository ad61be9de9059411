"""Learning the pods' decode from their /metrics: `ScrapedLatency`'s growth between scrapes, and
what request-latency-scorer and predicted-ttft-scorer learn from it (each pod's step factor, the
mean decode time), on a virtual clock."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec, LatencyTotals, ModelServerMetrics
from epp.observability import metrics

from . import fleet
from .fleet import Clock, toks
from .fleet import clock as clock  # the fixture
from .test_request_latency_scorer import Stack, request

ZERO = LatencyTotals(0.0, 0.0, 0.0, 0.0)


def scraped(ep: Endpoint, at: float, totals: LatencyTotals, running: int = 0) -> None:
    ep.metrics = ModelServerMetrics(running=running, updated_at=at, latency=totals)


def grown(t: LatencyTotals, **more: float) -> LatencyTotals:
    return dataclasses.replace(t, **{k: getattr(t, k) + v for k, v in more.items()})


def test_growth_comes_once_a_window_and_only_when_the_pod_served_something() -> None:
    from epp.scheduling.plugins.metrics_learning import ScrapedLatency

    ep = Endpoint(spec=EndpointSpec(name="pod", address="10.0.0.1", port=8000), hostport="10.0.0.1:8000")
    s = ScrapedLatency(window=2.0)
    assert s.growth(ep) is None  # never scraped
    scraped(ep, 10.0, ZERO)
    assert s.growth(ep) is None  # the first totals are the baseline
    one = grown(ZERO, tokens=99, token_seconds=2.0, decodes=1, decode_seconds=2.0)
    scraped(ep, 11.0, one)
    assert s.growth(ep) is None  # within the window
    scraped(ep, 12.5, one)
    g = s.growth(ep)
    assert g is not None and (g.seconds, g.tokens, g.token_seconds, g.decodes) == (2.5, 99.0, 2.0, 1.0)
    scraped(ep, 20.0, one)
    assert s.growth(ep) is None  # idle since: nothing to learn
    two = grown(one, tokens=10, token_seconds=0.5)
    scraped(ep, 21.0, two)
    g = s.growth(ep)
    assert g is not None and (g.seconds, g.tokens, g.token_seconds) == (8.5, 10.0, pytest.approx(0.5))
    # A restarted pod's totals start again from 0: a new baseline, never a negative growth.
    scraped(ep, 30.0, grown(ZERO, tokens=5, decodes=1))
    assert s.growth(ep) is None
    scraped(ep, 33.0, grown(ZERO, tokens=9, decodes=2))
    g = s.growth(ep)
    assert g is not None and (g.tokens, g.decodes) == (4.0, 1.0)
    # A page without the histograms (another server, an older vLLM) gives nothing.
    ep.metrics = ModelServerMetrics(updated_at=40.0)
    assert s.growth(ep) is None


def pods(s: Stack, n: int) -> list[Endpoint]:
    """`n` endpoints known to the scorer's datastore (where it reads the pods' metrics)."""
    ds: Datastore = s.handle.datastore
    ds.sync("test", fleet.specs(n))
    return sorted(ds.endpoints(), key=lambda ep: ep.name)


def decode_traffic(s: Stack, eps: list[Endpoint], clock: Clock, tpot: list[Any], steps: int) -> None:
    """Every 0.5 s: a request routed to each pod in turn or one of epp's in flight there released
    (1-30 in flight a pod), and each pod's histograms grown by 50 tokens at `tpot[i](n)` seconds
    a token, `n` being what epp has in flight there, and a request finished in 4 s. No response
    is read."""
    rng = random.Random(2)
    totals = [ZERO] * len(eps)
    flying: list[list[object]] = [[] for _ in eps]
    for step in range(steps):
        clock.now += 0.5
        for i, ep in enumerate(eps):
            load = s.scorer._loads.get(ep.name)
            n = load.n if load is not None else 0  # in flight over the half second just past
            totals[i] = grown(
                totals[i], token_seconds=50 * tpot[i](n), tokens=50, decode_seconds=4.0, decodes=1
            )
            scraped(ep, clock.now, totals[i], running=n)
            if len(flying[i]) < rng.randint(1, 30):
                req = request(toks(64, start=rng.randrange(10**6)), max_tokens=10, rid=f"r{step}-{i}")
                s.precise.score({}, req, [ep])
                s.scorer.score({}, req, [ep])
                s.scorer.pre_request(req, fleet.result(ep))
                flying[i].append(req)
            elif flying[i]:
                s.scorer._release(s.scorer._active.pop(id(flying[i].pop(0))), clock.now)


def test_the_decode_time_is_learned_from_the_pods_metrics_and_the_step_model_is_not(clock: Clock) -> None:
    """No response read: the mean decode time comes from the pods' histograms; the shared step
    model learns from responses only (module docstring of request_latency_scorer)."""
    s = Stack()
    eps = pods(s, 1)
    labels = {"plugin": "lat", "source": "metrics"}
    before = metrics.REGISTRY.get_sample_value("epp_latency_observations_total", labels) or 0.0
    decode_traffic(s, eps, clock, [lambda n: 0.01 + 0.002 * n], steps=600)
    assert s.scorer.decode_seconds == pytest.approx(4.0, rel=0.02)
    assert s.scorer.step_model.seen == 0
    assert s.scorer._speeds == {eps[0].name: 1.0}  # one pod alone has the model to itself
    after = metrics.REGISTRY.get_sample_value("epp_latency_observations_total", labels)
    assert 100 <= after - before <= 300 / 2.0  # at most one per pod per 2 s window


def test_each_pod_gets_its_step_factor_on_the_shared_model(clock: Clock) -> None:
    """Two pods, one decoding 1.6x as fast as the other at any batch (an H100 beside an A100):
    each pod's factor on the shared model says so, and the predictions follow."""
    s = Stack()
    eps = pods(s, 2)
    slow, fast = (lambda n: 0.016 + 0.0016 * n), (lambda n: 0.01 + 0.001 * n)
    decode_traffic(s, eps, clock, [slow, fast], steps=600)
    speeds = s.scorer._speeds
    assert speeds[eps[0].name] / speeds[eps[1].name] == pytest.approx(1.6, rel=0.1)
    assert speeds[eps[0].name] * speeds[eps[1].name] == pytest.approx(1.0)  # geometric mean 1
    _, cycle = s.score(request(toks(64), max_tokens=10), eps)
    steps = [s.scorer.explain(cycle)["endpoints"][ep.name]["step_s"] for ep in eps]
    assert steps[0] / steps[1] == pytest.approx(1.6, rel=0.1)
    # Without the factors: one price for both.
    plain = Stack(podStepFactors=False)
    eps2 = pods(plain, 2)
    decode_traffic(plain, eps2, clock, [slow, fast], steps=600)
    assert plain.scorer._speeds == {}


def test_learn_from_metrics_off_learns_nothing_from_them(clock: Clock) -> None:
    s = Stack(learnFromMetrics=False)
    eps = pods(s, 1)
    decode_traffic(s, eps, clock, [lambda n: 0.01 + 0.002 * n], steps=100)
    assert s.scorer.decode_seconds == 5.0  # the prior
    assert s.scorer._speeds == {}
