"""epp's chart takes the EPP values of llm-d Router v0.10's charts (`router.*`, `provider`, llm-d's
`httpRoute` names) and of GIE v1.5's `inferencepool` chart (`inferenceExtension.*`, GIE's forms
under `inferencePool`), and deploys what those charts would: the same pool, pool-less mode,
replicas and leader election, flags, metrics authentication, tracing, objectives and proxy mode.

"What those charts would" is read from their own rendering (upstream/charts.json, made with the
real Helm SDK by scripts/upstream_facts.py): the same values go through epp's chart and both
EPPs' arguments are parsed by `epp serve` and compared setting by setting. A value epp's chart
cannot honour fails the install, naming it and what to use instead.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from epp import cli
from epp.datastore import engines
from epp.flags import compat
from epp.k8s import pools
from epp.kvcache.index import BlockIndex
from epp.scheduling import config as scheduling_config
from tests.scheduling import builders

from . import chart

FACTS: dict[str, Any] = json.loads((Path(__file__).parent / "upstream" / "charts.json").read_text())["cases"]
RELEASE = "vllm-llama"  # the release name the facts were rendered with
EPP_NAME = f"{RELEASE}-epp"


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    return chart.render(copy.deepcopy(values), name=RELEASE)


def deployment(docs: list[dict[str, Any]], name: str = EPP_NAME) -> dict[str, Any]:
    return chart.one(docs, "Deployment", name)


def epp_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = [c for c in deployment(docs)["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
    return c


def serve(argv: list[str]) -> argparse.Namespace:
    parser = cli.build_parser()
    args = parser.parse_args(["serve", *compat.normalize_go_flags(argv, cli._subparser(parser, "serve"))])
    errors, _ = compat.gie_flag_problems(args)
    assert errors == []
    return args


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What an EPP's arguments decide about the deployment, as `epp serve` reads them."""
    selector = pools.parse_selector(args.endpoint_selector) if args.endpoint_selector else None
    ports = pools.parse_target_ports(args.endpoint_target_ports) if args.endpoint_target_ports else None
    return {
        "pool": None if selector else (args.pool_name, args.pool_namespace),
        "selector": selector,
        "ports": ports,
        "leader_election": bool(args.ha_enable_leader_election),
        "metrics_auth": args.metrics_endpoint_auth,
        "tracing": bool(args.tracing),
        "log": compat.log_settings(args)[0],
        "grpc": (args.grpc_port, args.grpc_health_port, args.metrics_port),
        "secure": args.secure_serving,
        "model_server_metrics": (args.model_server_metrics_scheme, args.model_server_metrics_path),
    }


def theirs(case: str) -> dict[str, Any]:
    found = settings(serve(FACTS[case]["args"]))
    if found["metrics_auth"] is None:  # their chart passes nothing: their EPP's default, on
        found["metrics_auth"] = True
    return found


def profile_weights(config: dict[str, Any]) -> list[tuple[str, dict[str, int]]]:
    """Each scheduling profile's scorers and weights, by plugin type."""
    types = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    return [
        (
            profile["name"],
            {types[p["pluginRef"]]: p.get("weight", 1) for p in profile["plugins"] if "weight" in p},
        )
        for profile in config["schedulingProfiles"]
    ]


def engine_and_parsers(text: str) -> tuple[str, list[str]]:
    """What a scheduling config, as `epp serve` loads it, reads the pods' metrics as (the default
    engine's metric names) and which parsers read the requests."""
    loaded = scheduling_config.load_config(text, builders.handle(BlockIndex()))
    engines = loaded.data_layer.metrics.engines
    return (engines.default.name if engines is not None else "vllm"), [p.type for p in loaded.parsers.active]


# Standalone values in epp's chart say `proxy.enabled: true`, which llm-d-router-standalone
# assumes from its own values.yaml (docs/migrate.md).
PROXY = {"router": {"proxy": {"enabled": True}}}


def merged(values: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(values)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


COMPARED = [
    ("llm-d-gateway", {}),
    ("llm-d-gateway-ha-flags", {}),
    ("llm-d-standalone", PROXY),
    ("llm-d-standalone-selector", PROXY),
    ("llm-d-standalone-service-proxy", PROXY),
    # Their values.yaml as `helm show values` prints it (proxy presets and failOpen included).
    ("llm-d-standalone-shown-values", {}),
    ("gie-inferencepool", {"inferenceExtension": {"replicas": 1}}),  # GIE's defaults need a GIE key
    ("gie-inferencepool-ha-flags", {}),
    # The model server's engine and the request parsers shape their default-plugins.yaml.
    ("llm-d-gateway-sglang", {}),
    ("llm-d-gateway-trtllm-serve", {}),
    ("llm-d-gateway-triton-tensorrt-llm", {}),
    ("llm-d-gateway-triton", {}),
    ("llm-d-gateway-parsers", {}),
    ("llm-d-gateway-render-sidecar", {}),
    ("llm-d-gateway-render-sidecar-custom", {}),
    ("llm-d-gateway-gke", {}),
    ("llm-d-gateway-gke-autopilot-health-port", {}),
    ("gie-inferencepool-gke", {"inferenceExtension": {"replicas": 1}}),
    ("gie-inferencepool-sglang", {"inferenceExtension": {"replicas": 1}}),
    ("gie-inferencepool-triton-tensorrt-llm", {"inferenceExtension": {"replicas": 1}}),
]


@pytest.mark.parametrize(("case", "extra"), COMPARED, ids=[c[0] for c in COMPARED])
def test_their_values_give_their_epp(case: str, extra: dict[str, Any]) -> None:
    fact = FACTS[case]
    docs = render(merged(fact["values"], extra))
    for doc in docs:
        chart.validate(doc)
    c = epp_container(docs)
    mine = settings(serve(c["args"][1:]))  # after `serve`: epp's chart sets command [epp]
    assert mine == theirs(case)
    for probe in ("readiness", "liveness"):
        assert c[f"{probe}Probe"]["grpc"] == fact[probe]
    assert {e["name"] for e in c["env"]} >= set(fact["env"])
    pool = chart.by_kind(docs, "InferencePool")
    if fact["pool"] is None:
        assert pool == []
    else:
        spec = pool[0]["spec"]
        ref = spec["endpointPickerRef"]
        assert (ref["name"], ref["port"], ref["failureMode"]) == (
            EPP_NAME,
            fact["pool"]["endpointPickerRef"]["port"],
            "FailOpen",
        )
        assert {k: spec[k] for k in ("selector", "targetPorts", "appProtocol")} == {
            k: fact["pool"][k] for k in ("selector", "targetPorts", "appProtocol")
        }
    config = yaml.safe_load(chart.one(docs, "ConfigMap", f"{EPP_NAME}-config")["data"]["config.yaml"])
    assert profile_weights(config) == profile_weights(yaml.safe_load(fact["config"]))
    mine_text = chart.one(docs, "ConfigMap", f"{EPP_NAME}-config")["data"]["config.yaml"]
    assert engine_and_parsers(mine_text) == engine_and_parsers(fact["config"])
    objectives = [
        {"apiVersion": d["apiVersion"], "name": d["metadata"]["name"], "spec": d["spec"]}
        for d in chart.by_kind(docs, "InferenceObjective")
    ]
    for o in objectives:
        o["spec"]["poolRef"].pop("kind")  # ours names the kind; theirs leaves it to the CRD default
    assert objectives == fact["objectives"]


@pytest.mark.parametrize("case", ["llm-d-gateway-render-sidecar", "llm-d-gateway-render-sidecar-custom"])
def test_llm_ds_render_sidecar_runs_beside_epp_as_in_their_pod(case: str) -> None:
    """router.tokenizer.enabled: the `vllm launch render` container their chart runs (its
    defaults, or the user's image, port, args, env, resources, volumes and init containers), in
    epp's pod. It runs as root, as theirs does: epp's pod user cannot reach /root."""
    fact = FACTS[case]
    docs = render(fact["values"])
    for doc in docs:
        chart.validate(doc)
    spec = deployment(docs)["spec"]["template"]["spec"]
    (sidecar,) = [c for c in spec["containers"] if c["name"] == "vllm-render"]
    assert sidecar.pop("securityContext") == {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}
    assert sidecar == fact["render_sidecar"]
    theirs = [v for v in fact["volumes"] if "configMap" not in v]  # their config volume is epp's own
    assert [v for v in spec["volumes"] if v["name"] in {t["name"] for t in theirs}] == theirs
    assert spec.get("initContainers", []) == fact["init_containers"]


@pytest.mark.parametrize("engine", sorted(engines.BUILTIN))
def test_the_charts_engine_list_is_epps(engine: str) -> None:
    """The chart checks router.modelServers.type against its own list of engines (a template
    cannot read epp/datastore/engines.py): every engine epp maps is accepted and read as such."""
    docs = render({"router": {"modelServers": {"matchLabels": {"app": "v"}, "type": engine}}})
    config = chart.one(docs, "ConfigMap", f"{EPP_NAME}-config")["data"]["config.yaml"]
    assert engine_and_parsers(config)[0] == engine


GOOGLE = ["llm-d-gateway-gke", "llm-d-gateway-gke-autopilot-health-port", "gie-inferencepool-gke"]


@pytest.mark.parametrize("case", GOOGLE)
def test_gke_policies_and_managed_prometheus_as_theirs(case: str) -> None:
    """provider.name gke: their HealthCheckPolicy and GCPBackendPolicy for the pool (and for epp's
    Service off GKE's default health port), and Google Managed Prometheus: a PodMonitoring that
    scrapes with a reader token, whose Secret the GMP collector (in gke-gmp-system on Autopilot)
    may read. The token is epp's reader's (templates/metricsauth.yaml), not a second one."""
    fact = FACTS[case]
    extra = {"inferenceExtension": {"replicas": 1}} if fact["source"] == "gie" else {}
    docs = render(merged(fact["values"], extra))
    for doc in docs:
        chart.validate(doc)
    mine = [d for d in docs if d["kind"] in ("HealthCheckPolicy", "GCPBackendPolicy")]
    assert sorted(
        (d["kind"], d["metadata"]["name"], json.dumps(d["spec"], sort_keys=True)) for d in mine
    ) == sorted(
        (g["kind"], g["name"], json.dumps(g["spec"], sort_keys=True))
        for g in fact["google"]
        if g["kind"] != "PodMonitoring"
    )
    assert chart.by_kind(docs, "ServiceMonitor") == []
    (theirs,) = [g["spec"] for g in fact["google"] if g["kind"] == "PodMonitoring"]
    (monitor,) = chart.by_kind(docs, "PodMonitoring")
    (endpoint,) = monitor["spec"]["endpoints"]
    secret = endpoint["authorization"]["credentials"]["secret"].pop("name")
    for e in theirs["endpoints"]:
        e["authorization"]["credentials"]["secret"].pop("name")
    assert [endpoint] == theirs["endpoints"]
    pod_labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    token = chart.one(docs, "Secret", secret)
    assert token["type"] == "kubernetes.io/service-account-token"
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding" and ":collector:" in d["metadata"]["name"]]
    (their_binding,) = fact["gmp_bindings"]
    assert binding["subjects"] == their_binding["subjects"]
    role = chart.one(docs, "Role", binding["roleRef"]["name"])
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "verbs": ["get", "list", "watch"],
            "resourceNames": [secret],
        }
    ]


def test_gke_preferred_backends_as_theirs() -> None:
    """provider.gke.preferredBackends: epp a StatefulSet of preferred + default pods, each behind
    a Service of its own (a NEG of the ext-proc port), with a GCPBackendPolicy naming its tier
    and, after the first, a gRPC HealthCheckPolicy; the pool's epp the first backup's Service."""
    fact = FACTS["llm-d-gateway-gke-preferred-backends"]
    docs = render(fact["values"])
    for doc in docs:
        chart.validate(doc)
    (pod,) = chart.by_kind(docs, "StatefulSet")
    assert not chart.by_kind(docs, "Deployment")
    assert (pod["kind"], pod["spec"]["replicas"]) == (fact["kind"], fact["replicas"]) == ("StatefulSet", 4)
    assert pod["spec"]["podManagementPolicy"] == fact["pod_management_policy"]
    # epp's governing Service is its headless one (pod DNS names), where llm-d names its first.
    assert chart.one(docs, "Service", pod["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    routing = {
        d["metadata"]["name"]: {
            "selector": d["spec"]["selector"],
            "annotations": d["metadata"].get("annotations", {}),
        }
        for d in docs
        if d["kind"] == "Service" and d["metadata"]["name"] in fact["service_routing"]
    }
    assert routing == fact["service_routing"]
    for name, ports in fact["services"].items():
        mine = {(p["name"], p["port"]) for p in chart.one(docs, "Service", name)["spec"]["ports"]}
        assert {tuple(p) for p in ports} <= mine, name
    pod_labels = pod["spec"]["template"]["metadata"]["labels"]
    assert pod["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (pool,) = chart.by_kind(docs, "InferencePool")
    assert pool["spec"]["endpointPickerRef"]["name"] == fact["pool"]["endpointPickerRef"]["name"]
    mine = [d for d in docs if d["kind"] in ("HealthCheckPolicy", "GCPBackendPolicy")]
    assert sorted(
        (d["kind"], d["metadata"]["name"], json.dumps(d["spec"], sort_keys=True)) for d in mine
    ) == sorted((g["kind"], g["name"], json.dumps(g["spec"], sort_keys=True)) for g in fact["google"])
    (mine_epp,) = [c for c in pod["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
    # Every pod routes alone (no leader election), as llm-d's: the same epp as without the tiers.
    assert mine_epp["args"] == epp_container(render(FACTS["llm-d-gateway"]["values"]))["args"]


def test_an_image_from_registry_repository_and_tag() -> None:
    for case in ("llm-d-gateway-image", "gie-inferencepool-image"):
        values = FACTS[case]["values"]
        assert epp_container(render(values))["image"] == FACTS[case]["image"] == "REGISTRY/epp:0.1.0"
    native = {"image": {"registry": "REGISTRY", "repository": "epp", "tag": "0.1.0"}}
    assert epp_container(chart.render(native, name=RELEASE))["image"] == "REGISTRY/epp:0.1.0"


@pytest.mark.parametrize(
    ("case", "mode"),
    [("llm-d-standalone", "sidecar"), ("llm-d-standalone-service-proxy", "service")],
)
def test_the_standalone_proxy_modes(case: str, mode: str) -> None:
    fact = FACTS[case]
    docs = render(merged(fact["values"], PROXY))
    names = [c["name"] for c in deployment(docs)["spec"]["template"]["spec"]["containers"]]
    envoy_config = yaml.safe_load(chart.one(docs, "ConfigMap", f"{EPP_NAME}-envoy")["data"]["envoy.yaml"])
    (cluster,) = [c for c in envoy_config["static_resources"]["clusters"] if c["name"] == "epp_ext_proc"]
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    service = {p["name"]: p["port"] for p in chart.one(docs, "Service", EPP_NAME)["spec"]["ports"]}
    if mode == "sidecar":  # Envoy beside epp, asking it over loopback, on the Service's http port
        assert names == ["epp", "envoy"] and len(fact["containers"]) == 2
        assert address["socket_address"]["address"] == "127.0.0.1"
        assert service["http"] == dict(map(tuple, fact["services"][EPP_NAME]))["http"] == 8081
    else:  # its own Deployment and Service
        assert names == ["epp"]
        deployment(docs, f"{EPP_NAME}-envoy")
        assert chart.one(docs, "Service", f"{EPP_NAME}-envoy")["spec"]["ports"][0]["port"] == 8081
        assert address["socket_address"]["address"].startswith(f"{EPP_NAME}.")


def test_their_shown_values_install_and_changed_presets_do_not() -> None:
    """`helm show values llm-d-router-standalone > values.yaml`, the model servers' labels filled
    in: it installs (the proxy presets as llm-d ships them configure the proxy epp's chart
    replaces). A preset changed would configure nothing here: refused."""
    values = FACTS["llm-d-standalone-shown-values"]["values"]
    assert values["router"]["proxy"]["presets"]  # the case holds their presets
    docs = render(values)
    envoy_config = yaml.safe_load(chart.one(docs, "ConfigMap", f"{EPP_NAME}-envoy")["data"]["envoy.yaml"])
    hcm = envoy_config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["http_filters"][0]["typed_config"]["failure_mode_allow"] is True  # their failOpen: true
    changed = copy.deepcopy(values)
    changed["router"]["proxy"]["presets"]["envoy"]["image"] = "docker.io/envoyproxy/envoy:distroless-v1.36.0"
    with pytest.raises(helm_python.HelmRenderError, match=r"router\.proxy\.presets"):
        render(changed)


@pytest.mark.parametrize("fail_open", [None, True, False])
def test_the_standalone_proxy_fails_open_as_llm_ds(fail_open: bool | None) -> None:
    """llm-d's values.yaml says `router.proxy.failOpen: true`: unset or true, the proxy sends a
    request epp cannot answer to the pod with the fewest requests; false fails closed."""
    values = merged(FACTS["llm-d-standalone"]["values"], PROXY)
    if fail_open is not None:
        values = merged(values, {"router": {"proxy": {"failOpen": fail_open}}})
    docs = render(values)
    envoy_config = yaml.safe_load(chart.one(docs, "ConfigMap", f"{EPP_NAME}-envoy")["data"]["envoy.yaml"])
    (pods,) = [c for c in envoy_config["static_resources"]["clusters"] if c["name"] == "pods"]
    hcm = envoy_config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = hcm["http_filters"][0]["typed_config"]
    opens = fail_open is not False
    assert ext_proc["failure_mode_allow"] is opens
    assert pods["type"] == ("STRICT_DNS" if opens else "ORIGINAL_DST")
    assert any(d["kind"] == "Service" and d["metadata"]["name"] == f"{EPP_NAME}-pods" for d in docs) is opens


def test_gateway_chart_extras_become_epps() -> None:
    docs = render(
        {
            "router": {
                "modelServers": {"matchLabels": {"app": "vllm-llama"}},
                "monitoring": {
                    "interval": "30s",
                    "prometheus": {"enabled": True, "extraLabels": {"team": "a"}},
                },
                "tracing": {"enabled": True, "otelExporterEndpoint": "http://otel:4317"},
                "epp": {
                    "metricsDataSource": {"scheme": "https", "path": "/m", "insecureSkipVerify": False},
                    "env": [{"name": "X", "value": "1"}],
                    "pluginsConfigFile": "mine.yaml",
                    "pluginsCustomConfig": {
                        "mine.yaml": "kind: EndpointPickerConfig\n",
                        "other.yaml": "x: 1\n",
                    },
                    "extraContainerPorts": [{"name": "debug", "containerPort": 6060}],
                    "podAnnotations": {"a": "b"},
                },
                "extraServicePorts": [{"name": "extra", "port": 1234}],
            },
            "provider": {"name": "istio"},
            "httpRoute": {
                "create": True,
                "inferenceGatewayName": "gw",
                "headerMatches": {"x-route": "llama"},
            },
        }
    )
    c = epp_container(docs)
    args = c["args"]
    assert "--model-server-metrics-scheme=https" in args and "--model-server-metrics-path=/m" in args
    assert "--model-server-metrics-https-insecure-skip-verify=false" in args
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (
        env["X"] == "1"
        and env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel:4317"
        and "--tracing=true" in args
    )
    data = chart.one(docs, "ConfigMap", f"{EPP_NAME}-config")["data"]
    assert data == {"config.yaml": "kind: EndpointPickerConfig\n", "other.yaml": "x: 1\n"}
    assert {"name": "debug", "containerPort": 6060} in c["ports"]
    assert deployment(docs)["spec"]["template"]["metadata"]["annotations"]["a"] == "b"
    assert {"name": "extra", "port": 1234} in chart.one(docs, "Service", EPP_NAME)["spec"]["ports"]
    monitor = chart.one(docs, "ServiceMonitor")
    assert (
        monitor["metadata"]["labels"]["team"] == "a" and monitor["spec"]["endpoints"][0]["interval"] == "30s"
    )
    chart.one(docs, "DestinationRule")
    route = chart.one(docs, "HTTPRoute")
    assert route["spec"]["parentRefs"][0]["name"] == "gw"
    assert route["spec"]["rules"][0]["matches"][0]["headers"] == [
        {"type": "Exact", "name": "x-route", "value": "llama"}
    ]


def test_gie_shaped_pool_values_equal_epps_own() -> None:
    gie = render(
        {
            "inferencePool": {
                "create": True,
                "modelServers": {"matchLabels": {"app": "v"}},
                "targetPorts": [{"number": 8000}, {"number": 8001}],
            }
        }
    )
    own = render({"inferencePool": {"create": True, "selector": {"app": "v"}, "targetPorts": [8000, 8001]}})
    assert chart.one(gie, "InferencePool") == chart.one(own, "InferencePool")
    assert epp_container(gie)["args"] == epp_container(own)["args"]


def test_pool_less_mode() -> None:
    docs = render(
        {
            "pool": {"endpointSelector": {"app": "v", "tier": "a"}},
            "inferencePool": {"targetPorts": [8000, 8001]},
        }
    )
    args = epp_container(docs)["args"]
    assert "--endpoint-selector=app=v,tier=a" in args and "--endpoint-target-ports=8000,8001" in args
    assert not [a for a in args if a.startswith("--pool-name=")]
    assert not chart.by_kind(docs, "InferencePool")
    assert "pool-less" in chart.notes({"pool": {"endpointSelector": {"app": "v"}}})


def test_the_readme_values_of_gie_and_llm_d_lint_clean() -> None:
    for values in (
        {"router": {"modelServers": {"matchLabels": {"app": "v"}}}},
        {
            "inferenceExtension": {"replicas": 1},
            "inferencePool": {"modelServers": {"matchLabels": {"app": "v"}}},
        },
    ):
        report = chart.lint(values)
        assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []


ROUTER = {"modelServers": {"matchLabels": {"app": "v"}}}
REFUSED = [
    (
        {"router": {**ROUTER, "modelServers": {"matchLabels": {"app": "v"}, "type": "tgi"}}},
        "router.modelServers.type=tgi: one of vllm, sglang, trtllm-serve, triton-tensorrt-llm, triton",
    ),
    (
        {
            "router": {
                **ROUTER,
                "modelServers": {"matchLabels": {"app": "v"}, "type": "sglang"},
                "epp": {
                    "pluginsConfigFile": "mine.yaml",
                    "pluginsCustomConfig": {"mine.yaml": "plugins: []"},
                },
            }
        },
        "shape their default-plugins.yaml only",
    ),
    (
        {
            "inferencePool": {"modelServers": {"matchLabels": {"app": "v"}}, "modelServerType": "ollama"},
            "inferenceExtension": {"replicas": 1},
        },
        "inferencePool.modelServerType=ollama: one of",
    ),
    (
        {"router": {**ROUTER, "modelServers": {"matchLabels": {"app": "v"}, "protocol": "grpc"}}},
        "vllmgrpc-parser",
    ),
    ({"router": {**ROUTER, "tokenizer": {"enabled": True}}}, "router.tokenizer.modelName is required"),
    (
        {"router": {**ROUTER, "latencyPredictor": {"enabled": True}}},
        "latency-predictor servers are not built",
    ),
    ({"inferenceExtension": {"parsers": ["openai-parser"]}}, "use inferencePool.parser"),
    (
        {"router": {**ROUTER, "epp": {"pluginsConfigFile": "payload-agnostic.yaml"}}},
        "not in router.epp.pluginsCustomConfig",
    ),
    ({"router": {**ROUTER, "proxy": {"enabled": True, "proxyType": "agentgateway"}}}, "Envoy only"),
    ({"router": {**ROUTER, "proxy": {"enabled": True, "failOpen": "yes"}}}, "failOpen must be a boolean"),
    ({"router": {**ROUTER, "proxy": {"enabled": True, "presets": {}}}}, "router.proxy.presets"),
    (
        {"router": {**ROUTER, "monitoring": {"provider": {"name": "datadog"}}}},
        "one of prometheusoperator, gmp",
    ),
    ({"router": {"inferencePool": {"create": False}}}, "router.modelServers.matchLabels is required"),
    ({"gke": {"preferredBackends": {"enabled": True}}}, "gke.preferredBackends.enabled needs gke.enabled"),
    ({"pool": {"endpointSelector": {"a": "b"}}, "gke": {"enabled": True}}, "pool-less mode has none"),
    ({"router": ROUTER, "inferenceExtension": {"replicas": 1}}, "not both"),
    ({"inferencePool": {"modelServerType": "triton"}}, "with epp's own values the engine is chosen"),
    ({"inferencePool": {"parser": "passthrough-parser"}}, "requestHandler.parsers"),
    ({"pool": {"endpointSelector": {"a": "b"}}, "httpRoute": {"enabled": True}}, "pool-less mode"),
    ({"pool": {"endpointSelector": {"a": "b"}}, "inferencePool": {"create": True}}, "exclude each other"),
]


@pytest.mark.parametrize(("values", "reason"), REFUSED, ids=[r[1] for r in REFUSED])
def test_what_cannot_be_honoured_fails_the_install(values: dict[str, Any], reason: str) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=reason.replace(".", r"\.").replace("(", r"\(")):
        render(values)


@pytest.mark.parametrize(
    "values",
    [
        {"router": {"epp": {"unknown": 1}}},
        {"router": {"modelServers": {"matchLabels": {"app": "v"}, "targetPorts": [{"port": 8000}]}}},
        {"inferenceExtension": {"endpointsServer": {"createInferencePool": False}}},  # GIE's standalone chart
        {"inferencePool": {"targetPorts": [{"number": 0}]}},
    ],
)
def test_unknown_values_are_refused_by_the_schema(values: dict[str, Any]) -> None:
    with helm_python.Chart.load(chart.CHART) as loaded, pytest.raises(helm_python.HelmValuesError):
        loaded.validate_schema(values)
