"""Disaggregation (epp.scheduling.disagg): llm-d's P/D and E/P/D configurations through the real
Director, the stage headers and bookings, the deciders, and epp's pd-latency-decider."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from epp.api import errors
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.requestcontrol.director import Director, plugin_hooks
from epp.scheduling import config as sched_config
from epp.scheduling.disagg import runner
from epp.scheduling.interfaces import Handle
from epp.sidecar.protocol import (
    ENCODER_HEADER,
    PREFILL_HEADER,
    PREFILL_RESULT_HEADER,
    PREFILL_SECONDS_HEADER,
)

from .fleet import Clock
from .fleet import clock as clock  # the fixture

LLMD = Path(__file__).parent / "data" / "llmd-pd"
ROLE = "llm-d.ai/role"


def pool(*roles: str) -> Datastore:
    ds = Datastore()
    ds.sync(
        "t",
        [
            EndpointSpec(name=f"{r}-{i}", address=f"10.0.0.{i + 1}", port=8000, labels={ROLE: r} if r else {})
            for i, r in enumerate(roles)
        ],
    )
    return ds


def director(text: str, ds: Datastore) -> tuple[Director, sched_config.SchedulerConfig]:
    """A Director on `text`'s plugins, wired as `epp serve` wires them."""
    cfg = sched_config.load_config(text, Handle(datastore=ds))
    return Director(datastore=ds, scheduler=cfg.scheduler, **plugin_hooks(cfg)), cfg


def body(tokens: int, start: int = 1) -> bytes:
    return msgspec.json.encode({"model": "m", "prompt": list(range(start, start + tokens)), "max_tokens": 8})


PD = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters: {blockSizeTokens: 16, autoTune: false}
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 64}
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: prefix-based-pd-decider}
schedulingProfiles:
- name: prefill
  plugins:
  - {pluginRef: prefill-filter}
  - {pluginRef: max-score-picker}
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer}
- name: decode
  plugins:
  - {pluginRef: decode-filter}
  - {pluginRef: max-score-picker}
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer}
"""


async def test_prefix_based_decider_splits_uncached_prompts_and_names_the_prefill_pod() -> None:
    ds = pool("prefill", "decode", "decode")
    d, cfg = director(PD, ds)
    assert isinstance(cfg.scheduler, runner.DisaggScheduler)
    ctx = await d.route(path="/v1/completions", headers={}, body=body(200), subset=None)
    assert ctx.booked.spec.labels[ROLE] == "decode"
    assert ctx.headers == {PREFILL_HEADER: "10.0.0.1:8000"}
    prefill = ds.get("prefill-0")
    assert prefill is not None and prefill.inflight_requests == 1  # booked until the first byte
    ctx.on_response_body(b"data: {}\n\n", False)
    assert prefill.inflight_requests == 0
    ctx.finish(complete=True)
    assert ctx.booked.inflight_requests == 0
    # The same prompt again: its decode pod holds it (the approximate index learned it), so
    # fewer than nonCachedTokens are left to prefill: decode only, no header.
    again = await d.route(path="/v1/completions", headers={}, body=body(200), subset=None)
    assert again.booked is ctx.booked and again.headers == {}
    again.finish(complete=False)
    assert prefill.inflight_requests == 0 and again.booked.inflight_requests == 0
    # A short prompt is never split.
    short = await d.route(path="/v1/completions", headers={}, body=body(30), subset=None)
    assert short.headers == {}
    short.finish(complete=True)


async def test_client_sent_stage_headers_are_dropped() -> None:
    ds = pool("prefill", "decode")
    d, _ = director(PD, ds)
    forged = {PREFILL_HEADER: "169.254.169.254:80", ENCODER_HEADER: "x:1"}
    ctx = await d.route(path="/v1/completions", headers=forged, body=body(20), subset=None)
    assert ctx.headers == {} and set(ctx.remove_headers) == {PREFILL_HEADER, ENCODER_HEADER}
    split = await d.route(path="/v1/completions", headers=forged, body=body(300), subset=None)
    assert split.headers == {PREFILL_HEADER: "10.0.0.1:8000"} and split.remove_headers == (ENCODER_HEADER,)
    # A cancelled stream (finish without a byte) releases both stages' bookings.
    split.finish(complete=False)
    ctx.finish(complete=False)
    assert all(ep.inflight_requests == 0 for ep in ds.endpoints())


async def test_no_prefill_pod_left_means_decode_only() -> None:
    ds = pool("decode", "decode")
    d, _ = director(PD, ds)
    ctx = await d.route(path="/v1/completions", headers={}, body=body(300), subset=None)
    assert ctx.headers == {}
    ctx.finish(complete=True)  # the running-requests gauges are the process's
    _, result = await d.explain(path="/v1/completions", headers={}, body=body(300, start=5000))
    assert "skipped: no endpoints available" in result.cycle[runner.DECISION_KEY]["why"]["prefill"]


EPD = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: encode-filter
- type: prefill-filter
- type: decode-filter
- type: disagg-profile-handler
  parameters:
    deciders: {encode: always-disagg-multimodal-decider, prefill: always-disagg-pd-decider}
- type: always-disagg-multimodal-decider
- type: always-disagg-pd-decider
schedulingProfiles:
- name: encode
  plugins: [{pluginRef: encode-filter}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]
"""


async def test_epd_encodes_multimodal_requests_only() -> None:
    ds = pool("encode", "prefill", "decode")
    d, _ = director(EPD, ds)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    chat = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]}
    ctx = await d.route(path="/v1/chat/completions", headers={}, body=msgspec.json.encode(chat), subset=None)
    assert ctx.headers == {PREFILL_HEADER: "10.0.0.2:8000", ENCODER_HEADER: "10.0.0.1:8000"}
    ctx.finish(complete=True)
    text = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ctx = await d.route(path="/v1/chat/completions", headers={}, body=msgspec.json.encode(text), subset=None)
    assert ctx.headers == {PREFILL_HEADER: "10.0.0.2:8000"}
    ctx.finish(complete=True)


def test_prefill_first_and_refusals() -> None:
    ds = pool("prefill", "decode")
    first = PD.replace("deciders: {prefill: prefix-based-pd-decider}", "stageOrder: prefill-first")
    _, cfg = director(first, ds)
    assert isinstance(cfg.scheduler, runner.DisaggScheduler) and cfg.scheduler.order == "prefill-first"
    both = PD.replace(
        "deciders: {prefill: prefix-based-pd-decider}",
        "{stageOrder: prefill-first, deciders: {prefill: prefix-based-pd-decider}}",
    )
    with pytest.raises(sched_config.ConfigError, match="not supported with stageOrder prefill-first"):
        director(both.replace("parameters:\n    {", "parameters: {"), ds)
    with pytest.raises(sched_config.ConfigError, match="is not a decider"):
        director(PD.replace("prefill: prefix-based-pd-decider}", "prefill: queue-scorer}"), ds)
    with pytest.raises(sched_config.ConfigError, match="need a multi-profile handler"):
        director(
            PD.replace(
                "- type: disagg-profile-handler\n  parameters:\n"
                "    deciders: {prefill: prefix-based-pd-decider}\n",
                "",
            ),
            ds,
        )


async def test_prefill_first_always_splits() -> None:
    ds = pool("prefill", "decode")
    first = PD.replace("deciders: {prefill: prefix-based-pd-decider}", "stageOrder: prefill-first")
    d, _ = director(first, ds)
    ctx = await d.route(path="/v1/completions", headers={}, body=body(5), subset=None)
    assert ctx.headers == {PREFILL_HEADER: "10.0.0.1:8000"}
    ctx.finish(complete=True)  # the running-requests gauges are the process's


LATENCY = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-filter
- type: decode-filter
- {type: request-latency-scorer, parameters: {prefixScorer: ""}}
- type: pd-latency-decider
  parameters: {kvBytesPerToken: 1000, bandwidthBytesPerSecond: 1000000000.0}
- type: disagg-profile-handler
  parameters: {deciders: {prefill: pd-latency-decider}}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: pd-latency-decider}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: request-latency-scorer}]
"""


async def test_latency_decider_splits_where_the_transfer_is_cheaper_than_a_local_prefill() -> None:
    ds = pool("prefill", "decode")
    d, _ = director(LATENCY, ds)
    # 10,000 uncached tokens at the prior 10,000 tokens/s: 1 s of prefill on either pod; moving
    # them costs 10 MB at 1 GB/s = 10 ms, and the decode pod is busy decoding (its prefill would
    # stall its streams): split.
    dec = ds.get("decode-1")
    assert dec is not None
    dec.metrics = dataclasses.replace(dec.metrics, running=8, updated_at=1.0)
    ctx = await d.route(path="/v1/completions", headers={}, body=body(10000), subset=None)
    assert ctx.headers == {PREFILL_HEADER: "10.0.0.1:8000"}
    _, result = await d.explain(path="/v1/completions", headers={}, body=body(10000))
    decision = result.profiles["prefill"].facts["request"]
    assert decision["split"] is True and decision["local_s"] > decision["best_split_s"]
    terms = result.profiles["prefill"].facts["endpoints"]["prefill-0"]
    # The prefill pod's fluid queue holds the booked prefill (about 1 s), which explain prices.
    assert terms["queue_s"] > 0.5 and terms["transfer_bytes"] == pytest.approx(10000 * 1000)
    ctx.finish(complete=False)


async def test_a_split_requests_kv_weighs_on_its_decode_pod_until_its_answer_starts() -> None:
    # Through the Director as `epp serve` wires it (the response-headers plugins included): the
    # decode pod prices the KV on its way to it, until the sidecar's answer starts.
    ds = pool("prefill", "decode")
    d, _ = director(LATENCY, ds)
    dec = ds.get("decode-1")
    assert dec is not None
    # 1,000 blocks of 16 tokens, half in use; 10,000 tokens coming take it past the soft limit.
    dec.metrics = dataclasses.replace(
        dec.metrics, running=8, num_gpu_blocks=1000, kv_usage=0.5, updated_at=1.0
    )

    async def kv_price() -> float:
        _, result = await d.explain(path="/v1/completions", headers={}, body=body(100, start=50_000))
        terms = result.profiles["decode"].facts["endpoints"]["decode-1"]
        assert terms["incoming_kv_tokens"] == (10000 if terms["kv_price_s"] else 0)
        return float(terms["kv_price_s"])

    assert await kv_price() == 0.0
    ctx = await d.route(path="/v1/completions", headers={}, body=body(10000), subset=None)
    assert ctx.headers == {PREFILL_HEADER: "10.0.0.1:8000"}
    assert await kv_price() > 0.0
    ctx.on_response_headers({":status": "200", "content-type": "text/event-stream"}, "10.0.0.2:8000")
    assert await kv_price() == 0.0
    ctx.finish(complete=True)
    assert await kv_price() == 0.0


async def test_latency_decider_keeps_short_prompts_on_the_decode_pod() -> None:
    ds = pool("prefill", "decode")
    d, _ = director(
        LATENCY.replace("bandwidthBytesPerSecond: 1000000000.0", "bandwidthBytesPerSecond: 100000.0"), ds
    )
    # 100 tokens: 10 ms of prefill locally, 1 s to move 100 KB at 100 KB/s: keep it.
    ctx = await d.route(path="/v1/completions", headers={}, body=body(100), subset=None)
    assert ctx.headers == {}
    ctx.finish(complete=True)  # the running-requests gauges are the process's


def test_latency_decider_needs_its_scorers() -> None:
    ds = pool("prefill", "decode")
    with pytest.raises(sched_config.ConfigError, match="list it as a scorer of the prefill profile"):
        director(
            LATENCY.replace(
                "{pluginRef: prefill-filter}, {pluginRef: pd-latency-decider}", "{pluginRef: prefill-filter}"
            ),
            ds,
        )
    with pytest.raises(sched_config.ConfigError, match="has no a request-latency-scorer"):
        director(
            LATENCY.replace(
                "{pluginRef: decode-filter}, {pluginRef: request-latency-scorer}",
                "{pluginRef: decode-filter}",
            ),
            ds,
        )


@pytest.mark.parametrize(
    "name",
    ["pd-epp-config.yaml", "sim-pd-epp-config.yaml", "sim-e-pd-epp-config.yaml", "sim-e-p-d-epp-config.yaml"],
)
async def test_llm_d_pd_configs_load_and_route(name: str) -> None:
    text = (LLMD / name).read_text()
    ds = pool("encode", "prefill", "decode", "prefill-decode")
    d, cfg = director(text, ds)
    assert isinstance(cfg.scheduler, runner.DisaggScheduler)
    ctx = await d.route(path="/v1/completions", headers={}, body=body(400), subset=None)
    assert ctx.booked.spec.labels[ROLE] in ("decode", "prefill-decode")
    ctx.finish(complete=True)
    with pytest.raises(errors.NoCapacity):  # no decode pod: the request fails, as llm-d's
        d2, _ = director(text, pool("prefill", "encode"))
        await d2.route(path="/v1/completions", headers={}, body=body(400), subset=None)


async def test_debug_score_explains_each_stage_and_the_decision() -> None:
    from epp.rpc import explain

    ds = pool("prefill", "decode")
    d, _ = director(LATENCY, ds)
    dec = ds.get("decode-1")
    assert dec is not None
    dec.metrics = dataclasses.replace(dec.metrics, running=8, updated_at=1.0)
    payload = await explain.explain(d, path="/v1/completions", headers={}, body=body(10000))
    assert payload["profile"] == "decode" and payload["pick"] == "10.0.0.2:8000"
    (stage,) = payload["stages"]
    assert stage["stage"] == "prefill" and stage["pick"] == "10.0.0.1:8000"
    (row,) = stage["endpoints"]
    terms = row["terms"]["pd-latency-decider"]
    assert {
        "leg_s",
        "queue_s",
        "prefill_s",
        "transfer_s",
        "transfer_bytes",
        "bandwidth_bytes_per_s",
        "split_s",
    } <= set(terms)
    decision = stage["request_terms"]["pd-latency-decider"]
    assert decision["split"] is True and decision["decode_pod"] == "decode-1"
    assert payload["disaggregation"]["stages"] == ["prefill"]
    # The gRPC twin parses the same dict (ExplainResponse.stages, .disaggregation).
    from google.protobuf import json_format

    from epp.rpc.v1 import endpoint_picker_pb2 as pb

    message = json_format.ParseDict(payload, pb.ExplainResponse())
    assert message.stages[0].pick == "10.0.0.1:8000"


def test_prefill_loads_price_the_queue_a_prefill_joins() -> None:
    from epp.scheduling.disagg.latency_decider import PrefillLoads

    loads = PrefillLoads(window=10.0, max_rho=0.9)
    assert loads.behind("p", 1.0, 0.0, now=0.0) == 0.0  # nothing sent there: nobody behind it
    for _ in range(5):  # 5 prefills of 1 s in the window: 0.5 a second, half the pod's time
        loads.add("p", 1.0, now=0.0)
    lam, rho = loads.rates("p", now=0.0)
    assert lam == pytest.approx(0.5) and rho == pytest.approx(0.5)
    # 1 s of prefill joining 2 s of queue: 0.5/s x 3 s arrive behind it, each delayed 1 s, and
    # the busy period stretches by 1 / (1 - 0.5).
    assert loads.behind("p", 1.0, 2.0, now=0.0) == pytest.approx(1.0 * 0.5 * 3.0 / 0.5)
    # Near capacity the price is capped at maxUtilization, not infinite.
    for _ in range(20):
        loads.add("p", 1.0, now=0.0)
    assert loads.behind("p", 1.0, 0.0, now=0.0) == pytest.approx(1.0 * 2.5 * 1.0 / (1 - 0.9))
    # The load decays over the window, and a pod that leaves is forgotten.
    assert loads.rates("p", now=30.0)[0] == pytest.approx(2.5 * math.exp(-3.0))
    loads.forget("p")
    assert loads.rates("p", now=30.0) == (0.0, 0.0)


async def test_latency_decider_prices_the_prefills_queued_behind_its_own() -> None:
    ds = pool("prefill", "decode")
    d, _ = director(LATENCY, ds)
    dec = ds.get("decode-1")
    assert dec is not None
    dec.metrics = dataclasses.replace(dec.metrics, running=8, updated_at=1.0)
    _, first = await d.explain(path="/v1/completions", headers={}, body=body(10000))
    assert first.profiles["prefill"].facts["endpoints"]["prefill-0"]["behind_others_s"] == 0.0
    ctxs = [
        await d.route(path="/v1/completions", headers={}, body=body(10000, 7 * i), subset=None)
        for i in range(3)
    ]
    assert all(c.headers == {PREFILL_HEADER: "10.0.0.1:8000"} for c in ctxs)
    _, later = await d.explain(path="/v1/completions", headers={}, body=body(10000))
    terms = later.profiles["prefill"].facts["endpoints"]["prefill-0"]
    # Three 1 s prefills sent there: the next one delays those arriving behind it.
    assert terms["behind_others_s"] > 0.0
    assert terms["split_s"] > first.profiles["prefill"].facts["endpoints"]["prefill-0"]["split_s"]
    assert "local_behind_s" in later.profiles["prefill"].facts["request"]
    for c in ctxs:
        c.finish(complete=False)


async def test_latency_decider_min_prompt_tokens_keeps_short_prompts_local() -> None:
    ds = pool("prefill", "decode")
    d, _ = director(
        LATENCY.replace("kvBytesPerToken: 1000,", "kvBytesPerToken: 1000, minPromptTokens: 20000,"), ds
    )
    dec = ds.get("decode-1")
    assert dec is not None
    dec.metrics = dataclasses.replace(dec.metrics, running=8, updated_at=1.0)
    ctx = await d.route(path="/v1/completions", headers={}, body=body(10000), subset=None)
    assert ctx.headers == {}  # it would split (the test above) but for minPromptTokens
    _, result = await d.explain(path="/v1/completions", headers={}, body=body(10000))
    assert "minPromptTokens" in result.profiles["prefill"].facts["request"]["reason"]
    ctx.finish(complete=False)


async def test_decode_pods_are_priced_for_the_prefill_the_decider_sends_elsewhere(clock: Clock) -> None:
    ds = pool("prefill", "decode")
    d, _ = director(LATENCY, ds)
    dec = ds.get("decode-1")
    assert dec is not None
    dec.metrics = dataclasses.replace(dec.metrics, running=8, updated_at=clock.now)

    async def decode_terms() -> tuple[dict[str, Any], dict[str, Any]]:
        _, result = await d.explain(path="/v1/completions", headers={}, body=body(10000, start=90_000))
        facts = result.profiles["decode"].facts
        return facts["request"], facts["endpoints"]["decode-1"]

    async def split(n: int) -> None:
        for i in range(n):  # 5 s apart: the prefill pod's queue is empty again each time
            clock.now += 5.0
            ctx = await d.route(
                path="/v1/completions", headers={}, body=body(10000, start=1 + i), subset=None
            )
            assert ctx.headers == {PREFILL_HEADER: "10.0.0.1:8000"}
            ctx.finish(complete=False)

    # Nothing split yet: the decode pod is priced for a prefill of its own, which would stall its
    # 8 streams for about a second each.
    request, local = await decode_terms()
    assert "remote_prefill" not in request
    assert local["prefill_stall_others_s"] > 4.0
    # Each routed request moves the split share by 5% of the way; explain moves nothing. Until
    # most are split (10 of the last: 0.40) the decode pod is still priced as before.
    await split(10)
    assert "remote_prefill" not in (await decode_terms())[0]
    await split(4)  # 0.51
    request, remote = await decode_terms()
    share = request["remote_prefill"]["share"]
    assert share == pytest.approx(1.0 - 0.95**14)
    # 1,000 bytes a token at the prior 1 GB/s.
    assert request["remote_prefill"]["seconds_per_token"] == pytest.approx(1e-6)
    assert remote["prefill_stall_others_s"] == pytest.approx(local["prefill_stall_others_s"] * (1.0 - share))
    # The first-token work: that share of the local prefill (and its miss price) is replaced by
    # moving 10,000 tokens' KV (10 ms); the queue and the overhead stay.
    work = remote["prefill_s"] + remote["miss_penalty_s"]
    kept = remote["overhead_s"] + remote["queue_s"] + remote["kv_price_s"]
    assert remote["ttft_objective_s"] == pytest.approx(kept + (1.0 - share) * work + share * 0.01)
    # A prompt under minPromptTokens never splits: its decode pod is priced as before.
    d, _ = director(
        LATENCY.replace("kvBytesPerToken: 1000,", "kvBytesPerToken: 1000, minPromptTokens: 5000,"), ds
    )
    await split(20)
    _, result = await d.explain(path="/v1/completions", headers={}, body=body(1000, start=90_000))
    assert "remote_prefill" not in result.profiles["decode"].facts["request"]
    assert (await decode_terms())[0]["remote_prefill"]["share"] == pytest.approx(1.0 - 0.95**20)


@pytest.mark.parametrize(
    ("answer", "learns"),
    [
        (
            {
                "content-type": "application/json",
                PREFILL_RESULT_HEADER: "10.0.0.1:8000",
                PREFILL_SECONDS_HEADER: "4",
            },
            True,
        ),
        (
            {"content-type": "application/json", PREFILL_RESULT_HEADER: "local", PREFILL_SECONDS_HEADER: "4"},
            False,
        ),
        ({"content-type": "application/json", PREFILL_SECONDS_HEADER: "nan"}, False),
    ],
)
async def test_latency_decider_learns_the_prefill_pod_from_the_sidecar(
    answer: dict[str, str], learns: bool
) -> None:
    from epp.scheduling.disagg.latency_decider import PDLatencyDecider

    ds = pool("prefill", "decode")
    d, cfg = director(LATENCY, ds)
    decider = next(p for p in cfg.plugins.values() if isinstance(p, PDLatencyDecider))
    latency = decider._latency
    assert latency is not None
    dec = ds.get("decode-1")
    assert dec is not None
    dec.metrics = dataclasses.replace(dec.metrics, running=8, updated_at=1.0)
    before = latency.prefill_tokens_per_second("prefill-0")
    ctx = await d.route(path="/v1/completions", headers={}, body=body(10000), subset=None)
    assert ctx.headers == {PREFILL_HEADER: "10.0.0.1:8000"}
    # The sidecar says the prefill leg took 4 s where the prior rate predicts about 1 s.
    ctx.on_response_headers({":status": "200", **answer}, None)
    ctx.on_response_body(b"{}", True)
    ctx.finish(complete=True)
    after = latency.prefill_tokens_per_second("prefill-0")
    assert (after < before) if learns else (after == before), (before, after)


@pytest.mark.parametrize(
    ("content_type", "learns"), [("text/event-stream", True), ("application/json", False)]
)
async def test_latency_decider_learns_from_a_streamed_answers_headers(
    content_type: str, learns: bool
) -> None:
    """llm-d's sidecar names no prefill seconds; a streamed answer's headers come once the
    prefill pod has answered, so their time is the leg. A whole JSON answer says nothing."""
    from epp import clock
    from epp.scheduling.disagg.latency_decider import PDLatencyDecider

    t = [100.0]
    with clock.use(lambda: t[0]):
        ds = pool("prefill", "decode")
        d, cfg = director(LATENCY, ds)
        decider = next(p for p in cfg.plugins.values() if isinstance(p, PDLatencyDecider))
        assert decider._latency is not None
        dec = ds.get("decode-1")
        assert dec is not None
        dec.metrics = dataclasses.replace(dec.metrics, running=8, updated_at=t[0])
        before = decider._latency.prefill_tokens_per_second("prefill-0")
        ctx = await d.route(path="/v1/completions", headers={}, body=body(10000), subset=None)
        assert ctx.headers == {PREFILL_HEADER: "10.0.0.1:8000"}
        t[0] += 4.0
        ctx.on_response_headers({":status": "200", "content-type": content_type}, None)
        # No first byte: the TTFT fallback is not taken either, so only the headers can teach.
        ctx.finish(complete=False)
        after = decider._latency.prefill_tokens_per_second("prefill-0")
    assert (after < before) if learns else (after == before), (before, after)
