"""Leader election through a Lease (epp.k8s.leader) against the fake API server's Lease API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from epp.k8s import connections, leader
from tests.k8s import fake_apiserver
from tests.k8s.conftest import wait_for

FAST = leader.Timing(lease_duration=0.6, renew_deadline=0.4, retry_period=0.05)
NAME = leader.lease_name("default", "pool")

Make = Callable[..., leader.LeaderElector]


@pytest.fixture
async def electors(connection: connections.Connection) -> AsyncIterator[Make]:
    made: list[leader.LeaderElector] = []

    def make(identity: str, timing: leader.Timing = FAST) -> leader.LeaderElector:
        elector = leader.LeaderElector(
            connection, namespace="default", name=NAME, identity=identity, timing=timing
        )
        made.append(elector)
        return elector

    yield make
    for elector in made:
        await elector.stop()


def holder(api: fake_apiserver.FakeApiServer) -> str:
    return str(api.leases[("default", NAME)]["spec"].get("holderIdentity") or "")


def test_the_lease_is_gies() -> None:
    assert NAME == "epp-default-pool.gateway-api-inference-extension.sigs.k8s.io"
    assert leader.deployment_name("epp-5d8c7b9f4-x2x9z") == "epp"
    with pytest.raises(ValueError, match="POD_NAME"):
        leader.deployment_name("epp")
    with pytest.raises(ValueError, match="lease duration > renew deadline"):
        leader.Timing(lease_duration=10, renew_deadline=10, retry_period=2)


async def test_one_of_two_leads(api: fake_apiserver.FakeApiServer, electors: Make) -> None:
    a, b = electors("a"), electors("b")
    await a.start()
    await b.start()
    await wait_for(lambda: a.leading or b.leading)
    await asyncio.sleep(FAST.lease_duration * 2)  # renewals keep the follower out
    assert [a.leading, b.leading].count(True) == 1
    assert holder(api) == ("a" if a.leading else "b")
    lease = api.leases[("default", NAME)]
    assert lease["spec"]["leaseDurationSeconds"] == 1  # round(0.6)
    assert lease["spec"]["renewTime"].endswith("Z") and "." in lease["spec"]["renewTime"]


async def test_a_released_lease_passes_at_once(api: fake_apiserver.FakeApiServer, electors: Make) -> None:
    a = electors("a")
    await a.start()
    await wait_for(lambda: a.leading)
    b = electors("b", leader.Timing(lease_duration=30, renew_deadline=20, retry_period=0.05))
    await b.start()
    await asyncio.sleep(0.2)
    assert not b.leading
    await a.stop()  # releases
    assert holder(api) == ""
    await wait_for(lambda: b.leading, limit=1.0)  # far less than the 30 s lease
    assert api.leases[("default", NAME)]["spec"]["leaseTransitions"] == 1


async def test_a_crashed_leader_is_replaced_after_the_lease_expires(
    api: fake_apiserver.FakeApiServer, electors: Make
) -> None:
    a, b = electors("a"), electors("b")
    await a.start()
    await wait_for(lambda: a.leading)
    await b.start()
    await a.stop(release=False)  # as a crash: the lease is left to expire
    assert holder(api) == "a"
    loop = asyncio.get_running_loop()
    started = loop.time()
    await wait_for(lambda: b.leading, limit=3.0)
    waited = loop.time() - started
    # Expiry counts from when b saw the record change, with the lease's own (rounded) duration.
    assert waited >= 0.9, waited
    assert holder(api) == "b"


async def test_a_leader_that_cannot_renew_steps_down(
    api: fake_apiserver.FakeApiServer, electors: Make
) -> None:
    a = electors("a")
    changes: list[bool] = []
    a._on_change = changes.append
    await a.start()
    await wait_for(lambda: a.leading)
    api.fail_next(1000, 503)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await wait_for(lambda: not a.leading, limit=2.0)
    assert FAST.renew_deadline * 0.9 <= loop.time() - started < FAST.lease_duration + 0.3
    api._failures.clear()
    await wait_for(lambda: a.leading, limit=2.0)  # it campaigns again once the server is back
    assert changes == [True, False, True]


async def test_conflicting_writes_leave_one_holder(api: fake_apiserver.FakeApiServer, electors: Make) -> None:
    many = [electors(f"e{i}") for i in range(5)]
    await asyncio.gather(*(e.start() for e in many))
    await wait_for(lambda: any(e.leading for e in many))
    await asyncio.sleep(0.3)
    assert sum(e.leading for e in many) == 1
    (winner,) = [e for e in many if e.leading]
    assert holder(api) == winner.identity


async def test_forbidden_is_reported_and_retried(
    api: fake_apiserver.FakeApiServer, electors: Make, caplog: pytest.LogCaptureFixture
) -> None:
    a = electors("a")
    api.fail_next(3, 403)
    await a.start()
    await wait_for(lambda: a.leading, limit=2.0)  # after the three 403s
    assert any("RBAC: epp needs get, create, update on leases" in r.getMessage() for r in caplog.records)
