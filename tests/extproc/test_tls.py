"""--secure-serving: a mounted certificate (--cert-path) or a self-signed one, over real TLS."""

from __future__ import annotations

import pathlib

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.extproc import server as srv
from epp.extproc import tls
from tests.extproc import helpers as h
from tests.extproc.test_server import free_port


async def test_mounted_certificate_is_served(tmp_path: pathlib.Path) -> None:
    key, cert = tls.self_signed()
    (tmp_path / "tls.key").write_bytes(key)
    (tmp_path / "tls.crt").write_bytes(cert)
    director, _ = h.make_director()
    health = srv.Health()
    await health.set(True)
    port = free_port()
    server = srv.build_server(
        director, health, bind="127.0.0.1", port=port, credentials=tls.server_credentials(str(tmp_path))
    )
    await server.start()
    try:
        # The client trusts exactly the mounted certificate: the handshake proves it is served.
        creds = grpc.ssl_channel_credentials(root_certificates=cert)
        async with grpc.aio.secure_channel(f"localhost:{port}", creds) as channel:
            res = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert res.status == health_pb2.HealthCheckResponse.SERVING
        # A plaintext client cannot talk to it.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
    finally:
        await server.stop(0)


def test_unreadable_cert_path_is_a_clear_startup_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SystemExit, match=r"--cert-path .*tls\.crt/tls\.key"):
        tls.server_credentials(str(tmp_path / "missing"))
