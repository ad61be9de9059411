"""Metrics-port auth in the chart, on by default as in GIE's and llm-d's charts: epp runs with
--metrics-endpoint-auth=true, may ask the API server for reviews, and scrapers (the ServiceMonitor)
use the token of a ServiceAccount allowed GET /metrics. Off only when asked, and then said on
the command line (--metrics-endpoint-auth=false), whatever epp's own default. Rendered by the real
Helm SDK, validated by kubernetes-validate."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import chart

MONITORED = {"monitoring": {"serviceMonitor": {"enabled": True}}}
READER = f"{chart.RELEASE}-metrics-reader"


def args(docs: list[dict[str, Any]]) -> list[str]:
    deployment = chart.one(docs, "Deployment", chart.RELEASE)
    out: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return out


@pytest.mark.parametrize("values", [{}, MONITORED], ids=["defaults", "service-monitor"])
def test_metrics_auth_is_on_by_default_as_gie_and_llm_d(values: dict[str, Any]) -> None:
    docs = chart.render(values)
    for doc in docs:
        chart.validate(doc)
    assert "--metrics-endpoint-auth=true" in args(docs)
    reviews = chart.one(docs, "ClusterRole", f"{chart.RELEASE}-{chart.NAMESPACE}-auth-reviews")
    assert {(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in reviews["rules"]} == {
        ("authentication.k8s.io", "tokenreviews", ("create",)),
        ("authorization.k8s.io", "subjectaccessreviews", ("create",)),
    }
    binding = chart.one(docs, "ClusterRoleBinding", f"{chart.RELEASE}-{chart.NAMESPACE}-auth-reviews")
    service_account = chart.one(docs, "Deployment", chart.RELEASE)["spec"]["template"]["spec"]
    assert binding["subjects"][0]["name"] == service_account["serviceAccountName"]
    reader = chart.one(docs, "ClusterRole", f"{chart.RELEASE}-{chart.NAMESPACE}-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    secret = chart.one(docs, "Secret", READER)
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == READER
    chart.one(docs, "ServiceAccount", READER)
    for monitor in chart.by_kind(docs, "ServiceMonitor"):
        endpoint = monitor["spec"]["endpoints"][0]
        assert endpoint["authorization"] == {
            "type": "Bearer",
            "credentials": {"name": READER, "key": "token"},
        }


@pytest.mark.parametrize(
    "values",
    [
        {"monitoring": {"metricsAuth": False}},
        {"monitoring": {"metricsAuth": False, "serviceMonitor": {"enabled": True}}},
        {"router": {"monitoring": {"prometheus": {"auth": {"enabled": False}}}}},  # llm-d's key
        {"inferenceExtension": {"monitoring": {"prometheus": {"auth": {"enabled": False}}}}},  # GIE's
    ],
)
def test_auth_off_is_explicit_and_leaves_the_port_open(values: dict[str, Any]) -> None:
    if "router" in values or "inferenceExtension" in values:
        values = {**values, "inferencePool": {"modelServers": {"matchLabels": {"app": "vllm"}}}}
        if "router" in values:
            values["router"]["modelServers"] = {"matchLabels": {"app": "vllm"}}
    docs = chart.render(values)
    assert [a for a in args(docs) if a.startswith("--metrics-endpoint-auth")] == [
        "--metrics-endpoint-auth=false"
    ]
    assert not [d for d in docs if d["metadata"]["name"].endswith(("auth-reviews", "metrics-reader"))]
    for sm in chart.by_kind(docs, "ServiceMonitor"):
        assert "authorization" not in sm["spec"]["endpoints"][0]


def test_llm_ds_reader_secret_name_is_kept() -> None:
    values = {
        "router": {
            "modelServers": {"matchLabels": {"app": "vllm"}},
            "monitoring": {
                "prometheus": {
                    "enabled": True,
                    "auth": {"secretName": "inference-gateway-sa-metrics-reader-secret"},
                }
            },
        }
    }
    docs = chart.render(values)
    assert "--metrics-endpoint-auth=true" in args(docs)
    chart.one(docs, "Secret", "inference-gateway-sa-metrics-reader-secret")
    endpoint = chart.one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["authorization"]["credentials"]["name"] == "inference-gateway-sa-metrics-reader-secret"


def test_without_rbac_only_the_reader_account_and_its_token() -> None:
    docs = chart.render({**MONITORED, "rbac": {"create": False}})
    assert not chart.by_kind(docs, "ClusterRole") and not chart.by_kind(docs, "ClusterRoleBinding")
    chart.one(docs, "Secret", READER)
    assert "--metrics-endpoint-auth=true" in args(docs)
