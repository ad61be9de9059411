"""The facts epp's deploy tests keep of llm-d Router's and GIE's releases (CI has no network and
keeps no copies of their charts or CRDs: only these facts).

    .venv/bin/python scripts/upstream_facts.py --llm-d PATH --gie PATH

PATH is a git repository (a clone, bare or not) of llm-d/llm-d-router and of
kubernetes-sigs/gateway-api-inference-extension; files are taken from the tags in SOURCES (`git
archive`). Two files are written under tests/deploy/upstream/:

- charts.json (tests/deploy/test_upstream_charts.py): each case of CASES rendered with the real
  Helm SDK as `helm install vllm-llama --namespace llm` would, after Helm's own `dependency
  update` vendors the charts' `file://` library chart. Per case: the EPP pod's containers, the
  Deployments and Services (ports), the EPP container (image, command, args, ports, probes,
  environment names), the scheduling config the args name (from the chart's ConfigMap), the
  RBAC rules the chart grants, and the InferencePool and InferenceObjectives it creates; and
  the names of llm-d's EPP flags (`pkg/epp/server/options.go`).
- crds.json (tests/deploy/test_crd_admission.py): the InferenceObjective and
  InferenceModelRewrite CRDs of both API groups (llm-d.ai from llm-d, the legacy
  inference.networking.x-k8s.io from GIE v1.5): names, version flags, printer columns and the
  schema with every `description` removed.

To follow a new release, change the tag and run this again.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "deploy" / "upstream"

SOURCES = {
    "llm-d": ("llm-d/llm-d-router", "v0.10.0"),
    "gie": ("kubernetes-sigs/gateway-api-inference-extension", "v1.5.0"),
}
RELEASE, NAMESPACE = "vllm-llama", "llm"
MODEL_SERVERS = {"matchLabels": {"app": "vllm-llama"}}

# (case name, source, chart directory under config/charts, values): the defaults, then the
# values that change the EPP's arguments (replicas -> leader election, flags, auth, tracing,
# pool-less mode, the proxy's modes) and the image override the README gives.
CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "llm-d-gateway",
        "llm-d",
        "llm-d-router-gateway",
        {
            "router": {
                "modelServers": MODEL_SERVERS,
                "inferenceObjectives": [{"name": "batch", "priority": -1}],
            }
        },
    ),
    (
        "llm-d-gateway-ha-flags",
        "llm-d",
        "llm-d-router-gateway",
        {
            "router": {
                "modelServers": MODEL_SERVERS,
                "epp": {
                    "replicas": 2,
                    "flags": {"v": 2, "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc"},
                },
                "monitoring": {"prometheus": {"auth": {"enabled": False}}},
                "tracing": {"enabled": True},
            }
        },
    ),
    (
        "llm-d-gateway-image",
        "llm-d",
        "llm-d-router-gateway",
        {
            "router": {
                "modelServers": MODEL_SERVERS,
                "epp": {"image": {"registry": "REGISTRY", "repository": "epp", "tag": "0.1.0"}},
            }
        },
    ),
    # The model server's engine and the request parsers: their default-plugins.yaml changes.
    *(
        (
            f"llm-d-gateway-{engine}",
            "llm-d",
            "llm-d-router-gateway",
            {"router": {"modelServers": {**MODEL_SERVERS, "type": engine}}},
        )
        for engine in ("sglang", "trtllm-serve", "triton-tensorrt-llm", "triton")
    ),
    (
        "llm-d-gateway-parsers",
        "llm-d",
        "llm-d-router-gateway",
        {
            "router": {
                "modelServers": MODEL_SERVERS,
                "epp": {"parsers": ["openai-parser", "anthropic-parser"]},
            }
        },
    ),
    # llm-d's render sidecar: its defaults, and the shape of llm-d's precise-prefix perf config.
    (
        "llm-d-gateway-render-sidecar",
        "llm-d",
        "llm-d-router-gateway",
        {
            "router": {
                "modelServers": MODEL_SERVERS,
                "tokenizer": {"enabled": True, "modelName": "Qwen/Qwen3-8B"},
            }
        },
    ),
    (
        "llm-d-gateway-render-sidecar-custom",
        "llm-d",
        "llm-d-router-gateway",
        {
            "router": {
                "modelServers": MODEL_SERVERS,
                "tokenizer": {
                    "enabled": True,
                    "modelName": "Qwen/Qwen3-8B",
                    "image": {
                        "registry": "docker.io",
                        "repository": "vllm/vllm-openai-cpu",
                        "tag": "v0.21.0",
                    },
                    "port": 8100,
                    "env": [{"name": "HF_HOME", "value": "/tmp/hf/hub"}],
                    "args": ["Qwen/Qwen3-8B", "--port=8100", "--max-model-len=131072"],
                    "extraArgs": ["--enable-auto-tool-choice"],
                    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                    "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
                    "volumes": [{"name": "models", "emptyDir": {}}],
                    "volumeMounts": [{"name": "models", "mountPath": "/models"}],
                },
                "epp": {
                    "pluginsConfigFile": "render.yaml",
                    "pluginsCustomConfig": {
                        "render.yaml": (
                            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
                            "- type: token-producer\n  parameters:\n    modelName: Qwen/Qwen3-8B\n"
                            "    vllm: {url: 'http://localhost:8100'}\n- type: prefix-cache-scorer\n"
                            "schedulingProfiles:\n- name: default\n  plugins:\n"
                            "  - pluginRef: prefix-cache-scorer\n"
                        )
                    },
                },
            }
        },
    ),
    # GKE: its health-check and backend policies, and Google Managed Prometheus (the legacy
    # provider.name gke maps to it), on GKE Standard and Autopilot.
    (
        "llm-d-gateway-gke",
        "llm-d",
        "llm-d-router-gateway",
        {
            "router": {"modelServers": MODEL_SERVERS, "monitoring": {"prometheus": {"enabled": True}}},
            "provider": {"name": "gke"},
        },
    ),
    (
        "llm-d-gateway-gke-autopilot-health-port",
        "llm-d",
        "llm-d-router-gateway",
        {
            "router": {
                "modelServers": {**MODEL_SERVERS, "targetPorts": [{"number": 8200}]},
                "epp": {"grpcHealthPort": 9005},
                "monitoring": {
                    "prometheus": {"enabled": True},
                    "provider": {"name": "gmp", "gmp": {"autopilot": True}},
                },
            },
            "provider": {"name": "gke"},
        },
    ),
    # GKE's preferred backends: the EPP a StatefulSet, a Service and a backend tier per pod.
    (
        "llm-d-gateway-gke-preferred-backends",
        "llm-d",
        "llm-d-router-gateway",
        {
            "router": {"modelServers": MODEL_SERVERS},
            "provider": {
                "name": "gke",
                "gke": {
                    "preferredBackends": {
                        "enabled": True,
                        "preferredReplicas": 2,
                        "defaultReplicas": 2,
                        "maxRatePerEndpoint": 50,
                    }
                },
            },
        },
    ),
    ("llm-d-standalone", "llm-d", "llm-d-router-standalone", {"router": {"modelServers": MODEL_SERVERS}}),
    (
        "llm-d-standalone-selector",
        "llm-d",
        "llm-d-router-standalone",
        {
            "router": {
                "inferencePool": {"create": False},
                "modelServers": {**MODEL_SERVERS, "targetPorts": [{"number": 8000}, {"number": 8001}]},
            }
        },
    ),
    (
        "llm-d-standalone-service-proxy",
        "llm-d",
        "llm-d-router-standalone",
        {
            "router": {
                "inferencePool": {"create": False},
                "modelServers": MODEL_SERVERS,
                "proxy": {"mode": "service"},
            }
        },
    ),
    (
        "llm-d-standalone-agentgateway",
        "llm-d",
        "llm-d-router-standalone",
        {
            "router": {
                "inferencePool": {"create": False},
                "modelServers": MODEL_SERVERS,
                "proxy": {"proxyType": "agentgateway"},
            }
        },
    ),
    (
        "gie-inferencepool",
        "gie",
        "inferencepool",
        # not inferenceObjectives: v1.5's template for them fails to render (a nil .Values in a range)
        {"inferencePool": {"modelServers": MODEL_SERVERS}},
    ),
    (
        "gie-inferencepool-ha-flags",
        "gie",
        "inferencepool",
        {
            "inferencePool": {"modelServers": MODEL_SERVERS},
            "inferenceExtension": {
                "replicas": 2,
                "flags": {"v": 3},
                "monitoring": {"prometheus": {"auth": {"enabled": False}}},
                "tracing": {"enabled": True},
            },
        },
    ),
    *(
        (
            f"gie-inferencepool-{engine}",
            "gie",
            "inferencepool",
            {"inferencePool": {"modelServers": MODEL_SERVERS, "modelServerType": engine, **parser}},
        )
        for engine, parser in (
            ("sglang", {}),
            ("trtllm-serve", {"parser": "passthrough-parser"}),
            ("triton-tensorrt-llm", {}),
        )
    ),
    (
        "gie-inferencepool-gke",
        "gie",
        "inferencepool",
        {
            "inferencePool": {"modelServers": MODEL_SERVERS},
            "inferenceExtension": {"monitoring": {"prometheus": {"enabled": True}}},
            "provider": {"name": "gke"},
        },
    ),
    (
        "gie-inferencepool-image",
        "gie",
        "inferencepool",
        {
            "inferencePool": {"modelServers": MODEL_SERVERS},
            "inferenceExtension": {"image": {"registry": "REGISTRY", "repository": "epp", "tag": "0.1.0"}},
        },
    ),
    (
        "gie-standalone-selector",
        "gie",
        "standalone",
        {
            "inferenceExtension": {
                "endpointsServer": {"createInferencePool": False, "endpointSelector": "app=vllm-llama"}
            }
        },
    ),
]

# Cases whose values are the chart's own values.yaml (what `helm show values` prints and users
# copy to edit) with the case's values merged over it: the file is kept as the case's values.
SHOWN_VALUES_CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "llm-d-standalone-shown-values",
        "llm-d",
        "llm-d-router-standalone",
        {"router": {"modelServers": MODEL_SERVERS}},
    ),
]


def merged(base: Any, extra: Any) -> Any:
    """`extra` over `base`, maps merged key by key as Helm merges values files."""
    if not (isinstance(base, dict) and isinstance(extra, dict)):
        return extra
    return {**base, **{k: merged(base.get(k), v) for k, v in extra.items()}}


CRDS = {
    "llm-d": ["llm-d.ai_inferenceobjectives.yaml", "llm-d.ai_inferencemodelrewrites.yaml"],
    "gie": [
        "inference.networking.x-k8s.io_inferenceobjectives.yaml",
        "inference.networking.x-k8s.io_inferencemodelrewrites.yaml",
    ],
}


FLAGS_FILE = "pkg/epp/server/options.go"  # llm-d's EPP flags (AddFlags)


def llmd_flags(repo: Path, tag: str) -> list[str]:
    """The flag names llm-d's EPP registers in AddFlags at `tag`."""
    text = subprocess.run(
        ["git", "-C", str(repo), "show", f"{tag}:{FLAGS_FILE}"], check=True, capture_output=True, text=True
    ).stdout
    return sorted(set(re.findall(r'fs\.\w+\(\s*&?[\w.\[\]]+,\s*"([a-z0-9-]+)"', text)))


def strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def crd_facts(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    spec = crd["spec"]
    (version,) = spec["versions"]
    return {
        "group": spec["group"],
        "names": spec["names"],
        "scope": spec["scope"],
        "version": {k: version[k] for k in ("name", "served", "storage", "subresources")},
        "printerColumns": version.get("additionalPrinterColumns", []),
        "openAPIV3Schema": strip_descriptions(version["schema"]["openAPIV3Schema"]),
    }


def export(repo: Path, tag: str, into: Path) -> tuple[Path, str]:
    """The tag's config/ in `into` (charts and CRDs), and the tag's commit."""
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", f"{tag}^{{commit}}"], check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = into / "charts.tar"
    with archive.open("wb") as out:
        paths = ["config/charts", "config/crd/bases"]
        subprocess.run(["git", "-C", str(repo), "archive", tag, *paths], check=True, stdout=out)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "config" / "charts", commit


def render(chart: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm_python.Chart.load(chart) as loaded:
        files = loaded.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(files.items()):
        if not path.endswith("NOTES.txt"):
            # Split as Helm does (releaseutil.SplitManifests): a separator need not end its line.
            # GIE's and llm-d's gke.yaml put the next manifest right after one ("---apiVersion"),
            # which a YAML parser reads as one document.
            for part in _SEPARATOR.split(text):
                docs.extend(d for d in yaml.safe_load_all(part) if d)
    return docs


_SEPARATOR = re.compile(r"(?:^|\s*\n)---\s*")


def probe(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if spec is None else spec.get("grpc")


def facts(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (pod,) = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"].endswith("-epp")
    ]
    spec = pod["spec"]["template"]["spec"]
    (epp,) = [c for c in spec["containers"] if c["name"] == "epp"]
    args = [str(a) for a in epp.get("args", [])]
    config_file = ""
    for i, arg in enumerate(args):
        if arg == "--config-file":
            config_file = args[i + 1]
        elif arg.startswith("--config-file="):
            config_file = arg.split("=", 1)[1]
    config_text = None
    if config_file:
        mount = next(
            m for m in epp["volumeMounts"] if config_file.startswith(m["mountPath"].rstrip("/") + "/")
        )
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        config_map = next(
            d
            for d in docs
            if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
        )
        config_text = config_map["data"][config_file.rsplit("/", 1)[1]]
    rules = sorted(
        {
            (group, resource, verb)
            for d in docs
            if d["kind"] in ("Role", "ClusterRole")
            for rule in d.get("rules", [])
            for group in rule.get("apiGroups", [])
            for resource in rule.get("resources", [])
            for verb in rule.get("verbs", [])
        }
    )
    pools = [d["spec"] for d in docs if d["kind"] == "InferencePool"]
    objectives = [
        {"apiVersion": d["apiVersion"], "name": d["metadata"]["name"], "spec": d["spec"]}
        for d in docs
        if d["kind"] == "InferenceObjective"
    ]
    services = {
        d["metadata"]["name"]: sorted((p.get("name", ""), p["port"]) for p in d["spec"]["ports"])
        for d in docs
        if d["kind"] == "Service"
    }
    # Whom each Service selects, and its annotations (GKE's per-pod Services and their NEGs).
    service_routing = {
        d["metadata"]["name"]: {
            "selector": d["spec"].get("selector", {}),
            "annotations": d["metadata"].get("annotations", {}),
        }
        for d in docs
        if d["kind"] == "Service"
    }
    google = [
        {"kind": d["kind"], "name": d["metadata"]["name"], "spec": d["spec"]}
        for d in docs
        if d["kind"] in ("HealthCheckPolicy", "GCPBackendPolicy", "PodMonitoring")
    ]
    gmp_bindings = [
        {"name": d["metadata"]["name"], "role": d["roleRef"]["name"], "subjects": d["subjects"]}
        for d in docs
        if d["kind"] == "RoleBinding" and ":collector:" in d["metadata"]["name"]
    ]
    return {
        # GKE's policies and Google Managed Prometheus (provider.name gke, monitoring gmp).
        "google": google,
        "gmp_bindings": gmp_bindings,
        "containers": [c["name"] for c in spec["containers"]],
        # llm-d's render sidecar (router.tokenizer.enabled), whole, and the pod's volumes and
        # init containers beside it.
        "render_sidecar": next((c for c in spec["containers"] if c["name"] == "vllm-render"), None),
        "init_containers": spec.get("initContainers", []),
        "volumes": spec.get("volumes", []),
        "deployments": sorted(d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"),
        "services": services,
        "pool": pools[0] if pools else None,
        "objectives": objectives,
        "kind": pod["kind"],
        "replicas": pod["spec"].get("replicas"),
        "service_name": pod["spec"].get("serviceName"),
        "pod_management_policy": pod["spec"].get("podManagementPolicy"),
        "service_routing": service_routing,
        "image": epp["image"],
        "command": epp.get("command"),
        "args": args,
        "ports": {p["name"]: p["containerPort"] for p in epp.get("ports", [])},
        "readiness": probe(epp.get("readinessProbe")),
        "liveness": probe(epp.get("livenessProbe")),
        "env": sorted(e["name"] for e in epp.get("env", [])),
        "config_file": config_file,
        "config": config_text,
        "rbac": [list(r) for r in rules],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llm-d", type=Path, required=True, help="a git clone of llm-d/llm-d-router")
    parser.add_argument("--gie", type=Path, required=True, help="a git clone of GIE")
    parser.add_argument("--out", type=Path, default=OUT, help="the directory to write to")
    args = parser.parse_args()
    repos = {"llm-d": args.llm_d, "gie": args.gie}
    out: dict[str, Any] = {"helm_sdk": helm_python.helm_sdk_version(), "sources": {}, "cases": {}}
    crds: dict[str, Any] = {"sources": out["sources"], "crds": {}}
    with tempfile.TemporaryDirectory() as tmp:
        charts: dict[str, Path] = {}
        for key, (name, tag) in SOURCES.items():
            into = Path(tmp) / key
            into.mkdir()
            charts[key], commit = export(repos[key], tag, into)
            out["sources"][key] = {"repository": name, "tag": tag, "commit": commit}
            if key == "llm-d":
                out["llm_d_flags"] = llmd_flags(repos[key], tag)
            for filename in CRDS[key]:
                crds["crds"][filename] = crd_facts(charts[key].parent / "crd" / "bases" / filename)
        vendored: set[Path] = set()
        shown = [
            (
                case,
                source,
                chart_name,
                merged(yaml.safe_load((charts[source] / chart_name / "values.yaml").read_text()), extra),
            )
            for case, source, chart_name, extra in SHOWN_VALUES_CASES
        ]
        for case, source, chart_name, values in CASES + shown:
            chart = charts[source] / chart_name
            if chart not in vendored:
                helm_python.dependency_update(chart)  # the file:// library chart, as `helm dep up`
                vendored.add(chart)
            out["cases"][case] = {
                "source": source,
                "chart": chart_name,
                "values": values,
                **facts(render(chart, values)),
            }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "charts.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    (args.out / "crds.json").write_text(json.dumps(crds, indent=1, sort_keys=True) + "\n")
    print(f"{len(out['cases'])} chart cases, {len(crds['crds'])} CRDs -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
