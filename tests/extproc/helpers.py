"""Builders for ext-proc request messages as Envoy 1.40 sends them, and a small pool."""

from __future__ import annotations

from collections.abc import Mapping

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.extproc.stream import Stream
from epp.requestcontrol.director import Director, DirectorSettings
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle, RequestOutcome

DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED


def headers_msg(
    headers: Mapping[str, str], *, eos: bool = False, mode: int | None = DUPLEX, response_mode: int = DUPLEX
) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=_header_map(headers), end_of_stream=eos)
    )
    if mode is not None:
        msg.protocol_config.request_body_mode = mode
        msg.protocol_config.response_body_mode = response_mode
    return msg


def post_headers(path: str = "/v1/chat/completions", **extra: str) -> dict[str, str]:
    return {":method": "POST", ":path": path, ":authority": "gw", "content-type": "application/json", **extra}


def body_msg(body: bytes, *, eos: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=eos))


def _header_map(items: Mapping[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in items.items()]
    )


def response_headers_msg(
    status: int = 200, *, served: str | None = None, **extra: str
) -> pb.ProcessingRequest:
    hm = _header_map({":status": str(status), "content-type": "application/json", **extra})
    msg = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=hm))
    if served:
        msg.metadata_context.filter_metadata["envoy.lb"].fields[
            "x-gateway-destination-endpoint-served"
        ].string_value = served
    return msg


def response_body_msg(body: bytes, *, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=body, end_of_stream=eos))


async def answer(stream: Stream, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
    """What the server answers `msg` with, parsed: a response body through `Stream.response_body`
    (serialized, as the server writes it), any other message through `Stream.handle`."""
    if msg.HasField("response_body"):
        return [pb.ProcessingResponse.FromString(wire) for wire in stream.response_body(msg)]
    return list(await stream.handle(msg))


def set_headers(resp: pb.ProcessingResponse, field: str = "request_headers") -> dict[str, str]:
    common = getattr(resp, field).response
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def make_director(
    n: int = 3, *, config: str | None = None, settings: DirectorSettings | None = None
) -> tuple[Director, Datastore]:
    ds = Datastore()
    ds.sync("test", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(n)])
    cfg = sched_config.load_config(config, Handle(datastore=ds))
    director = Director(
        datastore=ds,
        scheduler=cfg.scheduler,
        pre_request=cfg.pre_request,
        response_complete=cfg.response_complete,
        settings=settings or DirectorSettings(),
    )
    return director, ds


def message(response: pb.ProcessingResponse | bytes) -> pb.ProcessingResponse:
    """An answer as a message: body chunks sent back come serialized already."""
    return pb.ProcessingResponse.FromString(response) if isinstance(response, bytes) else response


class Outcomes:
    """A response-complete hook that keeps what it was told."""

    name = "outcomes"

    def __init__(self) -> None:
        self.seen: list[RequestOutcome] = []

    def response_complete(self, request: object, outcome: RequestOutcome) -> None:
        self.seen.append(outcome)
