"""Two `epp serve --ha-enable-leader-election` processes on one pool, against the fake API server:
one leads and is ready, the other is a live follower; SIGTERM hands the Lease over at once."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from epp.gateway.processes import EppPorts, ManagedProcess, grpc_health_status
from epp.k8s import leader
from tests.k8s import fake_apiserver

LEASE = ("default", leader.lease_name("default", "pool"))


async def status(port: int, service: str) -> str:
    return await asyncio.to_thread(grpc_health_status, port, service)


async def until(predicate: Callable[[], Awaitable[bool]], limit: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        if await predicate():
            return
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {limit}s")
        await asyncio.sleep(0.05)


@pytest.fixture(params=[1, 2], ids=["one-process", "two-workers"])
async def replicas(
    api: fake_apiserver.FakeApiServer, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[list[tuple[ManagedProcess, EppPorts]]]:
    # With --workers 2 the supervisor campaigns for the pod and its workers' readiness (the
    # ext-proc port's included) follows its Lease.
    api.create("inferencepools", fake_apiserver.pool())
    api.create("pods", fake_apiserver.pod("vllm-0", "127.0.0.1"))
    config = tmp_path / "kubeconfig"
    config.write_text(fake_apiserver.kubeconfig(api.url, token="s3cret"))
    started: list[tuple[ManagedProcess, EppPorts]] = []
    for name in ("epp-a", "epp-b"):
        ports = EppPorts.free()
        argv = [
            sys.executable, "-m", "epp", "serve",
            "--pool-name", "pool", "--pool-namespace", "default", "--kubeconfig", str(config),
            "--secure-serving=false", "--bind-address", "127.0.0.1",
            "--grpc-port", str(ports.grpc), "--grpc-health-port", str(ports.health),
            "--metrics-port", str(ports.metrics),
            "--ha-enable-leader-election",
            "--ha-lease-duration", "3s", "--ha-renew-deadline", "2s", "--ha-retry-period", "100ms",
            "--zap-encoder", "console", "--workers", str(request.param),
        ]  # fmt: skip
        proc = ManagedProcess(name, argv, tmp_path / f"{name}.log", env={**os.environ, "POD_NAME": name})
        proc.start()
        started.append((proc, ports))
    yield started
    for proc, _ in started:
        await asyncio.to_thread(proc.stop)


async def test_one_replica_leads_and_the_lease_passes_on_sigterm(
    api: fake_apiserver.FakeApiServer, replicas: list[tuple[ManagedProcess, EppPorts]]
) -> None:
    async def one_ready() -> bool:
        states = [await status(p.health, "readiness") for _, p in replicas]
        # With workers the health port (the supervisor's) answers before the ext-proc port (the
        # workers') listens: wait for both.
        serving = [await status(p.grpc, "liveness") for _, p in replicas]
        return sorted(states) == ["NOT_SERVING", "SERVING"] and serving == ["SERVING"] * 2

    await until(one_ready, 30, "exactly one ready replica")
    for _, ports in replicas:  # followers are alive: Kubernetes must not restart them
        assert await status(ports.health, "liveness") == "SERVING"
    states = [await status(p.health, "readiness") for _, p in replicas]
    (leader_proc, leader_ports), (follower_proc, follower_ports) = (
        replicas if states[0] == "SERVING" else replicas[::-1]
    )
    # Every readiness name agrees, the ext-proc port's included (Envoy's health check).
    for service in ("", "inference-extension", "envoy.service.ext_proc.v3.ExternalProcessor"):
        assert await status(leader_ports.health, service) == "SERVING"
        assert await status(follower_ports.grpc, service) == "NOT_SERVING"
    holder = api.leases[LEASE]["spec"]["holderIdentity"]
    assert holder.startswith(leader_proc.name + "_")

    os.kill(leader_proc.pid, signal.SIGTERM)

    async def follower_ready() -> bool:
        return await status(follower_ports.health, "readiness") == "SERVING"

    loop = asyncio.get_running_loop()
    started = loop.time()
    await until(follower_ready, 10, "the follower taking over")
    # Released on shutdown: far sooner than the 3 s lease would expire.
    assert loop.time() - started < 2.5
    assert api.leases[LEASE]["spec"]["holderIdentity"].startswith(follower_proc.name + "_")
    assert await asyncio.to_thread(leader_proc.proc.wait, 10) == 0  # type: ignore[union-attr]
