"""Learning from the pods' /metrics: `ScrapedLatency`'s growth between scrapes, and what
request-latency-scorer and predicted-ttft-scorer learn from it (each pod's step factor, the mean
decode time, each pod's prefill rate through `FirstTokens`), on a virtual clock."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec, LatencyTotals, ModelServerMetrics
from epp.observability import metrics
from epp.scheduling import interfaces
from epp.scheduling.plugins.metrics_learning import FirstTokens, Growth

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


# --- the prefill rate, from the TTFT histogram ----------------------------------------------------


def window(ttft_seconds: float, ttfts: float) -> Growth:
    return Growth(2.0, 0.0, 0.0, 0.0, 0.0, ttft_seconds, ttfts)


def test_a_ttft_window_pairs_with_the_requests_predicted_to_have_had_their_first_token() -> None:
    f = FirstTokens()
    f.routed("a", 1.0, 1000.0, 2, True)
    f.routed("a", 1.5, 3000.0, 4, True)
    f.routed("a", 9.0, 500.0, 0, True)  # not due by the window's end
    assert f.sample("a", window(0.6, 2.0), at=2.0) is None  # no response completed yet: unknown
    f.routed("a", 2.5, 1000.0, 2, True)
    f.routed("a", 2.6, 3000.0, 4, True)
    f.completed("a", taught=False)  # one completed without its TTFT (its body skipped epp)
    got = f.sample("a", window(0.6, 2.0), at=3.0)
    assert got is not None
    assert (got.ttft, got.tokens, got.decodes, got.requests) == (0.3, 2000.0, 3, 2)
    assert f.sample("a", window(0.6, 2.0), at=4.0) is None  # nothing of epp's was due since
    assert f.sample("a", window(0.0, 0.0), at=10.0) is None  # no TTFT histogram on the page
    assert f.sample("a", window(0.6, 2.0), at=11.0) is None  # ...and that request is gone with it
    # Most responses taught their TTFT (GIE's config reads every one): the exact pairs suffice.
    for at in (20.0, 20.1):
        f.routed("a", at, 100.0, 0, True)
    f.completed("a", taught=True)
    f.completed("a", taught=True)
    f.completed("a", taught=False)
    assert f.sample("a", window(0.2, 2.0), at=21.0) is None
    # ...until most teach nothing again (the decision holds through windows with no completion).
    f.completed("a", taught=False)
    f.routed("a", 22.0, 100.0, 0, True)
    assert f.sample("a", window(0.2, 2.0), at=23.0) is not None
    f.routed("a", 24.0, 100.0, 0, True)
    assert f.sample("a", window(0.2, 2.0), at=25.0) is not None
    # Mostly KV-block waits or remote prefills: not the prefill rate.
    f.routed("a", 30.0, 100.0, 0, True)
    f.routed("a", 30.1, 100.0, 0, False)
    assert f.sample("a", window(0.2, 2.0), at=31.0) is None
    f.forget("a")
    f.routed("a", 40.0, 100.0, 0, True)
    assert f.sample("a", window(0.2, 1.0), at=41.0) is None  # forgotten: unknown again


def prefill_traffic(s: Stack, eps: list[Endpoint], clock: Clock, rates: list[float], read: bool) -> None:
    """Every 0.5 s a 200-800-token prompt never seen to each pod; its first token comes 10 ms plus
    its prefill at the pod's rate later, and the pod's TTFT histogram grows then (scraped every
    0.1 s). `read`: every response is read through epp (GIE's config), else none is (epp's own
    config at a ratio of 0)."""
    rng = random.Random(5)
    totals = [ZERO for _ in eps]
    coming: list[tuple[float, int, float, Any]] = []  # first token at, pod, its TTFT, request
    for step in range(2400):
        clock.now += 0.1
        for first, i, ttft, req in [c for c in coming if c[0] <= clock.now]:
            coming.remove((first, i, ttft, req))
            totals[i] = grown(
                totals[i],
                ttft_seconds=ttft,
                ttfts=1,
                tokens=9,
                token_seconds=0.2,
                decodes=1,
                decode_seconds=0.2,
            )
            # Its response completes (at once: its decode does not matter here), read through
            # epp or skipped (then no TTFT, no usage).
            outcome = interfaces.RequestOutcome(
                endpoint=eps[i],
                status=200,
                ok=True,
                prompt_tokens=len(req.token_ids) if read else None,
                cached_tokens=0 if read else None,
                ttft_s=ttft if read else None,
            )
            s.scorer.response_complete(req, outcome)
        for i, ep in enumerate(eps):
            scraped(ep, clock.now, totals[i])
            if step % 5 == 0:
                n = rng.randint(200, 800)
                req = request(toks(n, start=rng.randrange(10**9)), max_tokens=10, rid=f"r{step}-{i}")
                s.precise.score({}, req, [ep])
                s.scorer.score({}, req, [ep])
                s.scorer.pre_request(req, fleet.result(ep))
                ttft = 0.01 + n / rates[i]
                coming.append((clock.now + ttft, i, ttft, req))


def test_each_pods_prefill_rate_is_learned_from_its_ttft_histogram(clock: Clock) -> None:
    """No response read (behind epp's own gateway config, nearly every request): two pods whose
    prefill runs at 2,000 and 8,000 tokens/s, against the prior's 10,000."""
    s = Stack()
    eps = pods(s, 2)
    prefill_traffic(s, eps, clock, [2000.0, 8000.0], read=False)
    assert s.scorer.prefill_tokens_per_second(eps[0].name) == pytest.approx(2000.0, rel=0.15)
    assert s.scorer.prefill_tokens_per_second(eps[1].name) == pytest.approx(8000.0, rel=0.15)
    # Without metrics learning: the prior, which nothing corrects.
    plain = Stack(learnFromMetrics=False)
    eps2 = pods(plain, 2)
    prefill_traffic(plain, eps2, clock, [2000.0, 8000.0], read=False)
    assert plain.scorer.prefill_tokens_per_second(eps2[0].name) == pytest.approx(10000.0)


def test_where_every_response_is_read_the_ttft_histogram_adds_nothing(clock: Clock) -> None:
    s = Stack()
    eps = pods(s, 1)
    prefill_traffic(s, eps, clock, [2000.0], read=True)
    assert s.scorer.prefill_tokens_per_second(eps[0].name) == pytest.approx(2000.0, rel=0.1)
    # One observation per response, none from the windows.
    assert s.scorer._rates[eps[0].name].seen == 480
