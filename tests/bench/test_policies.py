"""Every benchmark policy is a loadable EndpointPickerConfig run by epp's own pipeline."""

from __future__ import annotations

import argparse
import importlib.resources
from pathlib import Path

import pytest

from epp.bench.policies import POLICIES
from epp.datastore.endpoints import Datastore
from epp.flowcontrol import config as fc_config
from epp.kvcache.index import BlockIndex
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle

NAMES = [
    "round-robin", "random", "least-request", "load-only", "gie-approx", "llm-d-precise",
    "sglang-cache-aware", "dynamo-cost", "ranvier-bounded", "epp-ttft", "epp",
    "smg-veto", "llm-d-flow-control", "flow-control", "flow-control-requests", "flow-control-fair-share",
]  # fmt: skip


def test_the_issue_names_every_policy_in_order() -> None:
    assert list(POLICIES) == NAMES


def test_each_policy_file_is_a_policy_and_each_policy_but_epp_has_a_file() -> None:
    files = importlib.resources.files("epp.bench").joinpath("policies")
    names = sorted(f.name.removesuffix(".yaml") for f in files.iterdir() if f.name.endswith(".yaml"))
    assert names == sorted(n for n in NAMES if n != "epp")


@pytest.mark.parametrize("name", NAMES)
def test_policy_loads_without_warnings(name: str) -> None:
    policy = POLICIES[name]
    index = BlockIndex() if policy.kv_events else None
    cfg = sched_config.load_config(
        policy.config_text(), Handle(datastore=Datastore(), kv_index=index), allow_experimental=True
    )
    assert cfg.warnings == []
    assert cfg.flow_control is not None
    flow = fc_config.build(cfg.flow_control, cfg.plugins, cfg.saturation_detector)
    assert flow.warnings == []
    assert (flow.config is not None) == (
        name in ("llm-d-flow-control", "flow-control", "flow-control-requests", "flow-control-fair-share")
    )
    # A policy reading the KV index says so (the fast fleet then publishes events); one that does
    # not must load without an index.
    types = {p.type for p in cfg.plugins.values()}
    assert policy.kv_events == bool(types & {"precise-prefix-cache-scorer", "dynamo-cost-scorer"})


def test_epp_is_the_shipped_default_with_kv_events() -> None:
    assert POLICIES["epp"].config_text() == sched_config.default_config_text(precise=True)


def test_all_is_the_routing_comparison_and_admission_the_overload_one() -> None:
    from epp.bench.cli import plan_policies
    from epp.bench.policies import ADMISSION

    class Args:
        policies = "all"

    assert [p.name for p in plan_policies(Args())] == NAMES[:11]  # type: ignore[arg-type]
    Args.policies = "admission"
    assert [p.name for p in plan_policies(Args())] == list(ADMISSION)  # type: ignore[arg-type]


def test_the_live_bench_reads_epps_metrics_only_for_flow_control() -> None:
    # Reading /metrics 10 times a second costs epp CPU, charged to its requests: only the flow
    # control arms, whose queues the bench plots, pay it.
    from epp.bench.gateways import _has_flow_control
    from epp.bench.policies import POLICIES

    assert {n for n, p in POLICIES.items() if _has_flow_control(p.config_text())} == {
        "flow-control",
        "flow-control-requests",
        "flow-control-fair-share",
        "llm-d-flow-control",
    }
    assert _has_flow_control("featureGates: [flowControl=true]")
    assert not _has_flow_control("featureGates: [flowControl=false]")
    assert not _has_flow_control("plugins: []")


def test_flow_control_sends_a_request_to_a_pod_under_its_prefill_limit() -> None:
    # The pool-wide limit says when a request may go; the detector, listed in the profile as its
    # filter, says where: not behind one pod's queued prefills while another has room, whatever
    # GIE's scorers prefer (docs/bench/flow-control.md#flow-control: critical TTFT p99 under
    # 3x 1.95x -> 1.40x its unloaded p99 with the filter).
    from tests.scheduling import builders

    datastore = Datastore()
    cfg = sched_config.load_config(
        POLICIES["flow-control"].config_text(), Handle(datastore=datastore), allow_experimental=True
    )
    behind = builders.endpoint("behind", waiting=0, kv=0.05)
    room = builders.endpoint("room", address="10.0.0.2", waiting=3, kv=0.5)
    behind.prefill_tokens, room.prefill_tokens = 1600, 200  # maxPrefillTokens: 1536
    for _ in range(20):
        result = cfg.scheduler.schedule(builders.request(), [behind, room])
        assert [ep.name for ep in result.targets] == ["room"]
    behind.prefill_tokens = 0  # both under: GIE's scorers choose again, and prefer the idle one
    assert [ep.name for ep in cfg.scheduler.schedule(builders.request(), [behind, room]).targets] == [
        "behind"
    ]


def test_a_config_file_is_an_arm_named_for_the_file(tmp_path: Path) -> None:
    from epp.bench.cli import BenchConfigError, plan_policies
    from epp.bench.policies import ConfigFile

    def parse(policies: str) -> argparse.Namespace:
        return argparse.Namespace(policies=policies, mode="fast")

    mine = tmp_path / "my-config.yaml"
    mine.write_text(sched_config.default_config_text(precise=True))
    arms = plan_policies(parse(f"epp,config:{mine}"))
    assert [a.name for a in arms] == ["epp", "my-config"]
    assert isinstance(arms[1], ConfigFile) and arms[1].kv_events
    assert arms[1].config_text() == POLICIES["epp"].config_text()
    # The shipped baseline of the pod-step-factor A/B (docs/bench/routing.md#pod-step-factors)
    # loads, and says what it turns off.
    shipped = Path(__file__).parents[2] / "docs" / "bench" / "epp-responses-only.yaml"
    (baseline,) = plan_policies(parse(f"config:{shipped}"))
    assert isinstance(baseline, ConfigFile) and baseline.name == "epp-responses-only"
    handle = Handle(datastore=Datastore(), kv_index=BlockIndex())
    cfg = sched_config.load_config(baseline.config_text(), handle)
    assert cfg.warnings == []
    assert cfg.plugins["request-latency-scorer"]._scraped is None  # learnFromMetrics: false
    for bad, why in [
        (f"config:{tmp_path / 'missing.yaml'}", "cannot read it"),
        (f"config:{tmp_path / 'epp.yaml'}", "is a built-in policy's"),
        (f"config:{mine},config:{tmp_path / 'other' / 'my-config.yaml'}", "two arms named 'my-config'"),
    ]:
        (tmp_path / "epp.yaml").write_text("x")
        (tmp_path / "other").mkdir(exist_ok=True)
        (tmp_path / "other" / "my-config.yaml").write_text("x")
        with pytest.raises(BenchConfigError, match=why):
            plan_policies(parse(bad))


def test_live_mode_reads_the_pods_as_each_policys_router_does() -> None:
    """A peer's rule on `epp serve` reads every pod at every refresh, as its router does; epp's own
    run with epp serve's booked pace; what a user passes comes last and wins."""
    from epp.bench.gateways import EppGateway

    off = ["--booked-metrics-interval", "0"]
    peer = EppGateway(POLICIES["gie-approx"], extra_args=["--booked-metrics-interval", "100ms"]).serve_args()
    assert peer[-4:] == [*off, "--booked-metrics-interval", "100ms"]
    own = EppGateway(POLICIES["epp"]).serve_args()
    assert "--booked-metrics-interval" not in own and "--kv-events" in own
