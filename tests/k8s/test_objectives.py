"""InferenceObjectives: parsing, and the operator's watch keeping the priority store current."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epp.datastore import endpoints
from epp.k8s import connections, objectives, operator, pools
from tests.k8s import fake_apiserver as fake
from tests.k8s.conftest import FAST, wait_for

# ---- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (fake.objective("a", 3), 3),
        (fake.objective("a", -1), -1),
        (fake.objective("a"), 0),  # unset priority is 0
        (fake.objective("a", 2, group="inference.networking.k8s.io", kind="InferencePool"), 2),
        (fake.objective("a", 2, pool="other"), None),
        (fake.objective("a", 2, group="inference.networking.x-k8s.io"), None),
        (fake.objective("a", 2, kind="Service"), None),
        ({"metadata": {"name": "a"}, "spec": {}}, None),
    ],
)
def test_parse_objective(obj: dict[str, Any], expected: int | None) -> None:
    assert objectives.parse_objective(obj, "pool") == expected


def test_bad_priority_is_a_problem_and_the_objective_is_left_out() -> None:
    bad = fake.objective("bad")
    bad["spec"]["priority"] = "high"
    found, problems = objectives.priorities([fake.objective("ok", 1), bad], "pool")
    assert found == {"ok": 1}
    assert problems == ["InferenceObjective bad is ignored: spec.priority 'high' is not an integer"]
    yes = fake.objective("yes")
    yes["spec"]["priority"] = True  # JSON true is not an integer, though Python's bool is an int
    assert objectives.priorities([yes], "pool")[0] == {}


def test_store() -> None:
    store = objectives.ObjectiveStore()
    assert store.priority_of("a") is None
    store.replace({"a": -2})
    assert store.priority_of("a") == -2
    assert store.snapshot() == {"a": -2}


# ---- the watch through the operator ----------------------------------------------------------------


@pytest.fixture
async def watched(
    api: fake.FakeApiServer, connection: connections.Connection
) -> AsyncIterator[objectives.ObjectiveStore]:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    store = objectives.ObjectiveStore()
    op = operator.PoolOperator(
        endpoints.Datastore(),
        connection=connection,
        namespace="default",
        pool_name="pool",
        settings=FAST,
        objective_store=store,
    )
    await op.start()
    await asyncio.wait_for(op.wait_synced(), 2.0)
    yield store
    await op.stop()


async def test_objectives_are_added_changed_and_deleted(
    api: fake.FakeApiServer, watched: objectives.ObjectiveStore
) -> None:
    store = watched
    api.create("inferenceobjectives", fake.objective("critical", 10))
    api.create("inferenceobjectives", fake.objective("batch", -1))
    await wait_for(lambda: store.snapshot() == {"critical": 10, "batch": -1})
    assert store.priority_of("batch") == -1

    def lower(obj: dict[str, Any]) -> None:
        obj["spec"]["priority"] = -5

    api.update("inferenceobjectives", "critical", lower)
    await wait_for(lambda: store.priority_of("critical") == -5)
    api.delete("inferenceobjectives", "batch")
    await wait_for(lambda: store.snapshot() == {"critical": -5})


async def test_objectives_of_another_pool_are_ignored(
    api: fake.FakeApiServer, watched: objectives.ObjectiveStore
) -> None:
    store = watched
    api.create("inferenceobjectives", fake.objective("theirs", -1, pool="other-pool"))
    api.create("inferenceobjectives", fake.objective("ours", 1))
    await wait_for(lambda: store.snapshot() == {"ours": 1})
    assert store.priority_of("theirs") is None

    def move(obj: dict[str, Any]) -> None:
        obj["spec"]["poolRef"]["name"] = "other-pool"

    api.update("inferenceobjectives", "ours", move)  # moved to another pool: gone for us
    await wait_for(lambda: store.snapshot() == {})


async def test_objectives_listed_before_start_and_bad_ones_logged(
    api: fake.FakeApiServer, connection: connections.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("inferenceobjectives", fake.objective("early", 4))
    bad = fake.objective("bad")
    bad["spec"]["priority"] = 1.5
    api.create("inferenceobjectives", bad)
    store = objectives.ObjectiveStore()
    op = operator.PoolOperator(
        endpoints.Datastore(),
        connection=connection,
        namespace="default",
        pool_name="pool",
        settings=FAST,
        objective_store=store,
    )
    with caplog.at_level(logging.WARNING, logger="epp.k8s.operator"):
        await op.start()
        try:
            await wait_for(lambda: store.snapshot() == {"early": 4})
        finally:
            await op.stop()
    assert "InferenceObjective bad is ignored: spec.priority 1.5 is not an integer" in caplog.text


async def test_pool_less_mode_does_not_watch_objectives(
    api: fake.FakeApiServer, connection: connections.Connection
) -> None:
    store = objectives.ObjectiveStore()
    op = operator.PoolOperator(
        endpoints.Datastore(),
        connection=connection,
        namespace="default",
        pool=pools.PoolSpec(selector={"app": "vllm"}, target_ports=(8000,)),
        settings=FAST,
        objective_store=store,
    )
    await op.start()
    try:
        await asyncio.wait_for(op.wait_synced(), 2.0)
    finally:
        await op.stop()
    assert api.count("inferenceobjectives", watch=False) == 0
