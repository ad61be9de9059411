"""The /debug routes on the metrics port, and their gRPC twin `epp.v1.EndpointPicker` on the
ext-proc port, exist only with `epp serve --enable-debug-api`.

They run the tokenizer and the scheduler for any body sent to a port bound to 0.0.0.0 by default,
so a real `epp serve` without the flag must answer 404 (naming the flag) on every /debug path
and UNIMPLEMENTED on the gRPC service, while /metrics still answers; with the flag they answer.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from epp.gateway.processes import EppServer
from epp.rpc.v1 import endpoint_picker_pb2 as pb
from epp.rpc.v1 import endpoint_picker_pb2_grpc as pb_grpc

BODY = json.dumps({"model": "m", "prompt": "hello"}).encode()


def _call(url: str, body: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def _list_endpoints(port: int) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            stub = pb_grpc.EndpointPickerStub(channel)  # type: ignore[no-untyped-call]
            await stub.ListEndpoints(pb.ListEndpointsRequest(), timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("enabled", [False, True])
async def test_debug_routes_answer_only_with_the_flag(tmp_path: Path, enabled: bool) -> None:
    extra = ["--enable-debug-api"] if enabled else []
    epp = EppServer(tmp_path / "epp.log", endpoints=["127.0.0.1:1"], extra_args=extra)
    epp.start(wait="listening")
    try:
        base = f"http://127.0.0.1:{epp.metrics_port}"
        calls = {
            "/debug/endpoints": _call(base + "/debug/endpoints"),
            "/debug/score": _call(base + "/debug/score", BODY),
            "/debug/tokenize": _call(base + "/debug/tokenize", BODY),
        }
        assert _call(base + "/metrics")[0] == 200
        grpc_status = await _list_endpoints(epp.grpc_port)
        assert grpc_status is (grpc.StatusCode.OK if enabled else grpc.StatusCode.UNIMPLEMENTED)
        if enabled:
            assert calls["/debug/endpoints"][0] == 200
            assert json.loads(calls["/debug/endpoints"][1])["endpoints"][0]["address"] == "127.0.0.1:1"
            assert calls["/debug/tokenize"][0] == 200
            assert calls["/debug/score"][0] != 404
        else:
            for path, (status, text) in calls.items():
                assert status == 404, path
                assert "--enable-debug-api" in text, path
            assert _call(base + "/debug/anything-else")[0] == 404
    finally:
        epp.stop()
