"""epp.workers.shared_metrics: the supervisor scrapes, the workers follow (in one process here,
the control socket replaced by lists of messages)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.datastore.scraper import MetricsScraper
from epp.observability import metrics
from epp.scheduling.plugins.utilization_detector import UtilizationDetector
from epp.units import parse_duration
from epp.workers.shared_metrics import HEARTBEAT_S, MetricsFollower, MetricsHub, endpoint_list
from tests.datastore.fake_vllm import FakeVLLM, until

POOL = "shared-test"


def hub_for() -> MetricsHub:
    def factory(ds: Datastore, on_update: Any) -> MetricsScraper:
        return MetricsScraper(ds, pool_name=POOL, interval=0.01, failure_threshold=2, on_update=on_update)

    return MetricsHub(factory, heartbeat=0.02)


def wire(message: dict[str, Any]) -> dict[str, Any]:
    """As the control socket carries it: a JSON line."""
    out: dict[str, Any] = json.loads(json.dumps(message))
    return out


class Worker:
    """A worker's datastore and follower; `sent` is what it told the supervisor."""

    def __init__(self, specs: list[EndpointSpec]) -> None:
        self.datastore = Datastore()
        self.datastore.sync("file", specs)
        self.sent: list[dict[str, Any]] = []
        self.follower = MetricsFollower(self.datastore, POOL, lambda m: self.sent.append(wire(m)))

    def ep(self, name: str) -> Endpoint:
        ep = self.datastore.get(name)
        assert ep is not None
        return ep


@pytest.fixture
async def servers() -> AsyncIterator[list[FakeVLLM]]:
    started = [await FakeVLLM().start() for _ in range(2)]
    yield started
    for s in started:
        await s.stop()


def listing(s: EndpointSpec) -> list[Any]:
    return [s.name, s.address, s.port, None, "", 0, "", None, None, {}]


def specs_of(servers: list[FakeVLLM]) -> list[EndpointSpec]:
    return [EndpointSpec(name=f"pod-{i}", address="127.0.0.1", port=s.port) for i, s in enumerate(servers)]


async def test_workers_follow_the_supervisors_scrapes(servers: list[FakeVLLM]) -> None:
    hub = hub_for()
    broadcast: list[dict[str, Any]] = []
    workers = [Worker(specs_of(servers)), Worker(specs_of(servers))]
    await hub.start(lambda m: broadcast.append(wire(m)))
    try:
        for i, w in enumerate(workers):
            await w.follower.start()
            assert w.sent == [{"endpoints": [listing(s) for s in specs_of(servers)]}]
            for m in hub.listed(i, w.sent[0]["endpoints"]):
                w.follower.apply(wire(m))
        assert sorted(ep.name for ep in hub.datastore.endpoints()) == ["pod-0", "pod-1"]

        servers[0].waiting = 7
        servers[1].kv_usage = 0.5

        def deliver() -> None:
            for m in broadcast:
                for w in workers:
                    w.follower.apply(m)
            broadcast.clear()

        async def applied() -> bool:
            deliver()
            return all(
                w.ep("pod-0").metrics.waiting == 7 and w.ep("pod-1").metrics.kv_usage == 0.5 for w in workers
            )

        for _ in range(400):
            if await applied():
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("the workers never saw the scrapes")
        # Exactly what the supervisor's own endpoints hold (the scrape time: see the heartbeat).
        own = hub.datastore.get("pod-0")
        assert own is not None
        for w in workers:
            # (grace is the supervisor's pacing of its own scrapes; the heartbeat stands for it)
            assert dataclasses.replace(w.ep("pod-0").metrics, updated_at=0, grace=0) == dataclasses.replace(
                own.metrics, updated_at=0, grace=0
            )
            assert w.ep("pod-0").metrics.latency is not None  # vLLM's latency totals travel too

        # An unchanged page sends nothing but the heartbeat, which keeps the workers' copies fresh.
        deliver()
        await asyncio.sleep(0.1)
        kinds = {k for m in broadcast for k in m}
        assert "metrics" not in kinds and "fresh" in kinds
        before = workers[0].ep("pod-1").metrics.updated_at
        deliver()
        assert workers[0].ep("pod-1").metrics.updated_at > before

        # A failing server is excluded by the supervisor, and so in every worker.
        servers[1].status = 503
        await until(
            lambda: (deliver(), workers[1].ep("pod-1").excluded)[1], within=5, what="exclusion followed"
        )
        assert [ep.name for ep in workers[0].datastore.routable()] == ["pod-0"]
        assert metrics.REGISTRY.get_sample_value("inference_pool_ready_pods", {"name": POOL}) == 1
        servers[1].status = 200
        await until(lambda: (deliver(), not workers[1].ep("pod-1").excluded)[1], within=5, what="recovery")
    finally:
        await hub.stop()
        for w in workers:
            await w.follower.stop()


async def test_a_restarted_worker_gets_everything_and_lists_are_merged(servers: list[FakeVLLM]) -> None:
    hub = hub_for()
    await hub.start(lambda m: None)
    try:
        specs = specs_of(servers)
        hub.listed(0, [listing(s) for s in specs[:1]])
        hub.listed(1, [listing(s) for s in specs])
        assert sorted(ep.name for ep in hub.datastore.endpoints()) == ["pod-0", "pod-1"]  # the union
        servers[0].waiting = 3
        await until(lambda: hub.datastore.get("pod-0").metrics.waiting == 3, within=5)  # type: ignore[union-attr]
        late = Worker(specs)
        for m in hub.listed(2, [listing(s) for s in specs]):
            late.follower.apply(wire(m))
        assert late.ep("pod-0").metrics.waiting == 3
        hub.gone(1)
        hub.gone(2)
        assert [ep.name for ep in hub.datastore.endpoints()] == ["pod-0"]
    finally:
        await hub.stop()


def test_model_limits_are_passed_on() -> None:
    w = Worker([EndpointSpec(name="pod-0", address="127.0.0.1", port=1)])
    w.follower.apply({"limits": [["pod-0", {"tiny": 4096}]], "metrics": [["unknown", *range(12)]]})
    assert w.ep("pod-0").model_limits == {"tiny": 4096}
    assert w.datastore.max_model_len("tiny") == 4096


def test_the_engine_type_label_reaches_the_supervisors_scrape() -> None:
    datastore = Datastore()
    labels = {"llm-d.ai/engine-type": "sglang", "app": "x", "inference.networking.k8s.io/engine-type": "vllm"}
    datastore.sync("file", [EndpointSpec(name="s", address="127.0.0.1", port=1, labels=labels)])
    listed = wire({"endpoints": endpoint_list(datastore)})["endpoints"]
    del labels["app"]  # only the labels that choose the metric names travel
    assert listed[0][9] == labels
    hub = hub_for()
    hub.listed(0, listed)
    ep = hub.datastore.get("s")
    assert ep is not None and dict(ep.spec.labels) == labels
    assert hub.scraper._engines.for_labels(ep.spec.labels).name == "sglang"


async def test_a_workers_booking_wakes_the_supervisors_idle_scrape(servers: list[FakeVLLM]) -> None:
    def factory(ds: Datastore, on_update: Any) -> MetricsScraper:
        return MetricsScraper(ds, pool_name=POOL, interval=0.02, idle_interval=5.0, on_update=on_update)

    hub = MetricsHub(factory, heartbeat=0.02)
    worker = Worker(specs_of(servers[:1]))
    await hub.start(lambda m: None)
    try:
        await worker.follower.start()
        for m in hub.listed(0, worker.sent[0]["endpoints"]):
            worker.follower.apply(wire(m))
        own = hub.datastore.get("pod-0")
        assert own is not None
        await until(lambda: own.metrics.updated_at > 0)
        worker.ep("pod-0").metrics = dataclasses.replace(own.metrics)
        await asyncio.sleep(0.1)  # the supervisor's loop is in its idle pause (5 s)
        before = servers[0].requests

        worker.sent.clear()
        worker.ep("pod-0").book(10)
        worker.ep("pod-0").book(10)  # once per heartbeat, batched per turn of the loop
        await asyncio.sleep(0)
        assert worker.sent == [{"booked": ["pod-0"]}]
        hub.booked(worker.sent[0]["booked"])
        await until(lambda: servers[0].requests > before, within=1.0, what="a scrape after the booking")

        worker.ep("pod-0").book(10)
        await asyncio.sleep(0)
        assert len(worker.sent) == 1  # not again before the next heartbeat
        worker.follower.apply({"fresh": 1.0, "failing": []})
        worker.ep("pod-0").metrics.running = 2  # busy by the last scrape: nothing to wake
        worker.ep("pod-0").book(10)
        await asyncio.sleep(0)
        assert len(worker.sent) == 1
        hub.booked(["no-such-pod", 3])  # a stale or odd name is ignored
        hub.booked("pod-0")
    finally:
        await hub.stop()
        await worker.follower.stop()


def test_the_heartbeat_keeps_an_idle_pool_fresh_for_the_default_detector() -> None:
    """Between two beats a worker's idle endpoints age by a beat: at 250 ms the default
    utilization-detector (200 ms) read the whole idle pool as saturated for part of every beat."""
    staleness = parse_duration(UtilizationDetector.Params().metricsStalenessThreshold)
    assert staleness / 1.5 > HEARTBEAT_S
