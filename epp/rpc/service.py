"""The `epp.v1.EndpointPicker` gRPC service (protos/epp/rpc/v1/endpoint_picker.proto)."""

from __future__ import annotations

import grpc
from google.protobuf import json_format

from epp.api import errors
from epp.requestcontrol.director import Director
from epp.rpc import explain
from epp.rpc.v1 import endpoint_picker_pb2 as pb
from epp.rpc.v1 import endpoint_picker_pb2_grpc as pb_grpc

# HTTP statuses of RequestError -> the gRPC codes a client would expect for them.
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


class EndpointPicker(pb_grpc.EndpointPickerServicer):
    def __init__(self, director: Director) -> None:
        self._director = director

    async def Explain(  # gRPC method name
        self, request: pb.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExplainResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            payload = await explain.explain(
                self._director, path=request.path or "/v1/completions", headers=headers, body=request.body
            )
        except errors.RequestError as exc:
            await context.abort(_CODES.get(exc.status, grpc.StatusCode.INTERNAL), exc.reason)
        response: pb.ExplainResponse = json_format.ParseDict(payload, pb.ExplainResponse())
        return response

    async def ListEndpoints(  # gRPC method name
        self, request: pb.ListEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEndpointsResponse:
        payload = explain.list_endpoints(self._director.datastore)
        response: pb.ListEndpointsResponse = json_format.ParseDict(payload, pb.ListEndpointsResponse())
        return response


def add_to_server(server: grpc.aio.Server, director: Director) -> None:
    pb_grpc.add_EndpointPickerServicer_to_server(EndpointPicker(director), server)  # type: ignore[no-untyped-call]
