"""InferenceObjectives: parsing, and the operator's watch keeping the priority store current, in
either API group (llm-d.ai or GIE's legacy inference.networking.x-k8s.io) by llm-d's rule."""

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


LLMD = "inferenceobjectives.llm-d.ai"
LEGACY = "inferenceobjectives"


@pytest.fixture(params=[LLMD, LEGACY])
def group(request: pytest.FixtureRequest, api: fake.FakeApiServer) -> str:
    """The resource key objectives are created in; the other group is not installed."""
    key: str = request.param
    api.installed.discard(LEGACY if key == LLMD else LLMD)
    return key


@pytest.fixture
async def watched(
    api: fake.FakeApiServer, connection: connections.Connection, group: str
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
    api: fake.FakeApiServer, watched: objectives.ObjectiveStore, group: str
) -> None:
    store = watched
    api.create(group, fake.objective("critical", 10))
    api.create(group, fake.objective("batch", -1))
    await wait_for(lambda: store.snapshot() == {"critical": 10, "batch": -1})
    assert store.priority_of("batch") == -1

    def lower(obj: dict[str, Any]) -> None:
        obj["spec"]["priority"] = -5

    api.update(group, "critical", lower)
    await wait_for(lambda: store.priority_of("critical") == -5)
    api.delete(group, "batch")
    await wait_for(lambda: store.snapshot() == {"critical": -5})


async def test_objectives_of_another_pool_are_ignored(
    api: fake.FakeApiServer, watched: objectives.ObjectiveStore, group: str
) -> None:
    store = watched
    api.create(group, fake.objective("theirs", -1, pool="other-pool"))
    api.create(group, fake.objective("ours", 1))
    await wait_for(lambda: store.snapshot() == {"ours": 1})
    assert store.priority_of("theirs") is None

    def move(obj: dict[str, Any]) -> None:
        obj["spec"]["poolRef"]["name"] = "other-pool"

    api.update(group, "ours", move)  # moved to another pool: gone for us
    await wait_for(lambda: store.snapshot() == {})


async def test_objectives_listed_before_start_and_bad_ones_logged(
    api: fake.FakeApiServer,
    connection: connections.Connection,
    caplog: pytest.LogCaptureFixture,
    group: str,
) -> None:
    api.create("inferencepools", fake.pool())
    api.create(group, fake.objective("early", 4))
    bad = fake.objective("bad")
    bad["spec"]["priority"] = 1.5
    api.create(group, bad)
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
    assert api.count(LLMD, watch=False) == api.count(LEGACY, watch=False) == 0
    assert not [path for path, _ in api.requests if path.startswith("/apis/llm-d.ai")]


# ---- llm-d's rule when both groups are installed (PR #1449) ----------------------------------------


async def start(
    connection: connections.Connection, store: objectives.ObjectiveStore, recheck: float = 60.0
) -> operator.PoolOperator:
    op = operator.PoolOperator(
        endpoints.Datastore(),
        connection=connection,
        namespace="default",
        pool_name="pool",
        settings=FAST,
        objective_store=store,
        recheck=recheck,
    )
    await op.start()
    await asyncio.wait_for(op.wait_synced(), 2.0)
    return op


async def test_both_groups_installed_reads_only_llm_d_ai(
    api: fake.FakeApiServer, connection: connections.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    api.create("inferencepools", fake.pool())
    api.create(LEGACY, fake.objective("legacy-only", -3))
    api.create(LEGACY, fake.objective("both", -3))
    api.create(LLMD, fake.objective("both", 7))
    store = objectives.ObjectiveStore()
    with caplog.at_level(logging.INFO, logger="epp.k8s.groups"):
        op = await start(connection, store)
        try:
            await wait_for(lambda: store.snapshot() == {"both": 7})
            api.create(LEGACY, fake.objective("later", 1))  # still ignored
            api.create(LLMD, fake.objective("new", 2))
            await wait_for(lambda: store.snapshot() == {"both": 7, "new": 2})
        finally:
            await op.stop()
    assert api.count(LEGACY, watch=False) == api.count(LEGACY, watch=True) == 0
    assert "epp reads llm-d.ai only and IGNORES the inference.networking.x-k8s.io objects" in caplog.text


async def test_legacy_group_alone_is_read_with_a_deprecation_note(
    api: fake.FakeApiServer, connection: connections.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    api.installed.discard(LLMD)
    api.create("inferencepools", fake.pool())
    api.create(LEGACY, fake.objective("old", -1))
    store = objectives.ObjectiveStore()
    with caplog.at_level(logging.INFO, logger="epp.k8s.groups"):
        op = await start(connection, store)
        try:
            await wait_for(lambda: store.snapshot() == {"old": -1})
        finally:
            await op.stop()
    assert (
        "DEPRECATION: inference.networking.x-k8s.io/v1alpha2 InferenceObjective is deprecated; "
        "replacement: llm-d.ai/v1alpha2 InferenceObjective" in caplog.text
    )


async def test_no_crd_is_warned_once_and_found_once_installed(
    api: fake.FakeApiServer, connection: connections.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    api.installed -= {LLMD, LEGACY}
    api.create("inferencepools", fake.pool())
    store = objectives.ObjectiveStore()
    with caplog.at_level(logging.WARNING, logger="epp.k8s.groups"):
        op = await start(connection, store, recheck=0.05)
        try:
            await wait_for(lambda: sum(p == "/apis/llm-d.ai/v1alpha2" for p, _ in api.requests) >= 3)
            assert caplog.text.count("InferenceObjective is not installed") == 1
            api.installed.add(LLMD)  # the CRD is applied while epp runs
            api.create(LLMD, fake.objective("late", 5))
            await wait_for(lambda: store.snapshot() == {"late": 5})
        finally:
            await op.stop()


async def test_discovery_errors_are_retried(
    api: fake.FakeApiServer, connection: connections.Connection
) -> None:
    api.installed.discard(LEGACY)
    api.create("inferencepools", fake.pool())
    api.create(LLMD, fake.objective("x", 1))
    store = objectives.ObjectiveStore()
    api.fail_next(2, 503)  # the pool's list and the first discovery (or both discoveries)
    op = await start(connection, store)
    try:
        await wait_for(lambda: store.snapshot() == {"x": 1})
    finally:
        await op.stop()
