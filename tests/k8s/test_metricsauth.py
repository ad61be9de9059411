"""--metrics-endpoint-auth: TokenReview + SubjectAccessReview on the metrics port, as GIE's."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from epp.gateway.processes import EppPorts, ManagedProcess
from epp.k8s import connections, metricsauth
from tests.k8s import fake_apiserver

PROMETHEUS = {"username": "system:serviceaccount:monitoring:prometheus", "groups": ["system:authenticated"]}


@pytest.fixture
async def auth(
    api: fake_apiserver.FakeApiServer, connection: connections.Connection
) -> AsyncIterator[metricsauth.ApiServerAuth]:
    api.users["prom-token"] = PROMETHEUS
    api.users["other-token"] = {"username": "alice"}
    api.grants.add((PROMETHEUS["username"], "/metrics", "get"))
    checker = metricsauth.ApiServerAuth(connection)
    await checker.start()
    yield checker
    await checker.close()


async def test_who_may_scrape(auth: metricsauth.ApiServerAuth) -> None:
    assert await auth.check("", "/metrics", "get") == 401
    assert await auth.check("forged", "/metrics", "get") == 401
    assert await auth.check("other-token", "/metrics", "get") == 403
    assert await auth.check("prom-token", "/metrics", "get") == 200
    assert await auth.check("prom-token", "/debug/score", "post") == 403  # granted /metrics only


async def test_answers_are_cached(api: fake_apiserver.FakeApiServer, auth: metricsauth.ApiServerAuth) -> None:
    assert await auth.check("prom-token", "/metrics", "get") == 200
    assert auth.reviews == 2  # one TokenReview, one SubjectAccessReview
    for _ in range(20):
        assert await auth.check("prom-token", "/metrics", "get") == 200
    assert auth.reviews == 2
    api.grants.clear()  # a revoked grant shows after the allowed TTL, as in Kubernetes
    auth.allowed_ttl = 0.0
    auth._decisions.clear()
    assert await auth.check("prom-token", "/metrics", "get") == 403


async def test_an_unreachable_api_server_is_an_error_not_cached(
    api: fake_apiserver.FakeApiServer, auth: metricsauth.ApiServerAuth
) -> None:
    api.fail_next(1, 403)
    with pytest.raises(metricsauth.ReviewError, match="RBAC: epp needs create on tokenreviews"):
        await auth.check("prom-token", "/metrics", "get")
    assert await auth.check("prom-token", "/metrics", "get") == 200


async def test_epp_serve_protects_its_metrics_port(api: fake_apiserver.FakeApiServer, tmp_path: Path) -> None:
    api.users["prom-token"] = PROMETHEUS
    api.users["other-token"] = {"username": "alice"}
    api.grants.add((PROMETHEUS["username"], "/metrics", "get"))
    config = tmp_path / "kubeconfig"
    config.write_text(fake_apiserver.kubeconfig(api.url, token="s3cret"))
    ports = EppPorts.free()
    argv = [
        sys.executable, "-m", "epp", "serve", "--endpoints", "127.0.0.1:1", "--kubeconfig", str(config),
        "--secure-serving=false", "--bind-address", "127.0.0.1", "--grpc-port", str(ports.grpc),
        "--grpc-health-port", str(ports.health), "--metrics-port", str(ports.metrics),
        "--metrics-endpoint-auth",
    ]  # fmt: skip
    epp = ManagedProcess("epp", argv, tmp_path / "epp.log", env=dict(os.environ))
    epp.start()
    url = f"http://127.0.0.1:{ports.metrics}/metrics"
    try:
        async with aiohttp.ClientSession() as session:

            async def get(token: str | None) -> int:
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with session.get(url, headers=headers) as resp:
                    await resp.read()
                    return resp.status

            first = 0
            for _ in range(200):
                try:
                    first = await get(None)
                    break
                except aiohttp.ClientConnectionError:
                    assert epp.alive(), epp.log_text()
                    await asyncio.sleep(0.05)
            assert first == 401
            assert await get("other-token") == 403
            assert await get("prom-token") == 200
    finally:
        await asyncio.to_thread(epp.stop)
