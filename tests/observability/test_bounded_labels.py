"""Label sets a client or a pod can grow are bounded (issue 19: 60k distinct target_model_name
values gave +121 MB, an 18 MB /metrics page and a 1.6 s loop stall per scrape)."""

from __future__ import annotations

import time

import msgspec
import pytest
from prometheus_client import generate_latest

from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.datastore.scraper import MetricsScraper
from epp.observability import metrics
from epp.requestcontrol.director import Director, DirectorSettings
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
"""


def make_director(*names: str) -> tuple[Director, Datastore]:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name=n, address=f"10.9.0.{i}", port=8000) for i, n in enumerate(names, 1)])
    for ep in ds.endpoints():
        ep.metrics.updated_at = time.monotonic()
    cfg = sched_config.load_config(CONFIG, Handle(datastore=ds))
    # The rewrite header is honoured only when trusted (opt-in): the target names below need it.
    settings = DirectorSettings(trust_model_rewrite_header=True)
    return Director(datastore=ds, scheduler=cfg.scheduler, settings=settings), ds


async def route(director: Director, model: str, target: str | None = None) -> str:
    headers = {"x-gateway-model-name-rewrite": target} if target is not None else {}
    body = msgspec.json.encode({"model": model, "prompt": "hi"})
    ctx = await director.route(path="/v1/completions", headers=headers, body=body, subset=None)
    director.finish(ctx, complete=True)
    return ctx.booked.name


def targets_exported() -> set[str]:
    """target_model_name values of scheduler_attempts_total, labelled by the target alone."""
    out = set()
    for family in metrics.REGISTRY.collect():
        if family.name == "inference_extension_scheduler_attempts":
            out |= {s.labels["target_model_name"] for s in family.samples}
    return out


def pairs_exported() -> set[tuple[str, str]]:
    out = set()
    for family in metrics.REGISTRY.collect():
        if family.name == "inference_objective_request":
            for s in family.samples:
                out.add((s.labels["model_name"], s.labels["target_model_name"]))
    return out


async def test_distinct_model_and_target_names_cannot_grow_the_series_or_the_page() -> None:
    director, _ = make_director("bounded-a")
    before, targets_before = pairs_exported(), targets_exported()
    page_before = len(generate_latest(metrics.REGISTRY))
    # Distinct names on both labels: each capped alone, the pairs would still be 256 x 256.
    for i in range(3000):
        await route(director, f"client-model-{i}", f"client-target-{i % 997}")
    after = pairs_exported()
    new = after - before
    assert len(new) <= metrics.MAX_LABEL_PAIRS + 1, len(new)
    # In `after`, not `new`: an earlier test in the same process (the fuzz suite's many model
    # names) may have exported the ("other", "other") series already.
    assert ("other", "other") in after
    assert any(t.startswith("client-target-") for _, t in new)  # the rewrite was honoured
    new_targets = targets_exported() - targets_before
    assert len(new_targets) <= metrics.MAX_LABEL_VALUES + 1, len(new_targets)
    grown = len(generate_latest(metrics.REGISTRY)) - page_before
    assert grown < 1_000_000, f"/metrics grew by {grown} bytes"


def test_a_long_name_is_other_and_known_pairs_stay_themselves() -> None:
    labels = metrics.ModelLabels(limit=2)
    assert labels("m" * (metrics.MAX_LABEL_CHARS + 1), "t") == ("other", "t")
    assert labels("a", "b") == ("a", "b")
    assert labels("c", "d") == ("other", "other")  # the third pair: over the limit of 2
    assert labels("a", "b") == ("a", "b")  # a kept pair is still itself


async def test_a_removed_endpoints_series_go_with_it_and_come_back_with_it() -> None:
    director, ds = make_director("gone-pod")
    scraper = MetricsScraper(ds, pool_name="labels-test", interval=60.0)
    await scraper.start()
    try:
        assert await route(director, "m") == "gone-pod"

        def picks() -> float | None:
            return metrics.REGISTRY.get_sample_value("epp_endpoint_picks_total", {"endpoint": "gone-pod"})

        def attempts() -> float | None:
            return metrics.REGISTRY.get_sample_value(
                "inference_extension_scheduler_attempts_total",
                {
                    "status": "success",
                    "target_model_name": "m",
                    "pod_name": "gone-pod",
                    "namespace": "",
                    "port": "8000",
                },
            )

        assert picks() == 1 and attempts() == 1
        # A rollout while a request is in flight on the old pod: it ends after the pod is gone.
        body = msgspec.json.encode({"model": "m", "prompt": "hi"})
        draining = await director.route(path="/v1/completions", headers={}, body=body, subset=None)
        ds.sync("t", [EndpointSpec(name="other-pod", address="10.9.0.9", port=8000)])
        for ep in ds.endpoints():
            ep.metrics.updated_at = time.monotonic()
        director.finish(draining, complete=True)
        assert picks() is None and attempts() is None
        assert (
            metrics.REGISTRY.get_sample_value("epp_endpoint_inflight_requests", {"endpoint": "gone-pod"})
            is None
        )
        # The same name back (a StatefulSet pod): its series are exported again, not written to an
        # orphaned child the director kept.
        ds.sync("t", [EndpointSpec(name="gone-pod", address="10.9.0.1", port=8000)])
        for ep in ds.endpoints():
            ep.metrics.updated_at = time.monotonic()
        assert await route(director, "m") == "gone-pod"
        assert picks() == 1  # from zero again: the old series went with the old pod
    finally:
        await scraper.stop()


@pytest.mark.parametrize("chars", [8, metrics.MAX_LABEL_CHARS])
async def test_the_page_stays_under_1_mb_at_the_label_caps(chars: int) -> None:
    """Every per-pair series filled (a streamed response with usage), for more distinct pairs
    than are kept, with short names and with the longest kept: the page grew 1.9 MB and 5.7 MB
    with the pair count alone capped (64). The page budget holds it under 1 MB."""
    director, _ = make_director(*[f"page-pod-{i}" for i in range(8)])
    page_before = len(generate_latest(metrics.REGISTRY))
    usage = b'"usage":{"prompt_tokens":5,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":1}}'
    for i in range(300):
        model, target = f"pm{chars}-{i}".ljust(chars, "m"), f"pt{chars}-{i}".ljust(chars, "t")
        body = msgspec.json.encode({"model": model, "prompt": "hi", "stream": True})
        headers = {"x-gateway-model-name-rewrite": target}
        ctx = await director.route(path="/v1/completions", headers=headers, body=body, subset=None)
        ctx.on_response_headers({":status": "200", "content-type": "text/event-stream"}, None)
        ctx.on_response_body(b'data: {"choices":[{"text":"a"}]}\n\n', False)
        ctx.on_response_body(b'data: {"choices":[{"text":"b"}],' + usage + b"}\n\n", True)
        ctx.finish(complete=True)
    grown = len(generate_latest(metrics.REGISTRY)) - page_before
    assert grown < 1_000_000, f"/metrics grew by {grown} bytes"
