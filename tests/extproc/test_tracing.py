"""--tracing: one OpenTelemetry span per request over the real gRPC server, joined to the caller's
trace and handed on to the model server in the routed headers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import grpc
import msgspec
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, StatusCode

from epp.extproc import messages as m
from epp.extproc import server as srv
from epp.observability import tracing
from tests.extproc import helpers as h
from tests.extproc.test_server import free_port

CHAT = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.shutdown()


async def route_one(headers: dict[str, str], body: bytes = CHAT) -> list[m.ProcessingResponse]:
    director, _ = h.make_director()
    health = srv.Health()
    await health.set(True)
    port = free_port()
    server = srv.build_server(director, health, bind="127.0.0.1", port=port, credentials=None)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(h.headers_msg(h.post_headers(**headers)))
            await call.write(h.body_msg(body))
            out = [await call.read()]
            if out[0].WhichOneof("response") != "immediate_response":
                out.append(await call.read())  # the body
            await call.done_writing()
            call.cancel()
        return out
    finally:
        await server.stop(1)


async def test_a_span_per_request_joins_the_callers_trace(spans: InMemorySpanExporter) -> None:
    responses = await route_one({"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"})
    routed = h.set_headers(responses[0])
    (span,) = spans.get_finished_spans()
    assert span.name == "gateway.request" and span.kind is SpanKind.SERVER
    assert span.parent is not None and f"{span.parent.span_id:016x}" == CALLER_SPAN
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    # The model server gets epp's span as its parent: the trace continues upstream.
    assert routed["traceparent"] == f"00-{TRACE_ID}-{span.context.span_id:016x}-01"
    attrs = dict(span.attributes or {})
    assert attrs["target_model"] == "m" and attrs["incoming_model"] == "m"
    assert attrs["epp.destination"] == routed[m.DESTINATION_HEADER]


async def test_a_request_without_a_trace_starts_one(spans: InMemorySpanExporter) -> None:
    responses = await route_one({})
    (span,) = spans.get_finished_spans()
    assert span.parent is None
    assert h.set_headers(responses[0])["traceparent"].split("-")[1] == f"{span.context.trace_id:032x}"


async def test_epps_own_answers_are_recorded(spans: InMemorySpanExporter) -> None:
    (response,) = await route_one({}, body=b"garbage")
    assert response.immediate_response.status.code == 400
    (span,) = spans.get_finished_spans()
    assert dict(span.attributes or {})["http.response.status_code"] == 400
    assert span.status.status_code is not StatusCode.ERROR  # a client error, answered properly


async def test_tracing_off_adds_nothing() -> None:
    assert tracing.TRACER is None
    responses = await route_one({"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"})
    assert "traceparent" not in h.set_headers(responses[0])


def test_setup_follows_gies_environment() -> None:
    tracing.setup({"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_EXPORTER": "console"})
    try:
        provider = tracing._provider
        assert provider is not None
        assert "TraceIdRatioBased{0.1}" in provider.sampler.get_description()  # GIE's fallback
        assert provider.resource.attributes["service.name"] == "epp"
    finally:
        tracing.shutdown()
    with pytest.raises(ValueError, match="console or otlp"):
        tracing.setup({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_epp_serve_tracing_exports_to_the_console() -> None:
    # A real process: --tracing starts, and refuses nothing; the error below is the endpoint check.
    env = {"OTEL_TRACES_EXPORTER": "console", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "epp", "serve", "--tracing", "--endpoints=bad"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 2
    assert "tracing on: console exporter, sampling ratio 0.1" in done.stderr
    assert "not supported" not in done.stderr
