"""epp's image, unchanged, in llm-d Router's charts (v0.10: llm-d-router-gateway and
llm-d-router-standalone) and in GIE's (v1.5: inferencepool and standalone).

What those charts run was rendered with the real Helm SDK by scripts/upstream_facts.py and kept
in upstream/charts.json (no copies of their charts here; CI has no network). For every rendered
case: the EPP container sets no command, so the image's entrypoint (`epp serve`) runs with the
chart's args; `epp serve` accepts every one of those args and finds nothing it cannot honour;
the ports and gRPC health services the chart wires are epp's; the scheduling config the chart
mounts loads; and the chart's RBAC grants what epp reads in that mode.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from epp import cli
from epp.extproc.server import HEALTH_SERVICES
from epp.flags import compat
from epp.k8s import groups, pools
from epp.kvcache.index import BlockIndex
from epp.scheduling import config
from tests.scheduling import builders

from . import chart

FACTS = json.loads((Path(__file__).parent / "upstream" / "charts.json").read_text(encoding="utf-8"))
CASES: dict[str, dict[str, Any]] = FACTS["cases"]


def serve_args(argv: list[str]) -> argparse.Namespace:
    parser = cli.build_parser()
    serve = cli._subparser(parser, "serve")
    try:
        return parser.parse_args(["serve", *compat.normalize_go_flags(argv, serve)])
    except SystemExit as exc:  # argparse's way of refusing
        raise AssertionError(f"epp serve refuses {argv}") from exc


def test_the_facts_name_their_sources() -> None:
    assert FACTS["sources"]["llm-d"]["tag"] == "v0.10.0"
    assert FACTS["sources"]["gie"]["tag"] == "v1.5.0"
    assert {c["chart"] for c in CASES.values()} == {
        "llm-d-router-gateway",
        "llm-d-router-standalone",
        "inferencepool",
        "standalone",
    }


def test_the_image_runs_epp_serve_by_its_entrypoint() -> None:
    containerfile = (chart.ROOT / "Containerfile").read_text(encoding="utf-8")
    (entrypoint,) = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", containerfile, re.M)
    program, *rest = json.loads(entrypoint)
    assert (Path(program).name, rest) == ("epp", ["serve"])
    assert all(case["command"] is None for case in CASES.values())  # args only: the entrypoint runs


@pytest.mark.parametrize("name", sorted(CASES))
def test_epp_serve_takes_every_arg_the_chart_passes(name: str) -> None:
    case = CASES[name]
    args = serve_args(case["args"])
    errors, _ = compat.gie_flag_problems(args)
    assert errors == []
    if args.endpoint_selector:  # pool-less: checked when the source is built
        assert pools.parse_selector(args.endpoint_selector)
        assert pools.parse_target_ports(args.endpoint_target_ports)
    else:
        assert args.pool_name == "vllm-llama" and args.pool_group == pools.GROUP
    assert args.config_file == case["config_file"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_ports_and_health_services_are_epps(name: str) -> None:
    case = CASES[name]
    args = serve_args(case["args"])
    assert case["ports"] == {
        "grpc": args.grpc_port,
        "grpc-health": args.grpc_health_port,
        "metrics": args.metrics_port,
    }
    for probe in (case["readiness"], case["liveness"]):
        assert probe["port"] == args.grpc_health_port
        assert probe["service"] in (*HEALTH_SERVICES, "liveness")
    assert {"NAMESPACE", "POD_NAME"} <= set(case["env"])  # the pool's namespace, the Lease's name


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_mounted_config_loads(name: str) -> None:
    text = CASES[name]["config"]
    assert config.load_config(text, builders.handle(BlockIndex())) is not None


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_charts_rbac_grants_what_epp_reads(name: str) -> None:
    case = CASES[name]
    granted = {tuple(rule) for rule in case["rbac"]}

    def may(group: str, resource: str) -> bool:
        return all((group, resource, verb) in granted for verb in ("get", "list", "watch"))

    args = serve_args(case["args"])
    assert may("", "pods")
    if args.endpoint_selector:
        return  # pool-less: pods only (no pool, objectives or rewrites, as llm-d)
    assert may(pools.GROUP, pools.PLURAL)
    # Whichever group discovery picks (epp.k8s.groups), epp may read both kinds from it. GIE's
    # chart grants the legacy group only, which is the one a GIE v1.5 cluster has.
    readable = [
        g for g in groups.GROUPS if all(may(g, k.plural) for k in (groups.OBJECTIVES, groups.MODEL_REWRITES))
    ]
    assert groups.LEGACY_GROUP in readable
    if case["source"] == "llm-d":
        assert groups.LLMD_GROUP in readable
    if args.ha_enable_leader_election:
        assert all(("coordination.k8s.io", "leases", v) in granted for v in ("get", "create", "update"))


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("gie-inferencepool-image", "inferenceExtension.image.{registry,repository,tag}"),
        ("llm-d-gateway-image", "router.epp.image.{registry,repository,tag}"),
    ],
)
def test_the_readmes_image_override_is_what_the_charts_take(name: str, keys: str) -> None:
    assert CASES[name]["image"] == "REGISTRY/epp:0.1.0"
    readme = " ".join((chart.ROOT / "README.md").read_text(encoding="utf-8").split())
    prefix = keys.split("{")[0]
    for key in keys.split("{")[1].rstrip("}").split(","):
        value = {"registry": "REGISTRY", "repository": "epp", "tag": "0.1.0"}[key]
        assert f"--set {prefix}{key}={value}" in readme, f"README: --set {prefix}{key}={value}"
