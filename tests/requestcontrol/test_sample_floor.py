"""The response sample's per-endpoint floor (`response_sample_min_interval`): an endpoint with no
sampled response for that long gets its next request sampled, whatever the ratio, so the rates
learned from sampled responses (predicted-ttft-scorer, request-latency-scorer) keep coming for
every endpoint; the floor's samples count toward the ratio. After `SETTLE_SAMPLES` samples an
endpoint's floor widens to `response_sample_settled_interval`. An endpoint whose page reports its
time to first token needs no floor. Real Director and scheduler, on a virtual clock."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from epp import clock
from epp.datastore.endpoints import Datastore, EndpointSpec, LatencyTotals, ModelServerMetrics
from epp.requestcontrol.director import Director, DirectorSettings
from epp.requestcontrol.sampling import SETTLE_SAMPLES
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle

BODY = msgspec.json.encode({"model": "m", "prompt": "hello"})
PODS = ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def specs() -> list[EndpointSpec]:
    return [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(3)]


def make(ratio: float, interval: float, settled: float | None = None) -> tuple[Director, Datastore]:
    ds = Datastore()
    ds.sync("floor", specs())
    cfg = sched_config.load_config(None, Handle(datastore=ds))
    settings = DirectorSettings(
        response_sample_ratio=ratio,
        response_sample_min_interval=interval,
        response_sample_settled_interval=settled,
    )
    return Director(datastore=ds, scheduler=cfg.scheduler, settings=settings), ds


async def sampled(d: Director, pod: str) -> bool:
    """Route one request to `pod` (the proxy's subset hint), end it, say whether it was sampled."""
    ctx = await d.route(path="/v1/completions", headers={}, body=BODY, subset=[pod])
    assert ctx.booked.hostport == pod
    ctx.finish(complete=True)
    return ctx.sampled


async def test_each_endpoint_is_sampled_once_per_interval_whatever_the_ratio() -> None:
    now = Clock()
    with clock.use(now):
        d, _ = make(0.01, 2.0)
        # The first request of every endpoint is sampled; the ratio alone samples only one.
        assert [await sampled(d, pod) for pod in PODS] == [True, True, True]
        # Within the interval: the ratio's share only (1 in 100 here: none of 30).
        now.t += 1.0
        assert not any([await sampled(d, pod) for pod in PODS * 10])
        # Past the interval since each endpoint's last sample: one more each, then none again.
        now.t += 1.0
        assert [await sampled(d, pod) for pod in PODS] == [True, True, True]
        assert not any([await sampled(d, pod) for pod in PODS * 10])


async def test_the_floors_samples_count_toward_the_ratio() -> None:
    # One endpoint, a request every 0.5 s for 50 s: the floor (2 s) samples every 4th, 25 in all,
    # and the ratio's 1 in 10 never adds its 10 on top.
    now = Clock()
    with clock.use(now):
        d, _ = make(0.1, 2.0)
        picks = []
        for _ in range(100):
            picks.append(await sampled(d, PODS[0]))
            now.t += 0.5
        assert sum(picks) == 25
        assert picks[:8] == [True, False, False, False] * 2


async def test_an_endpoint_past_its_first_samples_is_sampled_at_the_settled_interval() -> None:
    # One request a second to each endpoint, none sampled by the ratio: every 2 s until an
    # endpoint's 32nd sample, then every 20 s; a new endpoint starts at 2 s again.
    now = Clock()
    with clock.use(now):
        d, ds = make(0.0, 2.0, settled=20.0)
        times: list[float] = []
        for _ in range(2 * SETTLE_SAMPLES + 100):
            if await sampled(d, PODS[0]):
                times.append(now.t - 1000.0)
            now.t += 1.0
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps[: SETTLE_SAMPLES - 1] == [2.0] * (SETTLE_SAMPLES - 1)
        assert gaps[SETTLE_SAMPLES - 1 :] == [20.0] * (len(gaps) - SETTLE_SAMPLES + 1)
        assert len(gaps) >= SETTLE_SAMPLES + 4
        # The other endpoints are still learning: sampled on the 2 s floor.
        assert [await sampled(d, PODS[1]) for _ in range(3)] == [True, False, False]
        now.t += 2.0
        assert await sampled(d, PODS[1])
        # Removed and back: a new endpoint, learned from scratch at 2 s.
        ds.sync("floor", [EndpointSpec(name="pod-1", address="10.0.0.2", port=8000)])
        ds.sync("floor", specs())
        assert await sampled(d, PODS[0])
        now.t += 2.0
        assert await sampled(d, PODS[0])


async def test_no_floor_for_an_endpoint_whose_page_reports_its_ttft() -> None:
    # vLLM's latency histograms on pod-0's page (a first token counted): the latency scorers learn
    # its rates from them, so only the ratio samples it; pod-1's page lacks them: floored.
    now = Clock()
    with clock.use(now):
        d, ds = make(0.0, 2.0, settled=20.0)
        pod0 = next(ep for ep in ds.endpoints() if ep.name == "pod-0")
        pod0.metrics = ModelServerMetrics(
            updated_at=now.t, latency=LatencyTotals(0.1, 4.0, 0.2, 1.0, 0.3, 1.0)
        )
        assert [await sampled(d, PODS[0]) for _ in range(3)] == [False] * 3
        assert [await sampled(d, PODS[1]) for _ in range(3)] == [True, False, False]
        now.t += 2.0
        assert not await sampled(d, PODS[0])
        assert await sampled(d, PODS[1])
        # The histograms without a first token counted yet (a pod just started): floored.
        pod0.metrics = ModelServerMetrics(updated_at=now.t, latency=LatencyTotals(0.0, 0.0, 0.0, 0.0))
        assert await sampled(d, PODS[0])


async def test_interval_0_is_the_ratio_alone() -> None:
    now = Clock()
    with clock.use(now):
        d, _ = make(0.01, 0.0)
        assert [await sampled(d, pod) for pod in PODS] == [True, False, False]
        now.t += 3600.0
        assert [await sampled(d, pod) for pod in PODS] == [False, False, False]


async def test_a_removed_endpoint_is_forgotten() -> None:
    now = Clock()
    with clock.use(now):
        d, ds = make(0.0, 2.0)
        assert await sampled(d, PODS[2])
        ds.sync("floor", [EndpointSpec(name="pod-0", address="10.0.0.1", port=8000)])
        assert len(d.sampler._floors) == 0
        # It comes back as a new endpoint: sampled at once, the old mark gone with it.
        ds.sync("floor", specs())
        assert await sampled(d, PODS[2])


def test_a_negative_or_infinite_interval_is_refused() -> None:
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="response_sample_min_interval"):
            DirectorSettings(response_sample_min_interval=bad)
    for bad in (1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="response_sample_settled_interval"):
            DirectorSettings(response_sample_min_interval=2.0, response_sample_settled_interval=bad)
