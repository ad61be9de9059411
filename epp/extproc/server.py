"""The grpc.aio ext-proc server: Envoy's ExternalProcessor service plus gRPC health.

Each Envoy HTTP request is one bidirectional stream; `Stream` (stream.py) holds its state and
this module only pumps messages and guarantees cleanup. Health (grpc.health.v1) is served on the
ext-proc port (for Envoy's active health checks) and on its own port (for Kubernetes probes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epp.extproc import messages as m
from epp.extproc.limits import StreamGuard, StreamLimits
from epp.extproc.messages import DESTINATION_HEADER
from epp.extproc.stream import EVICTED, Stream
from epp.extproc.wire import RequestBody, decode_request
from epp.observability import llmd_metrics, metrics, tracing
from epp.requestcontrol.director import Director

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("epp.extproc")

EXTPROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# Names probed by GIE's chart ("inference-extension") and by readiness/liveness conventions.
HEALTH_SERVICES = ("", EXTPROC_SERVICE, "inference-extension", "readiness")
PENDING_STREAMS_MIN = 4_000  # gRPC core's own bound (hard limit) is 3,000


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self, director: Director, guard: StreamGuard | None = None, *, stream_metrics: bool = False
    ) -> None:
        self._director = director
        self._guard = guard
        # llm-d's --enable-grpc-stream-metrics: streams open, how long each stayed, how each ended.
        self._stream_metrics = stream_metrics
        if stream_metrics:
            llmd_metrics.register_stream_metrics()

    async def Process(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        # read()/write() on the context rather than an async generator over request_iterator:
        # grpc.aio wraps both around the same calls, and the per-token path below is the one
        # that runs most often (one message each way per streamed chunk).
        read, write, eof = context.read, context.write, grpc.aio.EOF
        stream = Stream(self._director, self._guard, write)
        metrics.extproc_streams.inc()
        failed = False
        tracer = tracing.TRACER  # None unless --tracing
        span: Span | None = None
        timed = self._stream_metrics
        started = time.perf_counter() if timed else 0.0
        code = "OK"  # gRPC's status at the stream's end, in Go's spelling (llm-d's label values)
        if timed:
            llmd_metrics.extproc_streams_inflight.inc()
        try:
            while True:
                if stream.evicted is not None:  # flow control may cut it: read while watching
                    msg = await stream.read_or_evicted(read)
                    if msg is EVICTED:
                        for response in stream.evicted_answer():
                            await write(response)
                        return
                else:
                    msg = await read() if not stream.awaiting_body else await stream.read_body(read)
                if msg is None:  # the body's deadline passed (epp.extproc.limits)
                    for response in stream.timed_out():
                        await write(response)
                    return
                if msg is eof:
                    return
                if type(msg) is RequestBody:  # a large body, not copied by protobuf (epp.extproc.wire)
                    responses = await stream.request_body(msg.message, msg.body)
                elif msg.HasField("response_body"):  # the per-token path: answers already serialized
                    for wire in stream.response_body(msg):
                        await write(wire)
                    continue
                else:
                    responses = await stream.handle(msg)
                if tracer is not None:
                    if span is None:  # after the first message: the request headers are known
                        span = tracing.start_request_span(tracer, stream.headers)
                    responses = list(responses)  # with tracing, a long body's chunks built at once
                    _continue_trace(span, responses)
                for response in responses:
                    await write(response)
                stream.answered()  # a routing answer written: the buffered body is given back
                if stream.closed:
                    return
        except asyncio.CancelledError:  # Envoy reset the stream (gRPC cancels the handler)
            code = "Canceled"
            raise
        except Exception:
            failed = True
            code = "Unknown"  # grpc.aio answers an exception with UNKNOWN
            metrics.extproc_stream_errors.labels("internal").inc()
            log.exception("ext-proc stream failed")
            raise
        finally:
            if timed:
                llmd_metrics.stream_finished(code, time.perf_counter() - started)
            # Envoy resets a stream (the handler sees the end of its messages, or a cancellation
            # at an await) both when the client went away or a timeout fired, and after every
            # complete response: only the first kind is counted.
            if stream.abandoned and not failed:
                metrics.extproc_stream_errors.labels("cancelled").inc()
            if span is not None:
                _end_span(span, stream, failed=failed)
            stream.close()
            metrics.extproc_streams.dec()


def _serialize(response: m.ProcessingResponse | bytes) -> bytes:
    """Responses are messages, or bytes already serialized (`Stream.response_body`)."""
    if type(response) is bytes:
        return response
    return response.SerializeToString()  # type: ignore[union-attr,no-any-return]


def add_ext_proc_servicer(server: grpc.aio.Server, servicer: ExternalProcessor) -> None:
    """The generated `add_ExternalProcessorServicer_to_server`, with a serializer that passes
    pre-serialized answers through."""
    handlers = {
        "Process": grpc.stream_stream_rpc_method_handler(
            servicer.Process,
            request_deserializer=decode_request,
            response_serializer=_serialize,
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(EXTPROC_SERVICE, handlers),))
    server.add_registered_method_handlers(EXTPROC_SERVICE, handlers)


def _continue_trace(span: Span, responses: list[m.ProcessingResponse]) -> None:
    """Add the span's trace headers to the answer that routes the request, or note epp's own answer."""
    for response in responses:
        if type(response) is bytes:  # a body chunk, serialized already: no headers in it
            continue
        kind = response.WhichOneof("response")
        if kind == "immediate_response":
            tracing.set_attributes(
                span, {"http.response.status_code": int(response.immediate_response.status.code)}
            )
        elif kind in ("request_headers", "request_body"):
            mutation = getattr(response, kind).response.header_mutation
            if any(h.header.key == DESTINATION_HEADER for h in mutation.set_headers):
                mutation.set_headers.extend(
                    base_pb2.HeaderValueOption(
                        header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
                        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                    )
                    for k, v in tracing.inject(span)
                )


def _end_span(span: Span, stream: Stream, *, failed: bool) -> None:
    ctx = stream.ctx
    if ctx is not None:
        tracing.set_attributes(
            span,
            {
                "target_model": ctx.request.target_model,
                "incoming_model": ctx.request.model,
                "epp.destination": ctx.destination,
                "epp.served": ctx.served.hostport if ctx.served is not None else None,
            },
        )
    error = "ext-proc stream failed" if failed else "abandoned" if stream.abandoned else None
    tracing.end(span, error=error)


class Health:
    """One health servicer shared by both ports, so they always agree."""

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()
        self.serving: bool | None = None

    async def set(self, serving: bool) -> None:
        if serving == self.serving:
            return
        self.serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in HEALTH_SERVICES:
            await self.servicer.set(name, status)
        # Liveness is about the process, not the pool.
        await self.servicer.set("liveness", health_pb2.HealthCheckResponse.SERVING)


def build_server(
    director: Director,
    health_state: Health,
    *,
    guard: StreamGuard | None = None,
    bind: str,
    port: int,
    credentials: grpc.ServerCredentials | None,
    reuse_port: bool = False,
    max_receive_message: int = 64 << 20,
    max_send_message: int = 64 << 20,
    stream_metrics: bool = False,
) -> grpc.aio.Server:
    # gRPC core queues the streams the event loop has not picked up yet and, past 1,000 of them
    # (its default), refuses some at random (RESOURCE_EXHAUSTED: Envoy answered 500), before
    # epp could say anything: a burst of 2,000 new requests got 146 such 500s. epp answers
    # past --max-concurrent-streams itself (503 with a reason), so the queue's bound sits above
    # that, and gRPC refuses only beyond it (the generated Envoy maps that to 503 too).
    streams = (guard.limits if guard is not None else StreamLimits()).max_concurrent_streams
    pending = max(PENDING_STREAMS_MIN, 2 * streams)
    server = grpc.aio.server(
        options=[
            # Envoy multiplexes every HTTP request as a stream over few connections.
            ("grpc.max_concurrent_streams", 100000),
            ("grpc.server.max_pending_requests", pending),
            ("grpc.server.max_pending_requests_hard_limit", pending),
            # llm-d's --grpc-max-recv-msg-size / --grpc-max-send-msg-size (epp.flags.extproc).
            ("grpc.max_receive_message_length", max_receive_message),
            ("grpc.max_send_message_length", max_send_message),
            # gRPC's BDP probe grows every stream's receive window, so a stream epp does not
            # read (a large body waiting for its lane) was still received into gRPC core's
            # buffers: 100 unfinished 15 MiB bodies took epp to 1.6 GB whatever its limits. Without
            # it a stream's window stays small unless epp is reading it (a pending read announces
            # the message's size); large bodies read at the same pace here (bench_big_bodies).
            ("grpc.http2.bdp_probe", 0),
            # Off, so a second epp on the port is a startup error; on for `--workers N`, whose
            # workers share the port (epp.workers).
            ("grpc.so_reuseport", int(reuse_port)),
            # gRPC core's default, written down: a stream the event loop has not picked up within
            # 30 s is cancelled (Envoy answers 500). Only an overloaded epp gets there;
            # epp_event_loop_lag_seconds shows it coming.
            ("grpc.server_max_unrequested_time_in_server", 30),
        ]
    )
    add_ext_proc_servicer(server, ExternalProcessor(director, guard, stream_metrics=stream_metrics))
    health_pb2_grpc.add_HealthServicer_to_server(health_state.servicer, server)
    _add_port(server, listen_address(bind, port), credentials)
    return server


def build_health_server(health_state: Health, *, bind: str, port: int) -> grpc.aio.Server:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health_state.servicer, server)
    _add_port(server, listen_address(bind, port), None)
    return server


def listen_address(bind: str, port: int) -> str:
    """gRPC's `host:port` for `--bind-address`: an IPv6 literal in brackets. gRPC listens on
    every address, IPv4 and IPv6 (where the host has it), for either wildcard, 0.0.0.0 or ::."""
    return f"[{bind}]:{port}" if ":" in bind else f"{bind}:{port}"


def _add_port(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> None:
    bound = (
        server.add_secure_port(address, credentials)
        if credentials is not None
        else server.add_insecure_port(address)
    )
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
