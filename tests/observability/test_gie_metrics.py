"""epp's /metrics against GIE's EPP: the same series (name, type, label names, buckets) as GIE's
metrics.go at the tag in `gie_metrics`, and queries (GIE's stock alert rules, GIE's dashboard, the
chart's dashboard) that read only series epp exports.

The exposition is read from epp's real metrics app after real requests went through a Director
(streamed with usage, a model-server error, a refused body) and with a pool and a KV-event source
registered, so every family has samples and its label names can be read off them.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

import aiohttp
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp import clock
from epp.api import errors
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.datastore.model_rewrites import ModelRewrite, ModelRewriteStore, Rule, Target
from epp.flowcontrol import controller as flowcontrol
from epp.observability import collectors, metrics
from epp.observability import http as metrics_http
from epp.requestcontrol.director import Director
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from tests.datastore.fake_vllm import free_port
from tests.observability import gie_metrics
from tests.observability.promql import refs, series_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART_DASHBOARD = ROOT / "deploy" / "helm" / "epp" / "files" / "dashboard.json"
GIE_QUERIES = json.loads(pathlib.Path(__file__).with_name("gie_queries.json").read_text(encoding="utf-8"))

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
"""

# Labels Prometheus adds to every scraped series (kubernetes_sd / Prometheus Operator): a query
# may group by them although epp does not export them.
TARGET_LABELS = {"le", "pod", "namespace", "instance", "job", "container", "service", "endpoint"}


class Family(NamedTuple):
    kind: str
    labels: tuple[str, ...]  # sorted, without le
    buckets: tuple[float, ...]  # histogram bounds without +Inf
    samples: int


def _sse(usage: dict[str, Any]) -> list[bytes]:
    chunk = {"id": "c1", "model": "m", "choices": [{"index": 0, "text": "x", "finish_reason": None}]}
    return [
        f"data: {json.dumps(chunk)}\n\n".encode(),
        f"data: {json.dumps({'id': 'c1', 'model': 'm', 'choices': [], 'usage': usage})}\n\n".encode(),
        b"data: [DONE]\n\n",
    ]


USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 8}}
BODY = msgspec.json.encode({"model": "m", "prompt": "hello", "max_tokens": 5, "stream": True})


def make_director() -> Director:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name="pod-a-rank-0", address="10.0.0.1", port=8000, pod="pod-a")])
    cfg = sched_config.load_config(CONFIG, Handle(datastore=ds))
    rewrites = ModelRewriteStore()
    rewrites.replace(
        [ModelRewrite("alias-m", "2026-01-01T00:00:00Z", (Rule(frozenset({"alias"}), (Target("m-v2"),)),))]
    )
    return Director(datastore=ds, scheduler=cfg.scheduler, rewrites=rewrites)


async def drive(director: Director) -> None:
    """Requests enough for every GIE series epp records (the plugin timer samples 1 cycle in 8)."""
    for _ in range(9):
        ctx = await director.route(path="/v1/completions", headers={}, body=BODY, subset=None)
        ctx.on_response_headers({":status": "200", "content-type": "text/event-stream"}, None)
        for part in _sse(USAGE):
            ctx.on_response_body(part, False)
        ctx.on_response_body(b"", True)
        ctx.finish(complete=True)
    ctx = await director.route(path="/v1/completions", headers={}, body=BODY, subset=None)
    ctx.on_response_headers({":status": "500", "content-type": "application/json"}, None)
    ctx.on_response_body(b'{"error": "boom"}', True)
    ctx.finish(complete=True)
    with pytest.raises(errors.BadRequest):
        await director.route(path="/v1/completions", headers={}, body=b"{not json", subset=None)
    aliased = msgspec.json.encode({"model": "alias", "prompt": "hello", "max_tokens": 5})
    ctx = await director.route(path="/v1/completions", headers={}, body=aliased, subset=None)
    ctx.finish(complete=False)


def pool_source() -> collectors.PoolSnapshot:
    return collectors.PoolSnapshot("pool", [collectors.PodLoad("pod-a-rank-0", 3, 2, 0.5, True)])


def kv_source() -> collectors.KVSnapshot:
    counts = collectors.KVPodCounts(1, 2, 1, 0, 0, {"ok": 1}, {"decode": 1}, 0.5)
    return collectors.KVSnapshot({"pod-a-rank-0": counts}, {"frames": 1}, 3, 2, 0)


@pytest.fixture
def sources() -> Iterator[None]:
    """What a running scraper and KV-event ingester provide (each is tested with the real thing)."""
    collectors.pool_collector.add(pool_source)
    collectors.kv_collector.add(kv_source)
    metrics.ready_endpoints.labels(name="pool").set(1)
    yield
    collectors.pool_collector.discard(pool_source)
    collectors.kv_collector.discard(kv_source)
    metrics.ready_endpoints.remove("pool")


async def scrape() -> str:
    """/metrics as epp's metrics port serves it."""
    port = free_port()
    runner = await metrics_http.start(metrics_http.build_app(), host="127.0.0.1", port=port)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as resp,
        ):
            assert resp.status == 200
            return await resp.text()
    finally:
        await runner.cleanup()


def families(text: str) -> dict[str, Family]:
    """Exposed name (a counter's with _total) -> what the exposition shows of the family."""
    out: dict[str, Family] = {}
    for fam in text_string_to_metric_families(text):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        labels: list[str] = []
        bounds: set[float] = set()
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            labels.extend(k for k in s.labels if k != "le" and k not in labels)
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf":
                bounds.add(float(s.labels["le"]))
        out[name] = Family(fam.type, tuple(sorted(labels)), tuple(sorted(bounds)), len(fam.samples))
    return out


FLOW_CONFIG = CONFIG + "featureGates: [flowControl]\n"


@pytest.fixture
async def exposed(sources: None) -> AsyncIterator[dict[str, Family]]:
    await drive(make_director())
    # Flow control's series: one request held (the pod's metrics were never scraped: stale,
    # saturated), one whose client left while held (a queue duration).
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name="pod-b-rank-0", address="10.0.0.2", port=8000, pod="pod-b")])
    cfg = sched_config.load_config(FLOW_CONFIG, Handle(datastore=ds))
    _, flow, _ = flowcontrol.from_scheduler_config(cfg, ds.candidates, pool_name="pool")
    assert flow is not None
    flow.register_metrics()
    director = Director(datastore=ds, scheduler=cfg.scheduler, flow_control=flow)
    held = asyncio.create_task(director.route(path="/v1/completions", headers={}, body=BODY, subset=None))
    left = asyncio.create_task(director.route(path="/v1/completions", headers={}, body=BODY, subset=None))
    await asyncio.sleep(0.01)
    left.cancel()
    await asyncio.sleep(0.01)
    try:
        yield families(await scrape())
    finally:
        held.cancel()
        flow.close()
        flow.unregister_metrics()
        await asyncio.gather(held, left, return_exceptions=True)


# --- the series ----------------------------------------------------------------------------------


def test_the_transcription_covers_what_gies_guide_documents() -> None:
    names = [s.name for s in gie_metrics.SERIES]
    assert len(names) == len(set(names))
    assert set(gie_metrics.DOCUMENTED) <= set(names)
    assert set(gie_metrics.NOT_EXPORTED) <= set(names)


@pytest.mark.parametrize("series", gie_metrics.SERIES, ids=lambda s: s.name)
async def test_epp_exports_gies_series_as_gie_does(
    series: gie_metrics.Series, exposed: dict[str, Family]
) -> None:
    if series.name in gie_metrics.NOT_EXPORTED:
        # Listed as not exported: it must really be absent, or the table is out of date.
        assert series.name not in exposed
        return
    fam = exposed.get(series.name)
    assert fam is not None, f"{series.name} is not exported"
    assert fam.samples, f"{series.name} has no samples: its labels could not be compared"
    assert fam.kind == series.kind
    assert fam.labels == tuple(sorted(series.labels))  # both expositions sort label names
    assert fam.buckets == tuple(float(b) for b in series.buckets)


async def test_per_request_values(exposed: dict[str, Family]) -> None:
    def value(name: str, **labels: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    before = {
        "routed": value(
            "inference_objective_request_total", model_name="m", target_model_name="m", priority="0"
        ),
        "tokens": value("inference_objective_input_tokens_sum", model_name="m", target_model_name="m"),
        "cached": value(
            "inference_objective_prompt_cached_tokens_sum", model_name="m", target_model_name="m"
        ),
        "server": value(
            "inference_objective_request_error_total",
            model_name="m",
            target_model_name="m",
            error_code="ModelServerError",
        ),
        "bad": value(
            "inference_objective_request_error_total",
            model_name="-",
            target_model_name="-",
            error_code="BadRequest",
        ),
        "success": value(
            "inference_extension_scheduler_attempts_total",
            status="success",
            target_model_name="m",
            pod_name="pod-a",
            namespace="",
            port="8000",
        ),
    }
    for name in (
        "inference_extension_model_rewrite_decisions_total",
        "llm_d_epp_model_rewrite_decisions_total",
    ):
        before[name] = value(name, model_rewrite_name="alias-m", model_name="alias", target_model="m-v2")
    await drive(make_director())
    assert value(
        "inference_objective_request_total", model_name="m", target_model_name="m", priority="0"
    ) == (before["routed"] + 10)
    assert value("inference_objective_input_tokens_sum", model_name="m", target_model_name="m") == (
        before["tokens"] + 9 * 12
    )
    assert value("inference_objective_prompt_cached_tokens_sum", model_name="m", target_model_name="m") == (
        before["cached"] + 9 * 8
    )
    assert (
        value(
            "inference_objective_request_error_total",
            model_name="m",
            target_model_name="m",
            error_code="ModelServerError",
        )
        == before["server"] + 1
    )
    assert (
        value(
            "inference_objective_request_error_total",
            model_name="-",
            target_model_name="-",
            error_code="BadRequest",
        )
        == before["bad"] + 1
    )
    assert (
        value(
            "inference_extension_scheduler_attempts_total",
            status="success",
            target_model_name="m",
            pod_name="pod-a",
            namespace="",
            port="8000",
        )
        == before["success"] + 10
    )
    assert value("inference_objective_running_requests", model_name="m") == 0  # every stream ended
    for name in (
        "inference_extension_model_rewrite_decisions_total",
        "llm_d_epp_model_rewrite_decisions_total",
    ):
        labels = {"model_rewrite_name": "alias-m", "model_name": "alias", "target_model": "m-v2"}
        assert value(name, **labels) == before[name] + 1


async def test_a_stream_runs_until_finished_and_its_pace_is_measured() -> None:
    director = make_director()
    now = [1000.0]
    with clock.use(lambda: now[0]):
        ctx = await director.route(path="/v1/completions", headers={}, body=BODY, subset=None)
        running = metrics.REGISTRY.get_sample_value(
            "inference_objective_running_requests", {"model_name": "m"}
        )
        assert running == 1
        tpot_before = metrics.REGISTRY.get_sample_value(
            "inference_objective_request_tpot_seconds_sum", {"model_name": "m", "target_model_name": "m"}
        )
        ctx.on_response_headers({":status": "200", "content-type": "text/event-stream"}, None)
        now[0] += 0.5  # time to the first token
        chunks = _sse(USAGE)
        ctx.on_response_body(chunks[0], False)
        now[0] += 2.0  # the 4 further tokens: 0.5 s each
        for part in chunks[1:]:
            ctx.on_response_body(part, False)
        ctx.on_response_body(b"", True)
        ctx.finish(complete=True)
    labels = {"model_name": "m", "target_model_name": "m"}
    tpot = metrics.REGISTRY.get_sample_value("inference_objective_request_tpot_seconds_sum", labels)
    assert tpot == pytest.approx((tpot_before or 0.0) + 0.5)
    assert metrics.REGISTRY.get_sample_value("inference_objective_running_requests", {"model_name": "m"}) == 0


async def test_client_chosen_model_names_are_capped() -> None:
    cap = metrics.LabelCap(limit=2)
    assert [cap(v) for v in ("a", "b", "c", "a", "", "d")] == ["a", "b", "other", "a", "-", "other"]
    director = make_director()
    for i in range(metrics.MAX_LABEL_VALUES + 5):
        body = msgspec.json.encode({"model": f"junk-{i}", "prompt": "x"})
        (await director.route(path="/v1/completions", headers={}, body=body, subset=None)).finish(
            complete=True
        )
    samples = [
        s
        for fam in metrics.REGISTRY.collect()
        if fam.name == "inference_objective_request"
        for s in fam.samples
        if s.name.endswith("_total")
    ]
    junk = {s.labels["model_name"] for s in samples if s.labels["model_name"].startswith("junk-")}
    # (model, target) pairs: the tighter cap here, the page budget (each pair: its names and a line)
    pair_cost = 2 * len("junk-10") + metrics.PAIR_LINE_CHARS
    assert 0 < len(junk) <= min(metrics.MAX_LABEL_PAIRS, metrics.PAIR_LABEL_BUDGET // (pair_cost - 2))
    other = [s.value for s in samples if s.labels["model_name"] == s.labels["target_model_name"] == "other"]
    assert other and other[0] >= 5  # the names past the cap are still counted, as "other"


# --- the queries ---------------------------------------------------------------------------------


def _check_queries(queries: list[tuple[str, set[str], set[str]]], exposed: dict[str, Family]) -> list[str]:
    """Problems: a metric epp does not export, or a label none of the query's series has."""
    histograms = {n for n, f in exposed.items() if f.kind == "histogram"}
    problems = []
    for where, names, labels in queries:
        fams = {name: exposed.get(series_name(name, histograms)) for name in sorted(names)}
        absent = [name for name, fam in fams.items() if fam is None]
        problems.extend(f"{where}: {name} is not exported" for name in absent)
        seen = {label for fam in fams.values() if fam is not None for label in fam.labels}
        missing = labels - seen - TARGET_LABELS
        if missing and not absent:
            problems.append(f"{where}: labels {sorted(missing)} on none of {sorted(names)}")
    return problems


def _upstream(path: str) -> list[tuple[str, set[str], set[str]]]:
    (file,) = [f for f in GIE_QUERIES["files"] if f["path"] == path]
    return [(q["where"], set(q["metrics"]), set(q["labels"])) for q in file["queries"]]


def test_the_upstream_queries_are_recorded_with_their_source() -> None:
    assert GIE_QUERIES["source"]["commit"] == gie_metrics.GIE_COMMIT
    assert GIE_QUERIES["source"]["tag"] == gie_metrics.GIE_TAG
    assert [len(_upstream(f["path"])) for f in GIE_QUERIES["files"]] == [4, 55]


async def test_gies_stock_alert_rules_read_only_series_epp_exports(exposed: dict[str, Family]) -> None:
    queries = _upstream("tools/alerts/alert.yaml")
    assert {w for w, _, _ in queries} >= {
        "HighInferencePoolAvgQueueSize",
        "HighInferencePoolAvgKVCacheUtilization",
    }
    assert _check_queries(queries, exposed) == []


def _not_epps(name: str) -> str | None:
    """Why a series GIE's dashboard reads is not expected from epp, or None if it is."""
    if name.startswith("vllm:"):
        return "the model servers' own series"
    if name.startswith("bbr_"):
        return "GIE's body-based router, a separate binary"
    base = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
    return gie_metrics.NOT_EXPORTED.get(base)


async def test_gies_dashboard_reads_only_series_epp_exports_or_others_export(
    exposed: dict[str, Family],
) -> None:
    queries = [
        (where, {n for n in names if _not_epps(n) is None}, labels)
        for where, names, labels in _upstream("tools/dashboards/inference_gateway.json")
    ]
    kept = [q for q in queries if q[1]]
    assert len(kept) >= 15  # the EPP and pool panels are checked, not skipped
    assert _check_queries(kept, exposed) == []


def _chart_queries() -> list[tuple[str, set[str], set[str]]]:
    dashboard = json.loads(CHART_DASHBOARD.read_text(encoding="utf-8"))
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            r = refs(target["expr"])
            out.append((panel["title"], r.metrics, r.labels))
    return out


async def test_the_charts_dashboard_reads_only_series_epp_exports(exposed: dict[str, Family]) -> None:
    queries = _chart_queries()
    assert len(queries) >= 20
    assert _check_queries(queries, exposed) == []


async def test_the_query_check_fails_on_a_missing_series_or_label(exposed: dict[str, Family]) -> None:
    assert _check_queries([("p", {"inference_pool_average_queue_size"}, {"name"})], exposed) == []
    assert (
        _check_queries([("p", {"inference_objective_request_duration_seconds_bucket"}, {"le"})], exposed)
        == []
    )
    assert _check_queries([("p", {"inference_pool_nope"}, set())], exposed) == [
        "p: inference_pool_nope is not exported"
    ]
    assert _check_queries([("p", {"inference_pool_average_queue_size"}, {"status"})], exposed) == [
        "p: labels ['status'] on none of ['inference_pool_average_queue_size']"
    ]
