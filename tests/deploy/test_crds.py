"""crds/: valid CustomResourceDefinitions with GIE's and llm-d's names, accepting the documented
samples."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from . import chart

POOL_FILE = "inference.networking.k8s.io_inferencepools.yaml"
OBJECTIVE_FILE = "inference.networking.x-k8s.io_inferenceobjectives.yaml"
DOCS = chart.ROOT / "docs" / "kubernetes.md"


def doc_samples(kind: str) -> list[dict[str, Any]]:
    """The YAML blocks of docs/kubernetes.md that define a `kind`."""
    text = DOCS.read_text(encoding="utf-8")
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    return [b for b in blocks if isinstance(b, dict) and b.get("kind") == kind]


def pool_sample() -> dict[str, Any]:
    (sample,) = doc_samples("InferencePool")
    return sample


def rules(schema: dict[str, Any]) -> list[str]:
    return [r["rule"] for r in schema.get("x-kubernetes-validations", [])]


@pytest.mark.parametrize(
    "filename",
    [
        POOL_FILE,
        OBJECTIVE_FILE,
        "inference.networking.x-k8s.io_inferencemodelrewrites.yaml",
        "llm-d.ai_inferenceobjectives.yaml",
        "llm-d.ai_inferencemodelrewrites.yaml",
    ],
)
def test_crd_validates_as_a_kubernetes_object(filename: str) -> None:
    kubernetes_validate.validate(chart.crd(filename), chart.KUBE_VERSION, strict=True)


@pytest.mark.parametrize(
    ("filename", "group", "version", "kind", "plural"),
    [
        (POOL_FILE, "inference.networking.k8s.io", "v1", "InferencePool", "inferencepools"),
        (
            OBJECTIVE_FILE,
            "inference.networking.x-k8s.io",
            "v1alpha2",
            "InferenceObjective",
            "inferenceobjectives",
        ),
    ],
)
def test_crd_names_match_gie(filename: str, group: str, version: str, kind: str, plural: str) -> None:
    crd = chart.crd(filename)
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{plural}.{group}"
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"]) == (group, kind, plural)
    assert spec["scope"] == "Namespaced"
    (v,) = spec["versions"]
    assert (v["name"], v["served"], v["storage"]) == (version, True, True)
    assert v["subresources"] == {"status": {}}
    # Every schema in the file must itself be a valid JSON schema.
    jsonschema.Draft4Validator.check_schema(chart.crd_schema(crd))


def test_pool_schema_fields_and_limits() -> None:
    crd = chart.crd(POOL_FILE)
    assert crd["spec"]["names"]["shortNames"] == ["infpool"]
    spec = chart.crd_schema(crd)["properties"]["spec"]
    assert spec["required"] == ["selector", "targetPorts"]
    labels = spec["properties"]["selector"]["properties"]["matchLabels"]
    assert (labels["minProperties"], labels["maxProperties"]) == (1, 64)
    ports = spec["properties"]["targetPorts"]
    assert (ports["minItems"], ports["maxItems"]) == (1, 8)
    assert rules(ports) == ["self.all(p1, self.exists_one(p2, p1.number==p2.number))"]
    assert spec["properties"]["appProtocol"]["enum"] == ["http", "kubernetes.io/h2c"]
    ref = spec["properties"]["endpointPickerRef"]
    assert ref["required"] == ["name"]
    assert set(ref["properties"]) == {"group", "kind", "name", "port", "failureMode"}
    failure_mode = ref["properties"]["failureMode"]
    assert (failure_mode["enum"], failure_mode["default"]) == (["FailOpen", "FailClose"], "FailClose")
    assert ref["properties"]["kind"]["default"] == "Service"
    assert any("has(self.port)" in r for r in rules(ref))
    parents = chart.crd_schema(crd)["properties"]["status"]["properties"]["parents"]
    assert parents["maxItems"] == 32
    assert parents["items"]["properties"]["conditions"]["maxItems"] == 8


def test_the_documented_pool_is_valid() -> None:
    sample = pool_sample()
    chart.POOL_VALIDATOR.validate(sample)
    assert sample["spec"]["endpointPickerRef"]["port"] == {"number": 9002}


def test_the_documented_objective_is_valid() -> None:
    (sample,) = doc_samples("InferenceObjective")
    validator = chart.crd_validator(OBJECTIVE_FILE)
    validator.validate(sample)
    assert sample["apiVersion"] == "inference.networking.x-k8s.io/v1alpha2"
    bad = copy.deepcopy(sample)
    bad["spec"]["priority"] = "high"
    assert not validator.is_valid(bad)
    del bad["spec"]["poolRef"]
    assert not validator.is_valid(bad)


def test_a_pool_without_picker_is_valid() -> None:
    # endpointPickerRef is optional in current GIE v1.
    sample = pool_sample()
    del sample["spec"]["endpointPickerRef"]
    chart.POOL_VALIDATOR.validate(sample)


def _with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    sample = pool_sample()
    target: Any = sample
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return sample


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "targetPorts"), []),
        (("spec", "targetPorts"), [{"number": 8000 + i} for i in range(9)]),
        (("spec", "targetPorts"), [{"number": 0}]),
        (("spec", "targetPorts"), [{"number": 65536}]),
        (("spec", "targetPorts"), [{"port": 8000}]),
        (("spec", "selector", "matchLabels"), {}),
        (("spec", "selector", "matchLabels"), {f"k{i}": "v" for i in range(65)}),
        (("spec", "appProtocol"), "grpc"),
        (("spec", "endpointPickerRef", "failureMode"), "FailSometimes"),
        (("spec", "endpointPickerRef", "name"), ""),
        (("spec", "endpointPickerRef", "port"), {"number": 70000}),
    ],
)
def test_invalid_pools_are_rejected(path: tuple[str, ...], value: Any) -> None:
    assert not chart.POOL_VALIDATOR.is_valid(_with(path, value))


def test_rendered_pool_matches_the_documented_shape() -> None:
    docs = chart.render({"inferencePool": {"create": True, "selector": {"app": "vllm-llama"}}})
    rendered = chart.one(docs, "InferencePool")
    assert set(rendered["spec"]) == set(pool_sample()["spec"])
