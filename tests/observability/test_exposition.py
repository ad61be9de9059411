"""/metrics written without holding the event loop for the whole page (epp.observability.exposition)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from epp.observability import exposition, http, metrics


class _State:
    """A custom collector reading state the loop owns, as epp's pool and KV collectors do."""

    def __init__(self) -> None:
        self.pods = {"a": 1.0, "b": 2.0}

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("test_pod_load", "load per pod", labels=["pod"])
        for pod, load in sorted(self.pods.items()):
            family.add_metric([pod], load)
        return [family]


def _registry(families: int, children: int) -> CollectorRegistry:
    reg = CollectorRegistry()
    for i in range(families):
        h = Histogram(f"test_latency_{i}_seconds", "latency", ["model", "target"], registry=reg)
        c = Counter(f"test_requests_{i}", "requests", ["model"], registry=reg)
        for j in range(children):
            h.labels(f"m{j}", f"t{j}").observe(0.01 * j)
            c.labels(f'm{j} "quoted"\n').inc(j)
    Gauge("test_up", "up", registry=reg).set(1)
    reg.register(_State())
    return reg


def test_the_page_is_byte_for_byte_what_generate_latest_writes() -> None:
    reg = _registry(families=5, children=7)
    assert asyncio.run(exposition.render(reg)) == generate_latest(reg)


def test_the_loop_keeps_running_while_a_large_page_is_written() -> None:
    # generate_latest in the handler held the loop for the whole page: no other callback ran.
    reg = _registry(families=120, children=24)  # ~9,000 lines, ~1 MB: the label caps' size

    async def run() -> tuple[int, float, float]:
        ticks = 0
        longest = 0.0
        stop = False

        async def ticker() -> None:
            nonlocal ticks, longest
            last = time.perf_counter()
            while not stop:
                await asyncio.sleep(0)
                now = time.perf_counter()
                longest = max(longest, now - last)
                last = now
                ticks += 1

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ticks = 0
        started = time.perf_counter()
        page = await exposition.render(reg)
        took = time.perf_counter() - started
        stop = True
        await task
        assert page == generate_latest(reg)
        return ticks, longest, took

    ticks, longest, took = asyncio.run(run())
    assert ticks >= 20, (ticks, took)
    assert longest < took / 3, (longest, took)


def test_metrics_port_serves_the_registry() -> None:
    async def run() -> tuple[int, bytes, bytes]:
        client = TestClient(TestServer(http.build_app()))
        await client.start_server()
        try:
            response = await client.get("/metrics")
            body = await response.read()
            return response.status, body, generate_latest(metrics.REGISTRY)
        finally:
            await client.close()

    status, body, direct = asyncio.run(run())
    assert status == 200
    names = {
        line.split("{")[0].split(" ")[0] for line in body.decode().splitlines() if not line.startswith("#")
    }
    assert names == {
        line.split("{")[0].split(" ")[0] for line in direct.decode().splitlines() if not line.startswith("#")
    }
