"""Pure derivation: InferencePool + pods -> endpoint specs; flags for pool-less mode."""

from __future__ import annotations

import pytest

from epp.k8s import pools
from tests.k8s import fake_apiserver as fake


def test_parse_pool() -> None:
    obj = fake.pool(selector={"app": "vllm"}, ports=(8000, 8002), annotations={"epp.dev/model": "m"})
    obj["spec"]["appProtocol"] = "kubernetes.io/h2c"
    spec = pools.parse_pool(obj)
    assert spec.selector == {"app": "vllm"}
    assert spec.target_ports == (8000, 8002)
    assert spec.app_protocol == "kubernetes.io/h2c"
    assert spec.label_selector == "app=vllm"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda o: o["spec"].update(targetPorts=[]), "1-8 target ports"),
        (
            lambda o: o["spec"].update(targetPorts=[{"number": p} for p in range(8000, 8009)]),
            "1-8 target ports",
        ),
        (lambda o: o["spec"].update(targetPorts=[{"number": 1}, {"number": 1}]), "repeat"),
        (lambda o: o["spec"].update(targetPorts=[{"number": 70000}]), "1-65535"),
        (lambda o: o["spec"].update(targetPorts=[{"port": 80}]), "without a number"),
        (lambda o: o["spec"]["selector"].update(matchLabels={}), "empty"),
        (lambda o: o["spec"]["selector"].update(matchLabels={"a b": "c"}), "bad selector"),
    ],
)
def test_parse_pool_rejects(change: object, error: str) -> None:
    obj = fake.pool()
    change(obj)  # type: ignore[operator]
    with pytest.raises(ValueError, match=error):
        pools.parse_pool(obj)


def test_flags() -> None:
    assert pools.parse_selector("app=vllm, role=decode") == {"app": "vllm", "role": "decode"}
    assert pools.parse_target_ports("8000,8001") == (8000, 8001)
    with pytest.raises(ValueError, match="not key=value"):
        pools.parse_selector("app")
    with pytest.raises(ValueError, match="port numbers"):
        pools.parse_target_ports("8000,x")


def test_readiness() -> None:
    assert pools.is_ready(fake.pod("a"))
    assert not pools.is_ready(fake.pod("a", ready=False))
    assert not pools.is_ready(fake.pod("a", None))
    terminating = fake.pod("a")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not pools.is_ready(terminating)
    no_conditions = fake.pod("a")
    del no_conditions["status"]["conditions"]
    assert not pools.is_ready(no_conditions)


def test_endpoints_ranks_ipv6_and_active_ports() -> None:
    spec = pools.PoolSpec(selector={"app": "vllm"}, target_ports=(8000, 8001, 8002))
    v6 = fake.pod("v6", "fd00::5", annotations={pools.KV_EVENTS_PORT_ANNOTATION: "5557"})
    limited = fake.pod("lim", "10.0.0.2", annotations={pools.ACTIVE_PORTS_ANNOTATION: "8000,8002"})
    specs, problems = pools.pool_endpoints([v6, limited], spec)
    assert problems == []
    assert [(s.name, s.port, s.rank) for s in specs] == [
        ("lim-rank-0", 8000, 0),
        ("lim-rank-2", 8002, 2),
        ("v6-rank-0", 8000, 0),
        ("v6-rank-1", 8001, 1),
        ("v6-rank-2", 8002, 2),
    ]
    assert specs[3].hostport == "[fd00::5]:8001"
    assert specs[3].kv_events == "tcp://[fd00::5]:5558"


def test_bad_annotations_are_reported_and_ignored() -> None:
    spec = pools.PoolSpec(selector={"app": "vllm"}, target_ports=(8000,))
    pod = fake.pod(
        "a", annotations={pools.KV_EVENTS_PORT_ANNOTATION: "zmq", pools.ACTIVE_PORTS_ANNOTATION: "eight"}
    )
    specs, problems = pools.pool_endpoints([pod], spec)
    assert [s.kv_events for s in specs] == [None]
    assert len(problems) == 2 and "kv-events-port" in problems[0]
