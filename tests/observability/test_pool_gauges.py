"""GIE's pool gauges follow what the scraper reads from real (fake-vLLM) model servers over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.datastore.scraper import MetricsScraper
from epp.observability import metrics
from tests.datastore.fake_vllm import FakeVLLM

POOL = "gauge-pool"


def gauge(name: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, {"name": POOL, **labels})


async def until(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


@pytest.fixture
async def servers() -> AsyncIterator[tuple[FakeVLLM, FakeVLLM]]:
    a, b = await FakeVLLM().start(), await FakeVLLM().start()
    yield a, b
    await a.stop()
    await b.stop()


async def test_pool_gauges_follow_the_scraped_metrics(servers: tuple[FakeVLLM, FakeVLLM]) -> None:
    a, b = servers
    a.waiting, a.running, a.kv_usage = 4, 2, 0.5
    b.waiting, b.running, b.kv_usage = 0, 6, 0.1
    ds = Datastore()
    ds.sync(
        "t", [EndpointSpec(name=f"s{i}", address="127.0.0.1", port=s.port) for i, s in enumerate(servers)]
    )
    scraper = MetricsScraper(ds, pool_name=POOL, interval=0.01, failure_threshold=2, staleness=0.5)
    async with scraper:
        await until(lambda: gauge("inference_pool_average_queue_size") == 2.0)
        assert gauge("inference_pool_average_kv_cache_utilization") == pytest.approx(0.3)
        assert gauge("inference_pool_average_running_requests") == 4.0
        assert gauge("inference_pool_per_pod_queue_size", model_server_pod="s0") == 4
        assert gauge("inference_pool_per_pod_queue_size", model_server_pod="s1") == 0
        assert gauge("inference_pool_ready_pods") == 2

        b.waiting, b.kv_usage = 10, 0.9  # the gauges move with the servers
        await until(lambda: gauge("inference_pool_average_queue_size") == 7.0)
        assert gauge("inference_pool_average_kv_cache_utilization") == pytest.approx(0.7)

        a.status = 500  # a failing server is excluded: the averages describe the one left
        await until(lambda: gauge("inference_pool_ready_pods") == 1)
        assert gauge("inference_pool_average_queue_size") == 10.0
        assert gauge("inference_pool_average_kv_cache_utilization") == pytest.approx(0.9)
        assert gauge("inference_pool_per_pod_queue_size", model_server_pod="s0") == 4  # last known, as GIE

        b.status = 500  # none routable: no average at all rather than a stale one
        await until(lambda: gauge("inference_pool_ready_pods") == 0)
        assert gauge("inference_pool_average_queue_size") is None

        ds.sync("t", [EndpointSpec(name="s1", address="127.0.0.1", port=b.port)])
        assert gauge("inference_pool_per_pod_queue_size", model_server_pod="s0") is None  # gone with it
        assert gauge("inference_pool_per_pod_queue_size", model_server_pod="s1") == 10
    assert gauge("inference_pool_per_pod_queue_size", model_server_pod="s1") is None  # stopped: no source
