"""The operator against the fake API server: pool + pods in, datastore endpoints out."""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import pytest

from epp.datastore import endpoints
from epp.k8s import operator, pools
from tests.k8s import fake_apiserver as fake
from tests.k8s.conftest import Start, wait_for

POOL = "k8s:default/pool"


def names(ds: endpoints.Datastore) -> list[str]:
    return sorted(ep.name for ep in ds.endpoints())


def by_name(ds: endpoints.Datastore) -> dict[str, endpoints.EndpointSpec]:
    return {ep.name: ep.spec for ep in ds.endpoints()}


def set_ready(ready: bool) -> Any:
    def change(obj: dict[str, Any]) -> None:
        for c in obj["status"]["conditions"]:
            if c["type"] == "Ready":
                c["status"] = "True" if ready else "False"

    return change


async def test_pool_and_pods_become_endpoints(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool(ports=(8000,)))
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    api.create("pods", fake.pod("vllm-1", "10.0.0.2"))
    api.create("pods", fake.pod("other", "10.0.0.9", labels={"app": "other"}))
    api.create("pods", fake.pod("unready", "10.0.0.3", ready=False))
    api.create("pods", fake.pod("pending", None))
    await start_operator()
    assert names(datastore) == ["vllm-0-rank-0", "vllm-1-rank-0"]
    spec = by_name(datastore)["vllm-0-rank-0"]
    assert (spec.address, spec.port, spec.rank, spec.pod) == ("10.0.0.1", 8000, 0, "vllm-0")
    assert spec.labels == {"app": "vllm"}
    assert spec.model == "" and spec.kv_events is None and spec.kv_replay is None
    assert datastore.synced
    assert {ep.hostport for ep in datastore.candidates()} == {"10.0.0.1:8000", "10.0.0.2:8000"}


async def test_readiness_flip(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    await start_operator()
    api.update("pods", "vllm-0", set_ready(False))
    await wait_for(lambda: names(datastore) == [])
    api.update("pods", "vllm-0", set_ready(True))
    await wait_for(lambda: names(datastore) == ["vllm-0-rank-0"])


async def test_pod_ip_change_replaces_the_endpoint(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    await start_operator()
    before = datastore.endpoints()[0]

    def move(obj: dict[str, Any]) -> None:
        obj["status"]["podIP"] = "10.0.0.7"

    api.update("pods", "vllm-0", move)
    await wait_for(lambda: [ep.hostport for ep in datastore.endpoints()] == ["10.0.0.7:8000"])
    assert datastore.endpoints()[0] is not before  # a new address is a new endpoint (fresh metrics)


async def test_deletion_and_terminating_pods(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    api.create("pods", fake.pod("vllm-1", "10.0.0.2"))
    await start_operator()

    def terminate(obj: dict[str, Any]) -> None:
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"

    api.update("pods", "vllm-0", terminate)  # still Ready, but terminating: no new requests
    await wait_for(lambda: names(datastore) == ["vllm-1-rank-0"])
    api.delete("pods", "vllm-0")
    api.delete("pods", "vllm-1")
    await wait_for(lambda: names(datastore) == [])


async def test_selector_edit_reevaluates_membership(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool(selector={"app": "vllm"}))
    api.create("pods", fake.pod("a", "10.0.0.1", labels={"app": "vllm"}))
    api.create("pods", fake.pod("b", "10.0.0.2", labels={"app": "vllm", "tier": "big"}))
    api.create("pods", fake.pod("c", "10.0.0.3", labels={"app": "sglang", "tier": "big"}))
    await start_operator()
    assert names(datastore) == ["a-rank-0", "b-rank-0"]

    def select_big(obj: dict[str, Any]) -> None:
        obj["spec"]["selector"]["matchLabels"] = {"tier": "big"}

    api.update("inferencepools", "pool", select_big)
    await wait_for(lambda: names(datastore) == ["b-rank-0", "c-rank-0"])
    # Label edits on pods are selector changes too (the watch reports leaving as DELETED).
    api.update("pods", "b", lambda o: o["metadata"]["labels"].pop("tier"))
    await wait_for(lambda: names(datastore) == ["c-rank-0"])
    api.update("pods", "a", lambda o: o["metadata"]["labels"].update(tier="big"))
    await wait_for(lambda: names(datastore) == ["a-rank-0", "c-rank-0"])


async def test_target_ports_edit_gives_one_endpoint_per_port(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool(ports=(8000,)))
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    api.create("pods", fake.pod("vllm-1", "10.0.0.2"))
    await start_operator()
    kept = by_name(datastore)["vllm-0-rank-0"]
    kept_ep = next(ep for ep in datastore.endpoints() if ep.name == "vllm-0-rank-0")

    def two_ports(obj: dict[str, Any]) -> None:
        obj["spec"]["targetPorts"] = [{"number": 8000}, {"number": 8001}]

    api.update("inferencepools", "pool", two_ports)
    await wait_for(lambda: len(datastore.endpoints()) == 4)
    got = by_name(datastore)
    assert sorted(got) == ["vllm-0-rank-0", "vllm-0-rank-1", "vllm-1-rank-0", "vllm-1-rank-1"]
    assert (got["vllm-1-rank-1"].port, got["vllm-1-rank-1"].rank) == (8001, 1)
    assert got["vllm-0-rank-0"] == kept
    assert any(ep is kept_ep for ep in datastore.endpoints())  # unchanged endpoints keep their state

    def other_port(obj: dict[str, Any]) -> None:
        obj["spec"]["targetPorts"] = [{"number": 9000}]

    api.update("inferencepools", "pool", other_port)
    await wait_for(
        lambda: sorted(ep.hostport for ep in datastore.endpoints()) == ["10.0.0.1:9000", "10.0.0.2:9000"]
    )


async def test_pool_deleted_clears_endpoints_and_recreated_restores(
    api: fake.FakeApiServer,
    datastore: endpoints.Datastore,
    start_operator: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    await start_operator()
    with caplog.at_level(logging.WARNING, logger="epp.k8s.operator"):
        api.delete("inferencepools", "pool")
        await wait_for(lambda: names(datastore) == [])
    assert "not ready: InferencePool default/pool is gone: removed its 1 endpoints" in caplog.text
    await wait_for(lambda: api.count("pods", watch=True) >= 1 and api.watchers == 1)  # the pool watch only
    api.create("inferencepools", fake.pool(ports=(8000, 8001)))
    await wait_for(lambda: names(datastore) == ["vllm-0-rank-0", "vllm-0-rank-1"])


async def test_missing_pool_is_not_synced_until_created(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    op = await start_operator(synced=False)
    await wait_for(lambda: api.count("inferencepools", watch=True) >= 1)
    assert not op.synced and not datastore.synced
    api.create("inferencepools", fake.pool())
    await wait_for(lambda: op.synced)
    assert names(datastore) == ["vllm-0-rank-0"]


async def test_invalid_pool_edit_keeps_the_last_good_spec(
    api: fake.FakeApiServer,
    datastore: endpoints.Datastore,
    start_operator: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    await start_operator()
    with caplog.at_level(logging.ERROR, logger="epp.k8s.operator"):
        api.update("inferencepools", "pool", lambda o: o["spec"].update(targetPorts=[]))
        await wait_for(lambda: "is invalid" in caplog.text)
    assert names(datastore) == ["vllm-0-rank-0"]


async def test_watch_connection_dropped_resumes_without_relisting(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    await start_operator()
    await wait_for(lambda: api.watchers == 2)
    lists = api.count("pods", watch=False)
    api.drop_watches()
    api.create("pods", fake.pod("vllm-1", "10.0.0.2"))  # happens while nobody watches
    await wait_for(lambda: names(datastore) == ["vllm-0-rank-0", "vllm-1-rank-0"])
    await wait_for(lambda: api.watchers == 2)
    assert api.count("pods", watch=False) == lists  # resumed from its resourceVersion
    api.delete("pods", "vllm-0")
    await wait_for(lambda: names(datastore) == ["vllm-1-rank-0"])


async def test_410_gone_relists_and_sees_deletions_missed_meanwhile(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    api.create("pods", fake.pod("vllm-1", "10.0.0.2"))
    await start_operator()
    await wait_for(lambda: api.watchers == 2)
    lists = api.count("pods", watch=False)
    # Stop the watches, change things, and forget the history: resuming is impossible.
    api.drop_watches()
    api.delete("pods", "vllm-0")
    api.create("pods", fake.pod("vllm-2", "10.0.0.3"))
    api.compact()
    await wait_for(lambda: names(datastore) == ["vllm-1-rank-0", "vllm-2-rank-0"])
    assert api.count("pods", watch=False) == lists + 1


async def test_bookmarks_advance_the_resource_version(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    api.create("pods", fake.pod("other", "10.0.0.9", labels={"app": "other"}))
    op = await start_operator()
    await wait_for(lambda: api.watchers == 2)
    api.update("pods", "other", lambda o: o["metadata"]["labels"].update(x="1"))  # not ours
    api.bookmark()
    reflector = op._pods
    assert reflector is not None
    await wait_for(lambda: reflector.resource_version == str(api.rv))
    lists = api.count("pods", watch=False)
    api.compact()  # history before now is gone, but the bookmark brought us to now
    api.drop_watches()
    await wait_for(lambda: api.count("pods", watch=True) >= 2)
    api.create("pods", fake.pod("vllm-1", "10.0.0.2"))
    await wait_for(lambda: len(names(datastore)) == 2)
    assert api.count("pods", watch=False) == lists  # without the bookmark: 410 and a relist


async def test_stop_closes_the_watches(api: fake.FakeApiServer, start_operator: Start) -> None:
    api.create("inferencepools", fake.pool())
    op = await start_operator()
    await wait_for(lambda: api.watchers == 2)
    await op.stop()
    await wait_for(lambda: api.watchers == 0)


async def test_api_errors_are_retried_with_backoff(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    api.fail_next(3, status=503)
    started = time.monotonic()
    await start_operator()  # synced despite three failed requests
    assert names(datastore) == ["vllm-0-rank-0"]
    assert time.monotonic() - started >= 0.02 + 0.04 * 0.8  # backed off (jittered 0.02, 0.04, ...)


async def test_unauthorized_is_retried(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("inferencepools", fake.pool())
    api.create("pods", fake.pod("vllm-0", "10.0.0.1"))
    api.token = "rotated"
    op = await start_operator(synced=False)
    await wait_for(lambda: len(api.requests) >= 3)
    assert not op.synced
    api.token = "s3cret"
    await wait_for(lambda: op.synced)


async def test_pool_less_mode(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create("pods", fake.pod("vllm-0", "10.0.0.1", labels={"app": "vllm", "role": "decode"}))
    api.create("pods", fake.pod("vllm-1", "10.0.0.2", labels={"app": "vllm", "role": "prefill"}))
    spec = pools.PoolSpec(selector=pools.parse_selector("app=vllm,role=decode"), target_ports=(8000, 8001))
    op = await start_operator(pool_name=None, pool=spec)
    assert op.source == "k8s:default/selector:app=vllm,role=decode"
    assert names(datastore) == ["vllm-0-rank-0", "vllm-0-rank-1"]
    assert api.count("inferencepools", watch=False) == 0
    api.update("pods", "vllm-1", lambda o: o["metadata"]["labels"].update(role="decode"))
    await wait_for(lambda: len(names(datastore)) == 4)


async def test_annotations_give_model_and_kv_events(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    api.create(
        "inferencepools",
        fake.pool(
            ports=(8000, 8001),
            annotations={pools.MODEL_ANNOTATION: "llama", pools.KV_EVENTS_PORT_ANNOTATION: "5557"},
        ),
    )
    api.create("pods", fake.pod("a", "10.0.0.1"))
    api.create(
        "pods",
        fake.pod(
            "b",
            "10.0.0.2",
            annotations={
                pools.MODEL_ANNOTATION: "qwen",
                pools.KV_EVENTS_PORT_ANNOTATION: "6000",
                pools.KV_REPLAY_PORT_ANNOTATION: "6100",
            },
        ),
    )
    await start_operator()
    got = by_name(datastore)
    assert (got["a-rank-1"].model, got["a-rank-1"].kv_events, got["a-rank-1"].kv_replay) == (
        "llama",
        "tcp://10.0.0.1:5558",
        None,
    )
    assert (got["b-rank-0"].model, got["b-rank-0"].kv_events, got["b-rank-0"].kv_replay) == (
        "qwen",
        "tcp://10.0.0.2:6000",
        "tcp://10.0.0.2:6100",
    )
    assert got["b-rank-1"].kv_replay == "tcp://10.0.0.2:6101"
    # An annotation edit is a metadata change: the endpoint object (and its metrics) stay.
    ep = next(e for e in datastore.endpoints() if e.name == "a-rank-0")
    api.update(
        "pods", "a", lambda o: o["metadata"]["annotations"].update({pools.MODEL_ANNOTATION: "mistral"})
    )
    await wait_for(lambda: ep.spec.model == "mistral")
    assert any(e is ep for e in datastore.endpoints())


async def test_change_to_datastore_latency(
    api: fake.FakeApiServer, datastore: endpoints.Datastore, start_operator: Start
) -> None:
    """Time from an API write to the datastore's change notification, per kind of change."""
    api.create("inferencepools", fake.pool())
    await start_operator()
    changed_at: list[float] = []
    datastore.subscribe(lambda added, removed: changed_at.append(time.perf_counter()))
    samples = []
    for i in range(30):
        n = len(changed_at)
        t0 = time.perf_counter()
        if i % 3 == 0:
            api.create("pods", fake.pod(f"p{i}", f"10.1.0.{i}"))
        elif i % 3 == 1:
            api.update("pods", f"p{i - 1}", set_ready(False))
        else:
            api.delete("pods", f"p{i - 2}")
            api.create("pods", fake.pod(f"p{i - 2}x", f"10.1.0.{i}"))  # a change the datastore sees
        await wait_for(lambda n=n: len(changed_at) > n)  # type: ignore[misc]
        samples.append(changed_at[n] - t0)
    p50, worst = statistics.median(samples), max(samples)
    print(
        f"\nAPI change -> datastore: median {p50 * 1000:.1f} ms, max {worst * 1000:.1f} ms (n={len(samples)})"
    )
    assert worst < 1.0


def test_operator_needs_exactly_one_mode(datastore: endpoints.Datastore) -> None:
    from epp.k8s import connections

    conn = connections.Connection(server="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="exactly one"):
        operator.PoolOperator(datastore, connection=conn, namespace="default")
