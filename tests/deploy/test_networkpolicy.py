"""The chart's optional NetworkPolicy: rendered by the real Helm SDK, validated by
kubernetes-validate (strict), and checked for who may reach which port of epp's pods. Also the
Istio example's header stripping, against epp's own Envoy config."""

from __future__ import annotations

from typing import Any

import pytest

from epp.gateway import envoy
from tests.deploy import chart

GATEWAY = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "istio-system"}}}
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
SERVERS = {"app": "vllm"}


def policy(values: dict[str, Any]) -> dict[str, Any]:
    docs = chart.render(values)
    doc = chart.one(docs, "NetworkPolicy", chart.RELEASE)
    chart.validate(doc)
    return doc


def rules(doc: dict[str, Any]) -> dict[int, list[dict[str, Any]] | None]:
    """Port -> the peers allowed (None: anyone)."""
    out: dict[int, list[dict[str, Any]] | None] = {}
    for rule in doc["spec"]["ingress"]:
        for port in rule["ports"]:
            out[int(port["port"])] = rule.get("from")
    return out


def test_off_by_default() -> None:
    assert not chart.by_kind(chart.render(), "NetworkPolicy")


def test_gateway_health_and_scrapers() -> None:
    doc = policy({"networkPolicy": {"enabled": True, "gateways": [GATEWAY], "metricsScrapers": [PROMETHEUS]}})
    assert doc["spec"]["policyTypes"] == ["Ingress"]
    epp_labels = chart.one(chart.render(), "Deployment", chart.RELEASE)["spec"]["selector"]["matchLabels"]
    assert doc["spec"]["podSelector"]["matchLabels"] == epp_labels
    assert rules(doc) == {9002: [GATEWAY], 9003: None, 9090: [PROMETHEUS]}


def test_metrics_closed_without_scrapers_and_the_charts_envoy_admitted() -> None:
    doc = policy({"networkPolicy": {"enabled": True}, "envoy": {"enabled": True}})
    allowed = rules(doc)
    assert 9090 not in allowed
    (envoy_peer,) = allowed[9002] or []
    envoy_pods = chart.one(chart.render({"envoy": {"enabled": True}}), "Deployment", f"{chart.RELEASE}-envoy")
    assert envoy_peer["podSelector"]["matchLabels"] == envoy_pods["spec"]["template"]["metadata"]["labels"]


def test_bind_mode_admits_only_the_model_servers() -> None:
    values: dict[str, Any] = {
        "replicas": 1,
        "networkPolicy": {"enabled": True, "gateways": [GATEWAY]},
        "epp": {"kvEvents": {"mode": "bind", "bindAddress": "tcp://*:6000"}},
        "inferencePool": {"create": True, "selector": SERVERS},
    }
    assert rules(policy(values))[6000] == [{"podSelector": {"matchLabels": SERVERS}}]
    values["networkPolicy"]["modelServers"] = {"podSelector": {"role": "decode"}, "namespaceSelector": {}}
    assert rules(policy(values))[6000] == [{"podSelector": {"matchLabels": {"role": "decode"}}}]


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"networkPolicy": {"enabled": True}}, "nothing could reach ext-proc"),
        (
            {
                "networkPolicy": {"enabled": True, "gateways": [GATEWAY]},
                "epp": {"kvEvents": {"mode": "bind"}},
            },
            "modelServers",
        ),
    ],
)
def test_policies_that_would_lock_out_traffic_are_refused(values: dict[str, Any], said: str) -> None:
    with pytest.raises(Exception, match=said):
        chart.render(values)


def test_lint_is_clean_with_the_policy() -> None:
    report = chart.lint({"networkPolicy": {"enabled": True, "gateways": [GATEWAY]}})
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []  # 1: "icon is recommended"


def test_istio_example_strips_client_control_headers_as_epps_envoy() -> None:
    docs = chart.render({"istio": {"envoyFilter": {"enabled": True}}})
    patches = chart.one(docs, "EnvoyFilter")["spec"]["configPatches"]
    (strip,) = [p for p in patches if p["applyTo"] == "NETWORK_FILTER"]
    assert strip["patch"]["operation"] == "MERGE"
    hcm = strip["patch"]["value"]["typed_config"]
    envoy_config = envoy.gateway_config(envoy.GatewayParams(listen_port=8081, admin_port=19000))
    ours = envoy_config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["early_header_mutation_extensions"] == ours["early_header_mutation_extensions"]
    assert hcm["@type"] == ours["@type"]


def test_the_envoy_sidecars_port_is_open_and_ext_proc_stays_in_the_pod() -> None:
    docs = chart.render({"networkPolicy": {"enabled": True}, "envoy": {"enabled": True, "mode": "sidecar"}})
    rules = chart.one(docs, "NetworkPolicy")["spec"]["ingress"]
    ports = [r["ports"][0]["port"] for r in rules]
    assert 9002 not in ports  # ext-proc: loopback only
    (envoy_rule,) = [r for r in rules if r["ports"][0]["port"] == 8081]
    assert "from" not in envoy_rule  # clients, from anywhere
