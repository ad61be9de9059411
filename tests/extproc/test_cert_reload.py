"""--enable-cert-reload: a renewed certificate under --cert-path is served from the next connection."""

from __future__ import annotations

import os
import pathlib
import shutil

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.extproc import server as srv
from epp.extproc import tls
from tests.extproc import helpers as h
from tests.extproc.test_server import free_port


def write_pair(directory: pathlib.Path, key: bytes, cert: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.key").write_bytes(key)
    (directory / "tls.crt").write_bytes(cert)


def rotate_like_a_secret(mount: pathlib.Path, key: bytes, cert: bytes, version: int) -> None:
    """What the kubelet does: a new timestamped dir, then one atomic swap of the ..data symlink."""
    write_pair(mount / f"..v{version}", key, cert)
    tmp = mount / "..data_tmp"
    tmp.symlink_to(f"..v{version}")
    os.replace(tmp, mount / "..data")
    shutil.rmtree(mount / f"..v{version - 1}")


async def handshake_ok(port: int, trusted_cert: bytes) -> bool:
    """A fresh connection that trusts only `trusted_cert`: True if the server presents it."""
    creds = grpc.ssl_channel_credentials(root_certificates=trusted_cert)
    async with grpc.aio.secure_channel(f"localhost:{port}", creds) as channel:
        try:
            res = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.aio.AioRpcError:
            return False
        return bool(res.status == health_pb2.HealthCheckResponse.SERVING)


async def test_a_rotated_secret_is_served_without_a_restart(tmp_path: pathlib.Path) -> None:
    old_key, old_cert = tls.self_signed()
    new_key, new_cert = tls.self_signed()
    mount = tmp_path / "tls"
    write_pair(mount / "..v1", old_key, old_cert)
    (mount / "..data").symlink_to("..v1")
    for name in ("tls.key", "tls.crt"):
        (mount / name).symlink_to(f"..data/{name}")

    director, _ = h.make_director()
    health = srv.Health()
    await health.set(True)
    port = free_port()
    server = srv.build_server(
        director,
        health,
        bind="127.0.0.1",
        port=port,
        credentials=tls.server_credentials(str(mount), reload=True),
    )
    await server.start()
    try:
        assert await handshake_ok(port, old_cert)
        assert not await handshake_ok(port, new_cert)
        rotate_like_a_secret(mount, new_key, new_cert, version=2)
        assert await handshake_ok(port, new_cert)
        assert not await handshake_ok(port, old_cert)
    finally:
        await server.stop(0)


def test_a_half_written_pair_keeps_the_old_certificate(tmp_path: pathlib.Path) -> None:
    key, cert = tls.self_signed()
    other_key, other_cert = tls.self_signed()
    write_pair(tmp_path, key, cert)
    reloader = tls.CertReloader(str(tmp_path))
    assert reloader() is None  # unchanged
    (tmp_path / "tls.crt").write_bytes(other_cert)  # the key is not there yet
    assert reloader() is None
    (tmp_path / "tls.key").write_bytes(other_key)
    assert reloader() is not None and reloader.reloads == 1
    assert reloader() is None  # loaded once, not per connection
    (tmp_path / "tls.crt").write_bytes(b"garbage")
    assert reloader() is None and reloader.reloads == 1


def test_reload_without_a_cert_path_is_refused() -> None:
    with pytest.raises(SystemExit, match="--enable-cert-reload needs --cert-path"):
        tls.server_credentials(None, reload=True)


def test_a_mismatched_pair_is_a_clear_startup_error(tmp_path: pathlib.Path) -> None:
    key, _ = tls.self_signed()
    _, cert = tls.self_signed()
    write_pair(tmp_path, key, cert)
    with pytest.raises(SystemExit, match=r"tls\.key does not belong to tls\.crt"):
        tls.server_credentials(str(tmp_path))
