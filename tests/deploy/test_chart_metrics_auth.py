"""Metrics-port auth in the chart, as GIE's chart does it: with the ServiceMonitor on, epp runs
with --metrics-endpoint-auth, may ask the API server for reviews, and Prometheus scrapes with the
token of a ServiceAccount allowed GET /metrics. Rendered by the real Helm SDK, validated by
kubernetes-validate."""

from __future__ import annotations

from typing import Any

from tests.deploy import chart

MONITORED = {"monitoring": {"serviceMonitor": {"enabled": True}}}
READER = f"{chart.RELEASE}-metrics-reader"


def args(docs: list[dict[str, Any]]) -> list[str]:
    deployment = chart.one(docs, "Deployment", chart.RELEASE)
    out: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return out


def test_monitoring_turns_metrics_auth_on_as_gie() -> None:
    docs = chart.render(MONITORED)
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
    endpoint = chart.one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": READER, "key": "token"}}


def test_auth_off_and_no_monitoring_leave_the_port_open() -> None:
    for values in ({}, {"monitoring": {"serviceMonitor": {"enabled": True, "auth": {"enabled": False}}}}):
        docs = chart.render(values)
        assert not [a for a in args(docs) if a.startswith("--metrics-endpoint-auth")]
        assert not [d for d in docs if d["metadata"]["name"].endswith(("auth-reviews", "metrics-reader"))]
        for sm in chart.by_kind(docs, "ServiceMonitor"):
            assert "authorization" not in sm["spec"]["endpoints"][0]


def test_without_rbac_only_the_reader_account_and_its_token() -> None:
    docs = chart.render({**MONITORED, "rbac": {"create": False}})
    assert not chart.by_kind(docs, "ClusterRole") and not chart.by_kind(docs, "ClusterRoleBinding")
    chart.one(docs, "Secret", READER)
    assert "--metrics-endpoint-auth=true" in args(docs)
