"""MetricsScraper against real aiohttp servers on 127.0.0.1 (intervals of 10 ms keep it fast)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from epp.datastore import pacing, promtext
from epp.datastore import scraper as scraper_mod
from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.datastore.engines import BUILTIN, VLLM
from epp.datastore.scraper import MetricsScraper
from epp.extproc import tls
from epp.observability import metrics
from epp.sim.metrics_page import restrict

from .fake_vllm import FakeVLLM, _page, free_port, until

INTERVAL = 0.01
POOL = "test-pool"


def spec(port: int, *, metrics_port: int | None = None, name: str | None = None) -> EndpointSpec:
    return EndpointSpec(
        name=name or f"127.0.0.1:{port}", address="127.0.0.1", port=port, metrics_port=metrics_port
    )


def sample(name: str, endpoint: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, {"endpoint": endpoint})


def ready() -> float | None:
    return metrics.REGISTRY.get_sample_value("inference_pool_ready_pods", {"name": POOL})


def scrape_tasks() -> list[str]:
    return sorted(t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("scrape "))


@pytest.fixture
async def server() -> AsyncIterator[FakeVLLM]:
    s = await FakeVLLM().start()
    yield s
    await s.stop()


@pytest.fixture
async def server2() -> AsyncIterator[FakeVLLM]:
    s = await FakeVLLM().start()
    yield s
    await s.stop()


def one_endpoint(port: int) -> tuple[Datastore, Endpoint]:
    """A datastore holding one endpoint, the server on `port`."""
    ds = Datastore()
    ds.sync("t", [spec(port)])
    (ep,) = ds.endpoints()
    return ds, ep


def make(ds: Datastore, **kw: float) -> MetricsScraper:
    return MetricsScraper(ds, pool_name=POOL, interval=INTERVAL, **kw)  # type: ignore[arg-type]


async def test_metrics_follow_the_server(server: FakeVLLM) -> None:
    ds, ep = one_endpoint(server.port)
    server.waiting, server.running, server.kv_usage = 2, 5, 0.5
    async with make(ds):
        await until(lambda: (ep.metrics.waiting, ep.metrics.running, ep.metrics.kv_usage) == (2, 5, 0.5))
        first = ep.metrics.updated_at
        assert first > 0 and ep.metrics_age() < 1
        server.waiting, server.kv_usage = 7, 0.75
        await until(lambda: (ep.metrics.waiting, ep.metrics.kv_usage) == (7, 0.75), within=0.5)
        assert ep.metrics.updated_at > first
        await until(lambda: server.requests >= 10, "ten scrapes")
    # One shared keep-alive session: all those scrapes reused a few connections, and asked for
    # an uncompressed page.
    assert len(server.client_ports) <= 3 < server.requests, server.client_ports
    assert all(h.get("Accept-Encoding") == "identity" for h in server.headers)


async def test_an_unchanged_page_is_not_parsed_again(
    server: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[bytes] = []
    real = scraper_mod.promtext.parse

    def counting(data: bytes | str, *rest: Any, **kw: Any) -> Any:
        parsed.append(bytes(data) if isinstance(data, bytes) else data.encode())
        return real(data, *rest, **kw)

    monkeypatch.setattr(scraper_mod.promtext, "parse", counting)
    ds, ep = one_endpoint(server.port)
    server.waiting = 3
    async with make(ds):
        await until(lambda: server.requests >= 10, "ten scrapes")
        assert len(parsed) == 1 and ep.metrics.waiting == 3
        before = ep.metrics.updated_at
        await until(lambda: ep.metrics.updated_at > before, "a fresh scrape time for the same page")
        assert ep.metrics is not None and ep.metrics.waiting == 3
        server.waiting = 4  # a new page is parsed
        await until(lambda: ep.metrics.waiting == 4)
        assert len(parsed) == 2


async def test_latency_totals_are_read_at_most_every_half_second_and_carried_between(
    server: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[tuple[float, bool]] = []
    real = scraper_mod.promtext.parse

    def recording(data: bytes | str, *rest: Any, latency: bool = True) -> Any:
        reads.append((time.monotonic(), latency))
        return real(data, *rest, latency=latency)

    monkeypatch.setattr(scraper_mod.promtext, "parse", recording)
    ds, ep = one_endpoint(server.port)
    async with make(ds):
        await until(lambda: ep.metrics.latency is not None)
        totals = ep.metrics.latency
        for i in range(40):  # a new page every 30 ms: each is parsed
            server.waiting = i % 7
            await asyncio.sleep(0.03)
            assert ep.metrics.latency == totals  # carried over between reads (the page's are fixed)
    with_latency = [t for t, latency in reads if latency]
    assert len(reads) >= 15
    assert len(with_latency) <= 1 + (reads[-1][0] - reads[0][0]) / scraper_mod.LATENCY_READ_S
    # (timed at the parse, after the fetch: the throttle times the scrape's start)
    gaps = [b - a for a, b in itertools.pairwise(with_latency)]
    assert all(gap >= scraper_mod.LATENCY_READ_S - 0.05 for gap in gaps), gaps


async def test_scrapes_metrics_port_when_set(server: FakeVLLM) -> None:
    ds = Datastore()
    ds.sync("t", [spec(free_port(), metrics_port=server.port)])
    (ep,) = ds.endpoints()
    server.running = 3
    async with make(ds):
        await until(lambda: ep.metrics.running == 3)
    assert not ep.excluded


async def test_failures_exclude_then_recovery_readmits(
    server: FakeVLLM, server2: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    ds = Datastore()
    ds.sync("t", [spec(server.port), spec(server2.port)])
    ep, other = ds.endpoints()
    readmitted: list[tuple[str, bool, bool]] = []  # (name, excluded, a candidate) as heard
    ds.subscribe_readmitted(lambda e: readmitted.append((e.name, e.excluded, e in ds.candidates())))
    server.waiting = 4
    caplog.set_level(logging.INFO, logger="epp.datastore.scraper")
    async with make(ds, failure_threshold=3) as sc:
        await until(lambda: ep.metrics.waiting == 4 and other.metrics.updated_at > 0)
        assert ready() == 2
        errors_before = sample("epp_metrics_scrape_errors_total", ep.name) or 0.0

        server.status = 503
        await until(lambda: ep.excluded, "exclusion")
        assert not readmitted
        assert ep.scrape_failures == 3  # excluded exactly at the threshold
        assert ds.candidates() == [other]
        assert ready() == 1
        assert sample("epp_endpoint_excluded", ep.name) == 1
        assert sample("epp_endpoint_excluded", other.name) == 0
        assert ep.metrics.waiting == 4  # the last good metrics are kept
        await until(lambda: ep.scrape_failures >= 6, "more failures")
        assert (sample("epp_metrics_scrape_errors_total", ep.name) or 0) - errors_before >= 6
        assert sc.is_stale(ep, now=ep.metrics.updated_at + 2.5)
        assert not sc.is_stale(ep, now=ep.metrics.updated_at + 1)

        server.status, server.waiting = 200, 1
        await until(lambda: not ep.excluded, "recovery")
        # Heard once, with the endpoint already a candidate again; good scrapes of a routable
        # endpoint are not news.
        assert readmitted == [(ep.name, False, True)]
        assert ep.scrape_failures == 0 and ep.metrics.waiting == 1
        assert set(ds.candidates()) == {ep, other}
        assert ready() == 2
        assert sample("epp_endpoint_excluded", ep.name) == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert ep.name in warnings[0].getMessage() and "HTTP 503" in warnings[0].getMessage()
    recovered = [r for r in caplog.records if "endpoint recovered" in r.getMessage()]
    assert len(recovered) == 1 and recovered[0].levelno == logging.INFO
    assert readmitted == [(ep.name, False, True)]


async def test_connection_refused_excludes_and_a_restarted_server_recovers() -> None:
    port = free_port()
    ds = Datastore()
    ds.sync("t", [spec(port)])
    (ep,) = ds.endpoints()
    async with make(ds):
        await until(lambda: ep.excluded, "exclusion")
        assert ds.routable() == [] and ep.metrics.updated_at == 0
        assert ready() == 0 and ds.degraded  # not ready, yet still routed to (degraded)
        srv = await FakeVLLM().start(port)
        try:
            srv.running = 2
            await until(lambda: not ep.excluded and ep.metrics.running == 2, "recovery")
        finally:
            await srv.stop()


@pytest.mark.parametrize(
    "body",
    [
        b"<html>hello</html>",
        b"\xff\xfe\x00garbage" * 1000,
        b"vllm:num_requests_waiting{broken 1\n",
        b"vllm:num_requests_waiting one\n",
        b"",
    ],
)
async def test_garbage_counts_as_failure_and_never_kills_the_loop(server: FakeVLLM, body: bytes) -> None:
    ds, ep = one_endpoint(server.port)
    server.body = body
    async with make(ds):
        await until(lambda: ep.excluded, "exclusion")
        server.body, server.waiting = None, 9
        await until(lambda: not ep.excluded and ep.metrics.waiting == 9, "recovery")


async def test_oversized_body_is_a_failure(server: FakeVLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scraper_mod, "MAX_BODY_BYTES", 1000)
    ds, ep = one_endpoint(server.port)
    async with make(ds):
        await until(lambda: ep.excluded, "exclusion")
    assert ep.metrics.updated_at == 0


async def test_hung_server_is_excluded_by_staleness_before_the_threshold(
    server: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    ds, ep = one_endpoint(server.port)
    caplog.set_level(logging.WARNING, logger="epp.datastore.scraper")
    async with make(ds, timeout=0.1, failure_threshold=1000, staleness=0.3):
        await until(lambda: ep.metrics.updated_at > 0)
        server.delay = 1.0  # every scrape now times out
        await until(lambda: ep.excluded, "exclusion")
        assert ep.scrape_failures < 1000
        assert ep.metrics_age() > 0.3
    excluded = [r for r in caplog.records if r.name == "epp.datastore.scraper"]
    assert "no answer within 0.1s" in excluded[-1].getMessage()


async def test_an_event_loop_stall_does_not_exclude_a_healthy_server(server: FakeVLLM) -> None:
    """A stall of epp's own loop fires in-flight scrape timeouts late and ages every scrape; neither
    says anything about the server (issue 19: a 2.4 s stall excluded a healthy pod)."""
    ds, ep = one_endpoint(server.port)
    server.delay = 0.03  # a scrape is in flight most of the time
    async with make(ds, timeout=0.2, failure_threshold=1, staleness=0.3):
        await until(lambda: ep.metrics.updated_at > 0)
        errors = sample("epp_metrics_scrape_errors_total", ep.name) or 0.0
        inconclusive = metrics.REGISTRY.get_sample_value("epp_metrics_scrapes_inconclusive_total") or 0.0
        for _ in range(3):
            await asyncio.sleep(0.02)
            time.sleep(1.0)  # noqa: ASYNC251 -- the stall: blocks the loop as a long synchronous step would
            await asyncio.sleep(0)
        # (An exclusion would be undone by the next good scrape: count failures, not the flag.)
        assert (sample("epp_metrics_scrape_errors_total", ep.name) or 0.0) == errors
        assert not ep.excluded and ep.scrape_failures == 0
        assert (
            metrics.REGISTRY.get_sample_value("epp_metrics_scrapes_inconclusive_total") or 0
        ) > inconclusive
        before = ep.metrics.updated_at
        await until(lambda: ep.metrics.updated_at > before, "scrapes go on")


async def test_endpoints_added_and_removed_start_and_stop_loops(server: FakeVLLM, server2: FakeVLLM) -> None:
    ds = Datastore()
    ds.sync("t", [spec(server.port)])
    sc = make(ds)
    await sc.start()
    try:
        name1, name2 = f"127.0.0.1:{server.port}", f"127.0.0.1:{server2.port}"
        assert scrape_tasks() == [f"scrape {name1}"]

        server2.running = 6
        ds.sync("t", [spec(server.port), spec(server2.port)])
        ep2 = ds.get(name2)
        assert ep2 is not None
        await until(lambda: ep2.metrics.running == 6, "new endpoint scraped")
        assert sorted(scrape_tasks()) == sorted([f"scrape {name1}", f"scrape {name2}"])
        assert ready() == 2

        server.status = 500
        ep1 = ds.get(name1)
        assert ep1 is not None
        await until(lambda: ep1.excluded, "exclusion")
        assert sample("epp_endpoint_excluded", name1) == 1

        ds.sync("t", [spec(server2.port)])
        assert sc.scraping() == [ep2]
        await until(lambda: scrape_tasks() == [f"scrape {name2}"], "the removed loop to end")
        assert ready() == 1
        # The removed endpoint's series are gone, not frozen at "excluded".
        assert sample("epp_endpoint_excluded", name1) is None
        assert sample("epp_metrics_scrape_errors_total", name1) is None
        await asyncio.sleep(INTERVAL * 2)  # a request sent just before removal may still land
        requests = server.requests
        await asyncio.sleep(INTERVAL * 5)
        assert server.requests == requests  # nobody polls it any more
    finally:
        await sc.stop()


async def test_readded_name_with_new_address_gets_a_fresh_loop(server: FakeVLLM, server2: FakeVLLM) -> None:
    ds = Datastore()
    ds.sync("t", [spec(server.port, name="vllm-0")])
    async with make(ds):
        server2.waiting = 5
        ds.sync("t", [spec(server2.port, name="vllm-0")])
        ep = ds.get("vllm-0")
        assert ep is not None
        await until(lambda: ep.metrics.waiting == 5)
        await until(lambda: scrape_tasks() == ["scrape vllm-0"], "the old loop to end")
        assert sample("epp_endpoint_excluded", "vllm-0") == 0


async def test_stop_cancels_everything_and_later_syncs_start_nothing(server: FakeVLLM) -> None:
    ds = Datastore()
    ds.sync("t", [spec(server.port), spec(free_port())])
    sc = make(ds)
    await sc.start()
    await until(lambda: server.requests > 0)
    await sc.stop()
    assert scrape_tasks() == []
    assert sc._http is None
    ds.sync("t", [spec(server.port), spec(free_port()), spec(free_port())])
    assert scrape_tasks() == []
    await asyncio.sleep(INTERVAL * 2)  # a request sent just before stop() may still land
    requests = server.requests
    await asyncio.sleep(INTERVAL * 3)
    assert server.requests == requests
    await sc.stop()  # idempotent


async def test_restart_after_stop_reconciles(server: FakeVLLM) -> None:
    ds, ep = one_endpoint(server.port)
    sc = make(ds)
    await sc.start()
    await sc.stop()
    server.running = 11
    await sc.start()
    try:
        await until(lambda: ep.metrics.running == 11)
        assert len(scrape_tasks()) == 1  # one loop, not one per start()
    finally:
        await sc.stop()


async def test_endpoints_scrape_together_in_ticks_of_eight(server: FakeVLLM) -> None:
    """Twenty endpoints on one server: their scrapes fall on three ticks of the 200 ms interval,
    a third of it apart, at most eight on each (`pacing.SCRAPES_PER_TICK`), not twenty wake-ups spread
    at random and not one burst of twenty."""
    ds = Datastore()
    ds.sync("t", [spec(server.port, name=f"ep-{i}") for i in range(20)])
    eps: list[Endpoint] = ds.endpoints()
    sc = MetricsScraper(ds, pool_name=POOL, interval=0.2)
    async with sc:
        await until(lambda: all(e.metrics.updated_at for e in eps), "all scraped once")
    # Each endpoint's phase in the interval: a first scrape that lands a round late keeps its
    # tick's phase (in one CI run 3 of a tick's 6 first scrapes came 200 ms after the other 3).
    t0 = min(e.metrics.updated_at for e in eps)
    phases = sorted(((e.metrics.updated_at - t0 + 0.03) % 0.2) - 0.03 for e in eps)
    ticks: list[list[float]] = []
    for t in phases:
        if ticks and t - ticks[-1][0] < 0.03:
            ticks[-1].append(t)
        else:
            ticks.append([t])
    assert [len(t) for t in ticks] == [7, 7, 6] or sorted(len(t) for t in ticks) == [6, 7, 7], ticks
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(ticks)]
    assert all(abs(g - 0.2 / 3) < 0.03 for g in gaps), gaps


def test_the_grid_groups_endpoints_and_spreads_the_groups() -> None:
    """`Grid.slot`: twenty endpoints make three groups (phases a third of the interval apart), each
    group its own turn; `Grid.at`: the next time of a slot on a pace, the pace taken up to whole
    intervals, the group's turn picking which of them."""
    grid = pacing.Grid(0.05)
    slots = [grid.slot(20) for _ in range(6)]
    third = 0.05 / 3
    assert slots == [(0.0, 0), (third, 1), (2 * third, 2)] * 2
    assert grid.slot(8) == (0.0, 0)  # eight share one tick
    assert grid.at(1.0, (0.01, 3), 0.05) == pytest.approx(1.01)
    assert grid.at(1.0100001, (0.01, 3), 0.05) == pytest.approx(1.01)  # within a microsecond
    assert grid.at(1.011, (0.01, 3), 0.05) == pytest.approx(1.06)
    # Idle, every tenth interval: turn 3 of ten, 0.01 + 3 x 0.05 past each multiple of 0.5.
    assert grid.at(1.0, (0.01, 3), 0.5) == pytest.approx(1.16)
    assert grid.at(1.17, (0.01, 3), 0.5) == pytest.approx(1.66)
    # A backed-off pace of 1.5 intervals is taken as two; turn 3 of two is 1.
    assert grid.at(1.0, (0.01, 3), 0.075) == pytest.approx(1.06)


async def test_a_woken_endpoint_keeps_to_its_tick(server: FakeVLLM) -> None:
    """An idle endpoint woken by a booking is scraped next on its tick, with the others."""
    ds = Datastore()
    ds.sync("t", [spec(server.port, name=f"ep-{i}") for i in range(2)])
    a, b = ds.endpoints()
    interval = 0.1
    async with MetricsScraper(ds, pool_name=POOL, interval=interval, idle_interval=0.5) as sc:
        await until(lambda: a in sc._pauses and b in sc._pauses, "both in an idle pause")
        b_last = b.metrics.updated_at
        before = a.metrics.updated_at
        sc.wake(a)
        await until(lambda: a.metrics.updated_at > before, "the woken endpoint's scrape")
        woken = a.metrics.updated_at
    # Both scrape on one tick (two endpoints: one tick); the woken one's scrape is still a whole
    # number of intervals from the other's, give or take a GET's time.
    offset = (woken - b_last) % interval
    assert min(offset, interval - offset) < interval / 4, (woken, b_last)


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        MetricsScraper(Datastore(), pool_name=POOL, interval=0)
    with pytest.raises(ValueError):
        MetricsScraper(Datastore(), pool_name=POOL, failure_threshold=0)
    assert MetricsScraper(Datastore(), pool_name=POOL).timeout == 1.0
    assert MetricsScraper(Datastore(), pool_name=POOL, interval=0.01).timeout == 0.5


async def test_sync_from_another_thread_is_handed_to_the_loop(server: FakeVLLM) -> None:
    ds = Datastore()
    server.waiting = 8
    async with make(ds):
        await asyncio.to_thread(ds.sync, "thread", [spec(server.port)])
        (ep,) = ds.endpoints()
        await until(lambda: ep.metrics.waiting == 8)
        assert len(scrape_tasks()) == 1


def model_list(**limits: int | None) -> bytes:
    """A /v1/models body as vLLM 0.32 writes it (its cards carry more fields, ignored)."""
    cards = [
        {"id": m, "object": "model", "owned_by": "vllm", "root": "/m", "parent": None, "max_model_len": n}
        for m, n in limits.items()
    ]
    return json.dumps({"object": "list", "data": cards}).encode()


async def test_model_cards_give_each_models_max_model_len(server: FakeVLLM) -> None:
    ds, ep = one_endpoint(server.port)
    cards = json.loads(model_list(tiny=2048, adapter=None, other=None))
    cards["data"][1]["parent"] = "tiny"  # vLLM 0.32 lists a LoRA adapter so: null, with its base
    server.models = json.dumps(cards).encode()
    async with make(ds, models_interval=0.05):
        await until(lambda: ds.max_model_len("tiny") == 2048, "the card read")
        assert ep.model_limits == {"tiny": 2048, "adapter": 2048}  # a card without a length: none
        server.models = model_list(tiny=4096)  # the server was redeployed with a longer context
        await until(lambda: ds.max_model_len("tiny") == 4096, "the periodic re-read")
        assert ds.max_model_len("adapter") is None


async def reread(server: FakeVLLM) -> None:
    seen = server.model_requests
    await until(lambda: server.model_requests > seen, "a re-read of /v1/models", within=10)


async def test_unreadable_model_cards_keep_what_was_known(server: FakeVLLM) -> None:
    ds, ep = one_endpoint(server.port)
    server.models = model_list(tiny=2048)
    async with make(ds, models_interval=0.02):
        await until(lambda: ds.max_model_len("tiny") == 2048, "the card read")
        for bad in (b"not json", b'{"data": 5}', b"[]"):
            server.models = bad
            await reread(server)
            assert ds.max_model_len("tiny") == 2048 and not ep.excluded
        server.models = None  # 404: a server without the page
        await reread(server)
        assert ds.max_model_len("tiny") == 2048
        assert ep.metrics.updated_at > 0  # metrics scrapes went on meanwhile


async def test_cards_are_read_from_the_serving_port_not_the_metrics_port(
    server: FakeVLLM, server2: FakeVLLM
) -> None:
    ds = Datastore()
    ds.sync("t", [spec(server.port, metrics_port=server2.port)])
    server.models = model_list(tiny=1024)
    server2.models = model_list(tiny=9999)
    async with make(ds):
        await until(lambda: ds.max_model_len("tiny") is not None, "the card read")
        assert ds.max_model_len("tiny") == 1024


def _tls_context(tmp_path: Path) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate (what many model servers use)."""
    key, cert = tls.self_signed()
    (tmp_path / "tls.key").write_bytes(key)
    (tmp_path / "tls.crt").write_bytes(cert)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    return context


async def test_gies_metrics_flags_scheme_path_port(tmp_path: Path) -> None:
    """--model-server-metrics-scheme https (GIE's default: certificates not verified),
    --model-server-metrics-path and --model-server-metrics-port, as GIE's EPP reads them."""
    secure = await FakeVLLM().start(ssl_context=_tls_context(tmp_path))
    other = await FakeVLLM().start()
    try:
        secure.waiting, secure.models = 4, model_list(tiny=4096)
        ds = Datastore()
        ds.sync("t", [spec(secure.port)])
        (ep,) = ds.endpoints()
        async with make(ds, scheme="https", insecure_skip_verify=True, path="/prometheus/metrics"):  # type: ignore[arg-type]
            await until(lambda: ep.metrics.waiting == 4 and ds.max_model_len("tiny") == 4096, "https scrapes")
        # Verifying against the system's CAs refuses the self-signed server: failed scrapes.
        ds2 = Datastore()
        ds2.sync("t", [spec(secure.port, name="strict")])
        (strict,) = ds2.endpoints()
        async with make(ds2, scheme="https", insecure_skip_verify=False):  # type: ignore[arg-type]
            await until(lambda: strict.scrape_failures >= 3, "verification failures")
        assert strict.metrics.updated_at == 0
        # A pool-wide metrics port: endpoints without their own metricsPort are scraped there.
        other.waiting = 9
        ds3 = Datastore()
        ds3.sync("t", [spec(free_port(), name="pooled")])
        (pooled,) = ds3.endpoints()
        async with make(ds3, port=other.port):
            await until(lambda: pooled.metrics.waiting == 9, "the pool-wide metrics port")
    finally:
        await secure.stop()
        await other.stop()


# -- the name[]-filtered page (vLLM's /metrics/) ---------------------------------------------------


def _asked(path: str) -> list[str]:
    """The `name[]` values of a requested path, decoded."""
    return urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("name[]", [])


async def test_vllm_is_asked_for_the_series_epp_reads_only(server: FakeVLLM) -> None:
    ds, ep = one_endpoint(server.port)
    server.waiting, server.running, server.kv_usage = 3, 2, 0.25
    async with make(ds):
        await until(lambda: server.requests >= 5, "five scrapes")
    assert all(p.startswith("/metrics/?") for p in server.paths), server.paths[:3]
    assert _asked(server.paths[0]) == list(promtext.series_read())
    whole = _page(3, 2, 0.25)
    restricted = restrict(whole.decode(), set(promtext.series_read())).encode()
    assert len(restricted) < len(whole) // 4
    got = dataclasses.replace(ep.metrics, updated_at=0.0, grace=0.0)  # (grace: the pace's, not the page's)
    assert got == promtext.parse(whole) and got.block_size > 0 and got.latency is not None


async def test_a_server_without_the_filtered_path_is_read_whole(
    server: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    server.filtered = False  # /metrics/ answers 404
    caplog.set_level(logging.INFO, logger="epp.datastore.scraper")
    ds, ep = one_endpoint(server.port)
    server.waiting = 5
    async with make(ds):
        await until(lambda: ep.metrics.waiting == 5 and server.requests >= 5, "scrapes of the whole page")
    assert set(server.paths) == {"/metrics"}  # asked once for /metrics/ (404), never again
    assert ep.scrape_failures == 0 and not ep.excluded
    notes = [r.getMessage() for r in caplog.records if "filtered metrics path" in r.getMessage()]
    assert len(notes) == 1 and "HTTP 404" in notes[0], notes


@pytest.mark.parametrize("body", [b"<html>not metrics</html>", b"process_cpu_seconds_total 1.0\n"])
async def test_a_filtered_page_without_the_series_falls_back_to_the_whole_page(
    server: FakeVLLM, body: bytes
) -> None:
    server.filtered_body = body
    ds, ep = one_endpoint(server.port)
    server.waiting = 6
    async with make(ds):
        await until(lambda: ep.metrics.waiting == 6 and server.requests >= 6, "scrapes of the whole page")
    assert server.paths[0].startswith("/metrics/?") and set(server.paths[1:]) == {"/metrics"}
    assert ep.scrape_failures == 0


async def test_the_filtered_path_is_asked_again_after_the_server_comes_back(server: FakeVLLM) -> None:
    server.filtered = False
    ds, ep = one_endpoint(server.port)
    async with make(ds, failure_threshold=2):
        await until(lambda: server.requests >= 3, "scrapes of the whole page")
        server.status = 503  # down (a restart) ...
        await until(lambda: ep.excluded, "exclusion")
        server.status, server.filtered, server.waiting = 200, True, 7  # ... back, a newer build
        await until(
            lambda: ep.metrics.waiting == 7 and server.paths[-1].startswith("/metrics/?"), "filtered again"
        )


async def test_no_filter_off_the_default_path_or_for_other_engines(server: FakeVLLM) -> None:
    assert scraper_mod.filtered_path("/prometheus/metrics", VLLM) is None
    assert scraper_mod.filtered_path("/metrics", BUILTIN["sglang"]) is None
    ds, ep = one_endpoint(server.port)
    server.waiting = 2
    async with make(ds, path="/prometheus/metrics"):  # type: ignore[arg-type]
        await until(lambda: ep.metrics.waiting == 2 and server.requests >= 3)
    assert set(server.paths) == {"/prometheus/metrics"}
