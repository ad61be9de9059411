"""Helpers for the chart tests: render with the real Helm SDK, validate what comes out.

Rendering goes through helm-python-sdk (Helm's own Go engine via its C library: no helm binary,
no cluster). Kubernetes kinds are checked with kubernetes-validate against the 1.30 schemas in
strict mode (unknown fields fail); InferencePools and InferenceObjectives against our own CRDs'
openAPIV3Schema; the kinds of optional integrations (Istio, Gateway API, Prometheus Operator)
have no schema here and get a structural check only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "epp"
CRDS = ROOT / "crds"
KUBE_VERSION = "1.30"
RELEASE = "epp"
NAMESPACE = "llm"

# Kinds whose schemas kubernetes-validate does not ship (CRDs of other projects).
FOREIGN_KINDS = {
    "networking.istio.io/v1": {"DestinationRule"},
    "networking.istio.io/v1alpha3": {"EnvoyFilter"},
    "gateway.networking.k8s.io/v1": {"HTTPRoute"},
    "monitoring.coreos.com/v1": {"ServiceMonitor"},
    "monitoring.googleapis.com/v1": {"PodMonitoring"},
    "networking.gke.io/v1": {"HealthCheckPolicy", "GCPBackendPolicy"},
}


def render(values: dict[str, Any] | None = None, *, name: str = RELEASE) -> list[dict[str, Any]]:
    """The chart's manifests for `values` (NOTES.txt excluded), as parsed YAML documents."""
    with helm_python.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        rendered = chart.render(values, name=name, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def notes(values: dict[str, Any] | None = None) -> str:
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def crd(filename: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CRDS / filename).read_text(encoding="utf-8"))
    return loaded


def crd_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """The openAPIV3Schema of a one-version CRD."""
    (version,) = doc["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def crd_validator(filename: str) -> jsonschema.protocols.Validator:
    # OpenAPI v3 schemas are close to JSON Schema draft 4; x-kubernetes-* keys are ignored here
    # (CEL rules are checked by the API server, not by this validator).
    return jsonschema.Draft4Validator(crd_schema(crd(filename)))


POOL_VALIDATOR = crd_validator("inference.networking.k8s.io_inferencepools.yaml")
OBJECTIVE_VALIDATORS = {
    f"{group}/v1alpha2": crd_validator(f"{group}_inferenceobjectives.yaml")
    for group in ("llm-d.ai", "inference.networking.x-k8s.io")
}


def validate(doc: dict[str, Any]) -> None:
    """Raise if `doc` is not a valid object of its kind."""
    api_version, kind = doc["apiVersion"], doc["kind"]
    if kind in FOREIGN_KINDS.get(api_version, ()):
        assert doc["metadata"]["name"], doc
        assert isinstance(doc["spec"], dict), doc
        return
    if (api_version, kind) == ("inference.networking.k8s.io/v1", "InferencePool"):
        POOL_VALIDATOR.validate(doc)
        return
    if kind == "InferenceObjective":
        OBJECTIVE_VALIDATORS[api_version].validate(doc)
        return
    kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def lint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return helm_python.lint(
        CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}.0"
    )
