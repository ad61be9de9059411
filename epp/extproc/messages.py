"""Builders and readers for Envoy ext_proc v3 messages (xds-protos, upb-backed).

Only the shapes the EPP protocol uses are built here, so the stream state machine reads as
protocol steps rather than protobuf plumbing. Messages are upb C objects: building one costs about
a microsecond, so nothing here is cached except the constant "continue" responses, and the
answer to a streamed response chunk (sent once per token, so it is written straight to bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest as ProcessingRequest
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingResponse as ProcessingResponse
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from epp.extproc import wire

DESTINATION_HEADER = "x-gateway-destination-endpoint"
SERVED_KEY = "x-gateway-destination-endpoint-served"
SCORES_KEY = "x-gateway-destination-endpoint-scores"  # llm-d's --emit-endpoint-scores
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"

# GIE's BodyByteLimit: Envoy rejects larger streamed body chunks from the processor.
MAX_BODY_CHUNK = 62000

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_SEND = processing_mode_pb2.ProcessingMode.SEND
_SKIP = processing_mode_pb2.ProcessingMode.SKIP
_BODY_NONE = processing_mode_pb2.ProcessingMode.NONE


def header_map(headers: pb.HttpHeaders) -> dict[str, str]:
    """Flatten Envoy's header map; names arrive lower-case. Values come as raw_value bytes
    (Envoy >= 1.27) or as `value` from older proxies."""
    out: dict[str, str] = {}
    for h in headers.headers.headers:
        raw = h.raw_value
        out[h.key] = raw.decode("utf-8", "replace") if raw else h.value
    return out


def _set_headers(headers: Iterable[tuple[str, str]]) -> list[base_pb2.HeaderValueOption]:
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE
        )
        for k, v in headers
    ]


def _lb_metadata(destination: str, scores: Mapping[str, float] | None = None) -> struct_pb2.Struct:
    md = struct_pb2.Struct()
    lb = md.fields[LB_NAMESPACE].struct_value.fields
    lb[DESTINATION_HEADER].string_value = destination
    if scores:  # {ip:port: weighted score} as numbers, llm-d's shape
        by_endpoint = lb[SCORES_KEY].struct_value.fields
        for hostport, score in scores.items():
            by_endpoint[hostport].number_value = score
    return md


def routed_headers(
    destination: str,
    extra_headers: Mapping[str, str],
    *,
    remove: Iterable[str] = (),
    scores: Mapping[str, float] | None = None,
) -> ProcessingResponse:
    """The request-headers answer that routes: the destination header (overwriting anything a
    client forged) and `envoy.lb` dynamic metadata carrying the same value (and, with `scores`,
    every scored endpoint's score)."""
    headers = [(DESTINATION_HEADER, destination), *extra_headers.items()]
    return ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                header_mutation=pb.HeaderMutation(set_headers=_set_headers(headers), remove_headers=remove),
                clear_route_cache=True,
            )
        ),
        dynamic_metadata=_lb_metadata(destination, scores),
    )


def routed_body_buffered(
    destination: str,
    extra_headers: Mapping[str, str],
    body: bytes | None,
    *,
    remove: Iterable[str] = (),
    scores: Mapping[str, float] | None = None,
) -> ProcessingResponse:
    """BUFFERED mode: the routing answer rides on the body response (Envoy holds the headers
    until it arrives); the body is replaced only when it was rewritten."""
    headers = [(DESTINATION_HEADER, destination), *extra_headers.items()]
    common = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=_set_headers(headers), remove_headers=remove),
        clear_route_cache=True,
    )
    if body is not None:
        common.body_mutation.body = body
    return ProcessingResponse(
        request_body=pb.BodyResponse(response=common), dynamic_metadata=_lb_metadata(destination, scores)
    )


def streamed_request_body(body: bytes) -> list[ProcessingResponse]:
    """FULL_DUPLEX_STREAMED: Envoy forwards only what we send back, in chunks of at most 62000
    bytes, the last one marked end_of_stream (an empty body is one empty final chunk)."""
    return [ProcessingResponse(request_body=_streamed(chunk, eos)) for chunk, eos in _chunks(body)]


def streamed_request_body_wire(body: bytes | memoryview, end_of_stream: bool = True) -> Iterable[bytes]:
    """`streamed_request_body`, serialized (the same bytes). `end_of_stream` False leaves the last
    chunk open (the body ends with trailers). A body of several chunks is serialized lazily, one
    chunk as the server writes it: all 270 chunks of a 16 MiB body built at once held the loop
    ~6 ms (up to 18) in one step."""
    if len(body) <= MAX_BODY_CHUNK:
        return [wire.request_body_answer(body, end_of_stream)]
    return _request_body_chunks(memoryview(body), end_of_stream)


def _request_body_chunks(view: memoryview, end_of_stream: bool) -> Iterator[bytes]:
    n = len(view)
    for i in range(0, n, MAX_BODY_CHUNK):
        yield wire.request_body_answer(
            view[i : i + MAX_BODY_CHUNK], end_of_stream and i + MAX_BODY_CHUNK >= n
        )


def streamed_response_body_wire(body: bytes, end_of_stream: bool) -> list[bytes]:
    """The per-chunk answer of a streamed response (FULL_DUPLEX_STREAMED), serialized: chunks of
    at most 62000 bytes, the last one carrying `end_of_stream`.

    Building the five nested upb messages and serializing them costs ~4 µs a chunk; setting two
    fields of one kept message and serializing it, ~0.8 µs. The kept message is shared: this
    must run on one thread (the event loop's), and the bytes are taken before it returns."""
    if len(body) <= MAX_BODY_CHUNK:
        return [_streamed_wire(body, end_of_stream)]
    return [_streamed_wire(chunk, last and end_of_stream) for chunk, last in _chunks(body)]


class _StreamedTemplate:
    """The kept message, replaced after TEMPLATE_BYTES of bodies. upb copies every bytes value
    set on a message into the message's arena and frees the arena only with the message, never
    the value a later set replaces: one message kept for the process held every response chunk
    it ever carried (~1.2 MB/min of RSS in the soak at 20 req/s, docs/reliability.md). A new
    message every 1 MiB bounds that at ~1 MiB and costs one allocation per ~1 MiB answered.
    (The request body sent back is built by hand instead: `wire.request_body_answer`.)"""

    __slots__ = ("fields", "held", "message")

    def __init__(self) -> None:
        self.message = ProcessingResponse()
        self.fields = self.message.response_body.response.body_mutation.streamed_response
        self.held = 0  # body bytes set on this message (its arena holds them all)


TEMPLATE_BYTES = 1 << 20
_template = _StreamedTemplate()


def _streamed_wire(chunk: bytes, eos: bool) -> bytes:
    global _template
    t = _template
    if t.held > TEMPLATE_BYTES:
        t = _template = _StreamedTemplate()
    t.held += len(chunk)
    fields = t.fields
    fields.body = chunk
    fields.end_of_stream = eos
    return t.message.SerializeToString()  # type: ignore[no-any-return]


def _chunks(body: bytes | memoryview) -> list[tuple[bytes, bool]]:
    if len(body) <= MAX_BODY_CHUNK:
        return [(bytes(body), True)]  # a copy only for a view (bytes(b) is b)
    view = memoryview(body)
    n = len(body)
    return [
        (bytes(view[i : i + MAX_BODY_CHUNK]), i + MAX_BODY_CHUNK >= n) for i in range(0, n, MAX_BODY_CHUNK)
    ]


def _streamed(chunk: bytes, eos: bool) -> pb.BodyResponse:
    return pb.BodyResponse(
        response=pb.CommonResponse(
            body_mutation=pb.BodyMutation(
                streamed_response=pb.StreamedBodyResponse(body=chunk, end_of_stream=eos)
            )
        )
    )


def replaced_response_body(body: bytes | None) -> ProcessingResponse:
    """Non-duplex response body modes: continue, replacing the chunk only if it changed."""
    if body is None:
        return CONTINUE_RESPONSE_BODY
    return ProcessingResponse(
        response_body=pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(body=body)))
    )


def response_headers(remove: Iterable[str] = (), add: Mapping[str, str] | None = None) -> ProcessingResponse:
    """The response-headers answer: continue, removing `remove` and setting `add` (plugins'
    response headers) when given."""
    remove = list(remove)
    if not remove and not add:
        return CONTINUE_RESPONSE_HEADERS
    return _response_headers_removing(remove, add)


def _response_headers_removing(remove: list[str], add: Mapping[str, str] | None = None) -> ProcessingResponse:
    mutation = pb.HeaderMutation(remove_headers=remove)
    if add:
        mutation.set_headers.extend(_set_headers(add.items()))
    return ProcessingResponse(
        response_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation))
    )


def response_headers_skip_body(
    request_body_mode: int, remove: Iterable[str] = (), add: Mapping[str, str] | None = None
) -> ProcessingResponse:
    """The response-headers answer that stops the response body (and trailers) from coming to
    epp for the rest of this request: a `mode_override`. Envoy 1.40 honours it only with
    `allow_mode_override` and when neither body mode is FULL_DUPLEX_STREAMED; otherwise the body
    keeps coming and is handled as usual."""
    response = _response_headers_removing(list(remove), add)
    _skip_response(response, request_body_mode, response_headers=_SEND)
    return response


def request_headers_skip_response(request_body_mode: int) -> ProcessingResponse:
    """The request-headers answer of an off-sample request (`Director.skips_response`): continue,
    and send epp neither the response's headers nor its body (a `mode_override`, honoured as
    `response_headers_skip_body`'s). Envoy still ends this stream when the HTTP stream ends."""
    response = ProcessingResponse(request_headers=pb.HeadersResponse())
    _skip_response(response, request_body_mode, response_headers=_SKIP)
    return response


def _skip_response(response: ProcessingResponse, request_body_mode: int, *, response_headers: int) -> None:
    """Set `response`'s mode override: the request side as configured (trailers skipped), the
    response's headers as `response_headers` says, its body and trailers not sent."""
    mode = response.mode_override
    mode.request_header_mode = _SEND
    mode.request_body_mode = request_body_mode
    mode.request_trailer_mode = _SKIP
    mode.response_header_mode = response_headers
    mode.response_body_mode = _BODY_NONE
    mode.response_trailer_mode = _SKIP


def immediate(
    status: int,
    body: bytes,
    *,
    content_type: str = "application/json",
    headers: Mapping[str, str] | None = None,
) -> ProcessingResponse:
    """Answer the client directly (errors). Envoy sends it and ends the HTTP stream."""
    extra = [("content-type", content_type), *(headers or {}).items()]
    return ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=pb.HeaderMutation(set_headers=_set_headers(extra)),
            body=body,
            details="epp",
        )
    )


def override_message_timeout(seconds: float) -> ProcessingResponse:
    """Extend Envoy's `message_timeout` for the message being processed (BUFFERED and STREAMED
    modes; Envoy caps it at the filter's `max_message_timeout`, and ignores it when that is unset).
    Sent while flow control holds a request, so that Envoy keeps waiting for the answer."""
    response = ProcessingResponse()
    response.override_message_timeout.FromMilliseconds(int(seconds * 1000))
    return response


def metadata_string(request: ProcessingRequest, namespace: str, key: str) -> str | None:
    """A string value of the request's metadata_context.filter_metadata[namespace][key]."""
    if not request.HasField("metadata_context"):
        return None
    ns = request.metadata_context.filter_metadata.get(namespace)
    if ns is None or key not in ns.fields:
        return None
    value = ns.fields[key]
    return value.string_value if value.HasField("string_value") else None


ATTRIBUTES_NAMESPACE = "envoy.filters.http.ext_proc"
CONNECTION_ID = "connection.id"


def connection_id(request: ProcessingRequest) -> float | None:
    """The client connection's id, when the gateway sends Envoy's `connection.id` attribute
    (`request_attributes`; the generated full-duplex config does); None otherwise."""
    attrs = request.attributes.get(ATTRIBUTES_NAMESPACE)
    if attrs is None:
        return None
    value = attrs.fields.get(CONNECTION_ID)
    if value is None or not value.HasField("number_value"):
        return None
    return float(value.number_value)


def subset_hint(request: ProcessingRequest) -> list[str] | None:
    """Envoy's subset hint: None when absent (no restriction); otherwise the listed endpoints,
    given as a list or a comma-separated string (the lightweight EPP accepts both)."""
    if not request.HasField("metadata_context"):
        return None
    ns = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if ns is None or SUBSET_KEY not in ns.fields:
        return None
    value = ns.fields[SUBSET_KEY]
    if value.HasField("list_value"):
        return [v.string_value for v in value.list_value.values if v.string_value]
    if value.HasField("string_value"):
        return [s.strip() for s in value.string_value.split(",") if s.strip()]
    return []


CONTINUE_REQUEST_HEADERS = ProcessingResponse(request_headers=pb.HeadersResponse())
CONTINUE_REQUEST_BODY = ProcessingResponse(request_body=pb.BodyResponse())
CONTINUE_REQUEST_TRAILERS = ProcessingResponse(request_trailers=pb.TrailersResponse())
CONTINUE_RESPONSE_HEADERS = ProcessingResponse(response_headers=pb.HeadersResponse())
CONTINUE_RESPONSE_BODY = ProcessingResponse(response_body=pb.BodyResponse())
CONTINUE_RESPONSE_TRAILERS = ProcessingResponse(response_trailers=pb.TrailersResponse())
