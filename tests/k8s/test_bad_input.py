"""Bad input from the cluster: a missing or deleted pool (readiness, 503) and invalid pool specs
(last good endpoints kept, one Warning Event per bad resourceVersion)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from epp.api import errors
from epp.datastore import endpoints
from epp.k8s import events, operator
from epp.requestcontrol.director import Director
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from tests.k8s import fake_apiserver as fake
from tests.k8s.conftest import Start, wait_for

NOT_READY = "not ready:"


def names(ds: endpoints.Datastore) -> list[str]:
    return sorted(ep.name for ep in ds.endpoints())


def director(ds: endpoints.Datastore) -> Director:
    cfg = sched_config.load_config(None, Handle(datastore=ds))
    return Director(
        datastore=ds,
        scheduler=cfg.scheduler,
        pre_request=cfg.pre_request,
        response_complete=cfg.response_complete,
    )


async def route(d: Director) -> None:
    body = b'{"model": "m", "prompt": "hello"}'
    ctx = await d.route(path="/v1/completions", headers={}, body=body, subset=None)
    d.finish(ctx, complete=True)


class Transitions:
    """Records what `PoolOperator.readiness()` yields, as `epp serve` consumes it."""

    def __init__(self, op: operator.PoolOperator) -> None:
        self.seen: list[bool] = []
        self._task = asyncio.create_task(self._follow(op))

    async def _follow(self, op: operator.PoolOperator) -> None:
        async for ready in op.readiness():
            self.seen.append(ready)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def test_deleted_pool_goes_not_ready_and_503_then_recovers(
    api: fake.FakeApiServer,
    datastore: endpoints.Datastore,
    start_operator: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    op = await start_operator()
    d = director(datastore)
    await route(d)
    seen = Transitions(op)
    try:
        await wait_for(lambda: seen.seen == [True])
        with caplog.at_level(logging.INFO, logger="epp.k8s.operator"):
            api.delete("inferencepools", "pool")
            await wait_for(lambda: seen.seen == [True, False])
            assert op.reason == "InferencePool default/pool is gone: removed its 1 endpoints"
            for _ in range(3):
                with pytest.raises(errors.ServiceUnavailable) as exc:
                    await route(d)
                assert exc.value.status == 503
                assert exc.value.reason == (
                    "no ready endpoints in the pool: "
                    "InferencePool default/pool is gone: removed its 1 endpoints"
                )
            api.create("inferencepools", fake.pool())
            await wait_for(lambda: seen.seen == [True, False, True])
        assert op.ready and names(datastore) == ["vllm-0-rank-0"]
        await route(d)
    finally:
        await seen.close()
    lines = [r.getMessage() for r in caplog.records]
    assert sum(NOT_READY in line for line in lines) == 1  # once per transition, not per request
    assert sum("ready with 1 endpoints" in line for line in lines) == 1


async def test_missing_pool_is_not_ready_with_a_reason(
    api: fake.FakeApiServer,
    datastore: endpoints.Datastore,
    start_operator: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    with caplog.at_level(logging.WARNING, logger="epp.k8s.operator"):
        op = await start_operator(synced=False)
        await wait_for(lambda: op.reason != "not listed yet")
        await wait_for(lambda: api.watchers == 1)
        api.drop_watches()  # a relist after 410 sees "no pool" again: not logged again
        api.create("pods", fake.pod("vllm-1", "10.0.0.2"))
        api.compact()
        await wait_for(lambda: api.count("inferencepools", watch=False) >= 2)
    assert not op.ready and op.reason == "InferencePool default/pool does not exist"
    assert caplog.text.count(NOT_READY) == 1
    with pytest.raises(errors.ServiceUnavailable):
        await route(director(datastore))
    api.create("inferencepools", fake.pool())
    await wait_for(lambda: op.ready)
    await route(director(datastore))


def _no_selector(o: dict[str, Any]) -> None:
    o["spec"]["selector"] = {}


def _no_ports(o: dict[str, Any]) -> None:
    o["spec"]["targetPorts"] = []


def _port_out_of_range(o: dict[str, Any]) -> None:
    o["spec"]["targetPorts"] = [{"number": 70000}]


def _duplicate_ports(o: dict[str, Any]) -> None:
    o["spec"]["targetPorts"] = [{"number": 8000}, {"number": 8000}]


@pytest.mark.parametrize(
    ("breakage", "said"),
    [
        (_no_selector, "selector is empty"),
        (_no_ports, "needs 1-8 target ports, got 0"),
        (_port_out_of_range, "target port 70000 is not in 1-65535"),
        (_duplicate_ports, "target ports repeat"),
    ],
)
async def test_invalid_spec_keeps_endpoints_and_posts_one_event_per_version(
    api: fake.FakeApiServer,
    datastore: endpoints.Datastore,
    start_operator: Start,
    caplog: pytest.LogCaptureFixture,
    breakage: Any,
    said: str,
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    op = await start_operator()
    await wait_for(lambda: api.watchers == 2)
    with caplog.at_level(logging.ERROR, logger="epp.k8s.operator"):
        bad = api.update("inferencepools", "pool", breakage)
        await wait_for(lambda: len(api.events) == 1)
        # A relist after 410 sees the same bad version again: no second log line nor event.
        api.drop_watches()
        api.create("pods", fake.pod("other", "10.0.0.9", labels={"app": "other"}))
        api.compact()  # history back to the pool's version is gone: 410, then a relist
        await wait_for(lambda: api.count("inferencepools", watch=False) >= 2)
        await wait_for(lambda: api.watchers == 2)
    assert len(api.events) == 1 and caplog.text.count("is invalid") == 1
    event = api.events[0]
    assert (event["type"], event["reason"], event["metadata"]["namespace"]) == (
        "Warning",
        "InvalidPoolSpec",
        "default",
    )
    assert said in event["message"]
    assert event["involvedObject"] == {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "name": "pool",
        "namespace": "default",
        "uid": bad["metadata"]["uid"],
        "resourceVersion": bad["metadata"]["resourceVersion"],
    }
    assert op.ready and names(datastore) == ["vllm-0-rank-0"]  # the last good spec stands

    api.update("inferencepools", "pool", lambda o: o["metadata"]["annotations"].update(x="1"))  # still bad
    await wait_for(lambda: len(api.events) == 2)
    assert api.events[1]["involvedObject"]["resourceVersion"] == str(api.rv)

    api.update("inferencepools", "pool", lambda o: o["spec"].update(fake.pool(ports=(9000,))["spec"]))
    await wait_for(lambda: [ep.hostport for ep in datastore.endpoints()] == ["10.0.0.1:9000"])
    assert op.ready and len(api.events) == 2


async def test_pool_invalid_from_the_start_is_not_ready_until_fixed(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool())
    api.update("inferencepools", "pool", _no_ports)
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    op = await start_operator(synced=False)
    await wait_for(lambda: len(api.events) == 1)
    assert not op.ready
    assert op.reason == "InferencePool default/pool is invalid: needs 1-8 target ports, got 0"
    api.update("inferencepools", "pool", lambda o: o["spec"].update(targetPorts=[{"number": 8000}]))
    await wait_for(lambda: op.ready)
    assert names(datastore) == ["vllm-0-rank-0"]
    api.delete("inferencepools", "pool")
    await wait_for(lambda: not op.ready)
    assert op.reason.startswith("InferencePool default/pool is gone")


async def test_forbidden_event_is_logged_with_the_rbac_hint(
    api: fake.FakeApiServer, start_operator: Start, caplog: pytest.LogCaptureFixture
) -> None:
    api.create("inferencepools", fake.pool())
    op = await start_operator()
    await wait_for(lambda: api.watchers == 2)
    api.fail_next(1, status=403)  # the watches are open: the next request is the event
    with caplog.at_level(logging.WARNING, logger="epp.k8s.events"):
        api.update("inferencepools", "pool", _no_selector)
        await wait_for(lambda: "HTTP 403" in caplog.text)
    assert "epp needs `create` on `events`" in caplog.text
    assert api.events == [] and op.ready


def test_event_messages_are_truncated_to_the_api_limit() -> None:
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ns"}
    body = events.event_body(ref, reason="R", message="x" * 5000, type_="Warning")
    assert len(body["message"]) == events.MAX_MESSAGE and body["message"].endswith("...")
    assert body["metadata"] == {"generateName": "p.", "namespace": "ns"}
