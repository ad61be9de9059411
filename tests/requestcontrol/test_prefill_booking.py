"""Prefill work booked per endpoint (`Endpoint.prefill_tokens`): a routed request's prompt tokens
count from the routing decision to the first byte of its answer, or to the stream's end when no
byte came; concurrency-detector's `maxPrefillTokens` reads them, and with it set every response
body passes through epp whatever the sample ratio. Real Director and scheduler."""

from __future__ import annotations

import asyncio

import msgspec

from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.flowcontrol import controller as flowcontrol
from epp.requestcontrol import admission
from epp.requestcontrol.context import RequestContext
from epp.requestcontrol.director import Director, DirectorSettings
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle

BODY = msgspec.json.encode({"model": "m", "prompt": "hello there, a prompt of a few tokens"})
POD = "10.0.0.1:8000"

DETECTOR = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: concurrency-detector
    parameters: {maxConcurrency: 8, maxPrefillTokens: %d}
  - type: queue-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
saturationDetector: {pluginRef: concurrency-detector}
"""


def make(prefill_limit: int) -> tuple[Director, Datastore]:
    ds = Datastore()
    ds.sync("prefill", [EndpointSpec(name="pod-0", address="10.0.0.1", port=8000)])
    cfg = sched_config.load_config(DETECTOR % prefill_limit, Handle(datastore=ds))
    detector = admission.LegacyAdmissionController(cfg.saturation_detector)
    settings = DirectorSettings(response_sample_ratio=0.01)
    return Director(
        datastore=ds, scheduler=cfg.scheduler, settings=settings, admission_controller=detector
    ), ds


async def test_prompt_tokens_count_until_the_first_byte() -> None:
    d, ds = make(4096)
    ep = ds.by_hostport(POD)
    assert ep is not None
    first = await d.route(path="/v1/completions", headers={}, body=BODY, subset=[POD])
    second = await d.route(path="/v1/completions", headers={}, body=BODY, subset=[POD])
    tokens = first.request.prompt_tokens_estimate
    assert tokens > 0 and ep.prefill_tokens == 2 * tokens
    first.on_response_headers({":status": "200", "content-type": "text/event-stream"}, POD)
    first.on_response_body(b"", False)  # an empty chunk is no first byte
    assert ep.prefill_tokens == 2 * tokens
    first.on_response_body(b'data: {"choices": []}\n\n', False)
    assert ep.prefill_tokens == tokens
    first.on_response_body(b"data: [DONE]\n\n", True)
    first.finish(complete=True)
    assert ep.prefill_tokens == tokens and ep.inflight_requests == 1  # counted once, not twice
    second.finish(complete=False)  # a client reset before any byte: released at the end
    assert ep.prefill_tokens == 0 and ep.inflight_requests == 0 and ep.inflight_tokens == 0


async def test_counting_prefill_reads_every_response() -> None:
    d, _ = make(4096)
    contexts = [await d.route(path="/v1/completions", headers={}, body=BODY, subset=[POD]) for _ in range(20)]
    assert all(ctx.sampled for ctx in contexts)
    for ctx in contexts:
        ctx.finish(complete=True)  # the running-requests gauges are the process's
    # Without maxPrefillTokens the ratio (1 in 100) holds: the first request only.
    d, _ = make(0)
    contexts = [await d.route(path="/v1/completions", headers={}, body=BODY, subset=[POD]) for _ in range(20)]
    assert sum(ctx.sampled for ctx in contexts) == 1
    for ctx in contexts:
        ctx.finish(complete=True)


FLOW = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
  - type: concurrency-detector
    parameters: {maxConcurrency: 100, maxPrefillTokens: 1}
  - type: queue-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
flowControl:
  saturationDetector: {pluginRef: concurrency-detector}
"""


class Priorities:
    def priority_of(self, name: str) -> int | None:
        return {"critical": 10, "batch": -1}.get(name)


async def test_held_until_the_pods_prefill_is_done_then_by_priority() -> None:
    """Far under maxConcurrency, but with one prompt still prefilling the pool is saturated:
    the next requests wait in epp, and the first byte of that answer lets the critical one go
    before the sheddable one that came first."""
    ds = Datastore()
    ds.sync("prefill", [EndpointSpec(name="pod-0", address="10.0.0.1", port=8000)])
    cfg = sched_config.load_config(FLOW, Handle(datastore=ds))
    detector, flow, _ = flowcontrol.from_scheduler_config(cfg, ds.candidates)
    assert flow is not None
    d = Director(
        datastore=ds,
        scheduler=cfg.scheduler,
        admission_controller=admission.LegacyAdmissionController(detector),
        objectives=Priorities(),
        flow_control=flow,
    )
    try:

        def send(objective: str) -> asyncio.Task[RequestContext]:
            headers = {"x-gateway-inference-objective": objective}
            return asyncio.create_task(
                d.route(path="/v1/completions", headers=headers, body=BODY, subset=None)
            )

        first = await send("batch")
        batch = send("batch")
        await asyncio.sleep(0.05)
        critical = send("critical")
        await asyncio.sleep(0.05)
        assert not batch.done() and not critical.done()  # held: pod-0 is still prefilling `first`
        first.on_response_headers({":status": "200", "content-type": "text/event-stream"}, POD)
        first.on_response_body(b'data: {"choices": []}\n\n', False)
        ctx = await asyncio.wait_for(critical, 5)
        await asyncio.sleep(0.05)
        assert not batch.done()  # the critical request's prefill holds it in turn
        ctx.on_response_body(b'data: {"choices": []}\n\n', False)
        (await asyncio.wait_for(batch, 5)).finish(complete=True)
        ctx.finish(complete=True)
        first.finish(complete=True)
        ep = ds.by_hostport(POD)
        assert ep is not None and ep.prefill_tokens == 0 and ep.inflight_requests == 0
    finally:
        flow.close()
