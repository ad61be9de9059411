"""Fixtures for the operator tests: a fake API server, a datastore, operators; no leaked tasks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from epp.datastore import endpoints
from epp.k8s import connections, operator, pools, watching
from tests.k8s import fake_apiserver

# Fast retries so that error paths are exercised in milliseconds.
FAST = watching.WatchSettings(server_timeout=30, read_timeout=5.0, backoff_initial=0.02, backoff_max=0.2)


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    for _ in range(3):
        await asyncio.sleep(0)
    left = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
    assert not left, f"tasks left running: {[t.get_name() for t in left]}"


@pytest.fixture
async def api() -> AsyncIterator[fake_apiserver.FakeApiServer]:
    server = fake_apiserver.FakeApiServer(token="s3cret")
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def connection(api: fake_apiserver.FakeApiServer, tmp_path: Path) -> connections.Connection:
    path = tmp_path / "kubeconfig"
    path.write_text(fake_apiserver.kubeconfig(api.url, token="s3cret"))
    return connections.from_kubeconfig(path)


@pytest.fixture
def datastore() -> endpoints.Datastore:
    return endpoints.Datastore()


Start = Callable[..., Awaitable[operator.PoolOperator]]


@pytest.fixture
async def start_operator(
    datastore: endpoints.Datastore, connection: connections.Connection
) -> AsyncIterator[Start]:
    started: list[operator.PoolOperator] = []

    async def start(
        pool_name: str | None = "pool", pool: pools.PoolSpec | None = None, synced: bool = True
    ) -> operator.PoolOperator:
        op = operator.PoolOperator(
            datastore,
            connection=connection,
            namespace="default",
            pool_name=pool_name,
            pool=pool,
            settings=FAST,
        )
        started.append(op)
        await op.start()
        if synced:
            await asyncio.wait_for(op.wait_synced(), 2.0)
        return op

    yield start
    for op in started:
        await op.stop()


async def wait_for(predicate: Callable[[], object], limit: float = 2.0) -> None:
    """Poll `predicate` every millisecond until it holds; TimeoutError after `limit` seconds."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {limit}s")
        await asyncio.sleep(0.001)
