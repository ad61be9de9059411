"""OpenTelemetry traces (`--tracing`, as GIE's): one server span per request, off by default.

Each ext-proc stream (one HTTP request) is a span named `gateway.request`, GIE's name, with
kind SERVER. Its parent is the client's W3C `traceparent` (and baggage) from the request
headers, so epp's span joins the caller's trace; the span's own context is then injected into
the headers epp sends on to the model server (with the routing headers), so a traced vLLM
continues the same trace, as GIE does. Attributes: `target_model`, `incoming_model`,
`epp.destination` (the endpoints picked, in order), `epp.served` (the one that answered) and
`http.response.status_code` for a request epp answered itself.

Configuration is GIE's, from the standard environment variables:

- `OTEL_SERVICE_NAME` (default `epp`), `OTEL_RESOURCE_ATTRIBUTES`;
- `OTEL_TRACES_EXPORTER`: `console` (default, as GIE: JSON spans on stdout) or `otlp` (gRPC to
  `OTEL_EXPORTER_OTLP_ENDPOINT`, default http://localhost:4317);
- `OTEL_TRACES_SAMPLER`: `parentbased_traceidratio` (the only one GIE supports, and the default)
  with `OTEL_TRACES_SAMPLER_ARG` (default 0.1); any other sampler falls back to that, logged.

OpenTelemetry is an optional dependency (`pip install 'epp[tracing]'`); `--tracing` without it
is a startup error naming the package. With tracing off nothing here is imported and the data
path does one `is None` test per stream.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("epp.tracing")

SPAN_NAME = "gateway.request"
DEFAULT_SERVICE_NAME = "epp"
DEFAULT_ENDPOINT = "http://localhost:4317"
DEFAULT_RATIO = 0.1

# The tracer of a running `epp serve --tracing`, else None (the data path tests only this).
TRACER: Tracer | None = None
_provider: TracerProvider | None = None


class TracingUnavailable(RuntimeError):
    """--tracing was asked for but OpenTelemetry is not installed."""


def setup(environ: Mapping[str, str] | None = None) -> None:
    """Install the tracer provider `--tracing` asks for (GIE's environment semantics)."""
    global TRACER, _provider
    env = os.environ if environ is None else environ
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise TracingUnavailable(
            f"--tracing needs OpenTelemetry: pip install 'epp[tracing]' ({exc.name} is missing)"
        ) from exc

    sampler_name = env.get("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    try:
        ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG", DEFAULT_RATIO))
    except ValueError:
        log.warning("OTEL_TRACES_SAMPLER_ARG is not a number; sampling %g of traces", DEFAULT_RATIO)
        ratio = DEFAULT_RATIO
    if sampler_name != "parentbased_traceidratio":
        log.warning(
            "unsupported sampler %s (as in GIE); using parentbased_traceidratio with ratio %g",
            sampler_name,
            DEFAULT_RATIO,
        )
        ratio = DEFAULT_RATIO
    exporter_name = env.get("OTEL_TRACES_EXPORTER", "console")
    exporter: SpanExporter
    if exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", DEFAULT_ENDPOINT)
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
    elif exporter_name == "console":
        exporter = ConsoleSpanExporter()
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: epp exports to console or otlp")
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", DEFAULT_SERVICE_NAME)})
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    use(provider)
    trace.set_tracer_provider(provider)  # for libraries that trace through the global provider
    log.info("tracing on: %s exporter, sampling ratio %g", exporter_name, ratio)


def use(provider: TracerProvider) -> None:
    """Trace requests with `provider` (tests hand in one with an in-memory exporter)."""
    global TRACER, _provider
    _provider = provider
    TRACER = provider.get_tracer("epp/extproc")


def shutdown() -> None:
    """Flush what is buffered and stop tracing."""
    global TRACER, _provider
    TRACER = None
    if _provider is not None:
        _provider.shutdown()
        _provider = None


def start_request_span(tracer: Tracer, request_headers: Mapping[str, str]) -> Span:
    """The request's span, a child of the caller's trace context when the headers carry one."""
    from opentelemetry import propagate, trace

    parent = propagate.extract(request_headers)
    return tracer.start_span(SPAN_NAME, context=parent, kind=trace.SpanKind.SERVER)


def inject(span: Span) -> list[tuple[str, str]]:
    """The headers (traceparent, tracestate, baggage) that continue `span`'s trace upstream."""
    from opentelemetry import propagate, trace

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return sorted(carrier.items())


def set_attributes(span: Span, attributes: Mapping[str, Any]) -> None:
    span.set_attributes({k: v for k, v in attributes.items() if v is not None and v != ""})


def end(span: Span, *, error: str | None = None, events: Sequence[str] = ()) -> None:
    from opentelemetry.trace import Status, StatusCode

    for event in events:
        span.add_event(event)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()
