"""crds/ installs on a real API server and accepts and rejects what the released CRDs do.

GIE's InferencePool CRD (v1.6.0, descriptions removed) is in gie/; the InferenceObjective and
InferenceModelRewrite CRDs of llm-d.ai (llm-d Router v0.10.0) and of the legacy
inference.networking.x-k8s.io (GIE v1.5.0) are in upstream/crds.json (scripts/upstream_facts.py).
Ours must carry the same schemas, defaults and CEL rules, verbatim, and pass the API server's
create-time checks (admission.py): the protected-group approval annotation and the
structural-schema rules.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from . import admission, chart

POOL_FILE = "inference.networking.k8s.io_inferencepools.yaml"
OBJECTIVE_FILE = "inference.networking.x-k8s.io_inferenceobjectives.yaml"
GIE_POOL = yaml.safe_load((Path(__file__).parent / "gie" / "inferencepools-v1.6.0.yaml").read_text())
UPSTREAM_CRDS: dict[str, Any] = json.loads((Path(__file__).parent / "upstream" / "crds.json").read_text())[
    "crds"
]
ALL_FILES = [POOL_FILE, *sorted(UPSTREAM_CRDS)]


def strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def cel_rules(node: Any, path: str = "") -> list[tuple[str, str, str]]:
    """(path, rule, message) of every x-kubernetes-validations entry below `node`."""
    found: list[tuple[str, str, str]] = []
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations", []):
            found.append((path, rule["rule"], rule.get("message", "")))
        for key, child in node.items():
            if key != "x-kubernetes-validations":
                found.extend(cel_rules(child, f"{path}/{key}"))
    return found


def test_crds_ships_exactly_these() -> None:
    assert sorted(p.name for p in chart.CRDS.glob("*.yaml")) == sorted(ALL_FILES)


@pytest.mark.parametrize("filename", ALL_FILES)
def test_an_api_server_would_create_our_crds(filename: str) -> None:
    assert admission.admission_errors(chart.crd(filename)) == []


def test_the_pool_crd_is_approved_as_gies_is() -> None:
    crd = chart.crd(POOL_FILE)
    assert admission.is_protected_group(crd["spec"]["group"])
    assert crd["metadata"]["annotations"] == GIE_POOL["annotations"]


def test_a_protected_group_without_approval_is_refused() -> None:
    crd = chart.crd(POOL_FILE)
    del crd["metadata"]["annotations"][admission.APPROVAL]
    (error,) = admission.admission_errors(crd)
    assert "protected groups must have approval annotation" in error
    crd["metadata"]["annotations"][admission.APPROVAL] = "yes please"
    (error,) = admission.admission_errors(crd)
    assert "must be a URL" in error
    crd["metadata"]["annotations"][admission.APPROVAL] = "unapproved, experimental"
    assert admission.admission_errors(crd) == []


def test_the_approval_annotation_outside_protected_groups_is_refused() -> None:
    crd = chart.crd(OBJECTIVE_FILE)
    crd["metadata"].setdefault("annotations", {})[admission.APPROVAL] = GIE_POOL["annotations"][
        admission.APPROVAL
    ]
    (error,) = admission.admission_errors(crd)
    assert "only for protected groups" in error


@pytest.mark.parametrize(
    ("group", "protected"),
    [
        ("inference.networking.k8s.io", True),
        ("k8s.io", True),
        ("apps.kubernetes.io", True),
        ("inference.networking.x-k8s.io", False),  # x-k8s.io is the unprotected experimental group
        ("example.com", False),
    ],
)
def test_protected_groups(group: str, protected: bool) -> None:
    assert admission.is_protected_group(group) is protected


def _spec_props(schema: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = schema["properties"]["spec"]["properties"]
    return props


def _untyped(schema: dict[str, Any]) -> None:
    del _spec_props(schema)["targetPorts"]["items"]["properties"]["number"]["type"]


def _both_property_kinds(schema: dict[str, Any]) -> None:
    _spec_props(schema)["selector"]["additionalProperties"] = {"type": "string"}


def _bad_default(schema: dict[str, Any]) -> None:
    _spec_props(schema)["appProtocol"]["default"] = "grpc"


def _optional_map_key(schema: dict[str, Any]) -> None:
    conditions = schema["properties"]["status"]["properties"]["parents"]["items"]["properties"]["conditions"]
    conditions["items"]["required"].remove("type")


def _constrained_metadata(schema: dict[str, Any]) -> None:
    schema["properties"]["metadata"]["properties"] = {"labels": {"type": "object"}}


def _unique_items(schema: dict[str, Any]) -> None:
    _spec_props(schema)["targetPorts"]["uniqueItems"] = True


def _ref(schema: dict[str, Any]) -> None:
    _spec_props(schema)["selector"] = {"$ref": "#/definitions/LabelSelector"}


@pytest.mark.parametrize(
    ("breaks", "expected"),
    [
        (_untyped, "type: must not be empty"),
        (_both_property_kinds, "mutually exclusive"),
        (_bad_default, "default"),
        (_optional_map_key, "must be required or have a default"),
        (_constrained_metadata, "only name and generateName"),
        (_unique_items, "uniqueItems"),
        (_ref, "$ref"),
    ],
)
def test_non_structural_schemas_are_refused(breaks: Callable[[dict[str, Any]], None], expected: str) -> None:
    crd = chart.crd(POOL_FILE)
    breaks(chart.crd_schema(crd))
    errors = admission.admission_errors(crd)
    assert errors, "the broken schema passed"
    assert any(expected in e for e in errors), errors


def test_the_pool_schema_is_gies() -> None:
    crd = chart.crd(POOL_FILE)
    spec = crd["spec"]
    assert (spec["group"], spec["names"], spec["scope"]) == (
        GIE_POOL["group"],
        GIE_POOL["names"],
        GIE_POOL["scope"],
    )
    (version,) = spec["versions"]
    assert {k: version[k] for k in GIE_POOL["version"]} == GIE_POOL["version"]
    assert strip_descriptions(chart.crd_schema(crd)) == GIE_POOL["openAPIV3Schema"]


def test_the_pool_cel_rules_are_gies_verbatim() -> None:
    ours = cel_rules(chart.crd_schema(chart.crd(POOL_FILE)))
    assert sorted(ours) == sorted(cel_rules(GIE_POOL["openAPIV3Schema"]))
    assert len(ours) == 2


# The CEL rules, translated by hand and keyed by their exact text: a rule that changes in the CRD
# has no translation here and fails the manifest tests until it is translated again.
CEL: dict[str, Callable[[Any], bool]] = {
    "self.all(p1, self.exists_one(p2, p1.number==p2.number))": lambda ports: all(
        sum(p2["number"] == p1["number"] for p2 in ports) == 1 for p1 in ports
    ),
    "self.kind != 'Service' || has(self.port)": lambda ref: ref["kind"] != "Service" or "port" in ref,
}


def admit(schema: dict[str, Any], manifest: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(accepted, the stored object) as an API server with this schema would decide on create."""
    stored = admission.apply_defaults(schema, manifest)
    if not jsonschema.Draft4Validator(schema).is_valid(stored):
        return False, stored
    spec = stored["spec"]
    if not CEL["self.all(p1, self.exists_one(p2, p1.number==p2.number))"](spec["targetPorts"]):
        return False, stored
    ref = spec.get("endpointPickerRef")
    if ref is not None and not CEL["self.kind != 'Service' || has(self.port)"](ref):
        return False, stored
    return True, stored


def _pool(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "vllm-llama3-8b-instruct"}},
        "targetPorts": [{"number": 8000}],
        "endpointPickerRef": {"name": "vllm-llama3-8b-instruct-epp", "port": {"number": 9002}},
    }
    base.update(spec)
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "vllm-llama3-8b-instruct"},
        "spec": {k: v for k, v in base.items() if v is not None},
    }


MANIFESTS: list[tuple[str, dict[str, Any], bool]] = [
    ("GIE quickstart pool", _pool(), True),
    ("no picker (GIE v1.6.0)", _pool(endpointPickerRef=None), True),
    ("h2c", _pool(appProtocol="kubernetes.io/h2c"), True),
    ("grpc protocol", _pool(appProtocol="grpc"), False),
    ("data-parallel ranks", _pool(targetPorts=[{"number": 8000 + i} for i in range(8)]), True),
    ("nine ports", _pool(targetPorts=[{"number": 8000 + i} for i in range(9)]), False),
    ("duplicate ports (CEL)", _pool(targetPorts=[{"number": 8000}, {"number": 8000}]), False),
    ("Service picker without port (CEL)", _pool(endpointPickerRef={"name": "epp"}), False),
    (
        "other kind without port",
        _pool(endpointPickerRef={"name": "epp", "kind": "Backend", "group": "x.io"}),
        True,
    ),
    (
        "FailOpen",
        _pool(endpointPickerRef={"name": "e", "port": {"number": 9002}, "failureMode": "FailOpen"}),
        True,
    ),
    (
        "bad failure mode",
        _pool(endpointPickerRef={"name": "e", "port": {"number": 1}, "failureMode": "X"}),
        False,
    ),
    ("empty selector", _pool(selector={"matchLabels": {}}), False),
    ("bad label value", _pool(selector={"matchLabels": {"app": "-x"}}), False),
    ("empty label value", _pool(selector={"matchLabels": {"app": ""}}), True),
    ("port 0", _pool(targetPorts=[{"number": 0}]), False),
]


@pytest.mark.parametrize(("name", "manifest", "accepted"), MANIFESTS, ids=[m[0] for m in MANIFESTS])
def test_pools_are_admitted_and_defaulted_as_by_gie(
    name: str, manifest: dict[str, Any], accepted: bool
) -> None:
    ours = admit(chart.crd_schema(chart.crd(POOL_FILE)), copy.deepcopy(manifest))
    gies = admit(GIE_POOL["openAPIV3Schema"], copy.deepcopy(manifest))
    assert ours == gies
    assert ours[0] is accepted, name


def test_defaults_are_gies() -> None:
    _, stored = admit(chart.crd_schema(chart.crd(POOL_FILE)), _pool())
    assert stored["spec"]["appProtocol"] == "http"
    assert stored["spec"]["endpointPickerRef"] == {
        "name": "vllm-llama3-8b-instruct-epp",
        "port": {"number": 9002},
        "group": "",
        "kind": "Service",
        "failureMode": "FailClose",
    }


# --- InferenceObjective and InferenceModelRewrite, both groups -----------------------------------


@pytest.mark.parametrize("filename", sorted(UPSTREAM_CRDS))
def test_the_schema_and_names_are_the_released_ones(filename: str) -> None:
    theirs = UPSTREAM_CRDS[filename]
    crd = chart.crd(filename)
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{theirs['names']['plural']}.{theirs['group']}"
    assert (spec["group"], spec["names"], spec["scope"]) == (
        theirs["group"],
        theirs["names"],
        theirs["scope"],
    )
    (version,) = spec["versions"]
    assert {k: version[k] for k in theirs["version"]} == theirs["version"]
    assert version["additionalPrinterColumns"] == theirs["printerColumns"]
    assert strip_descriptions(chart.crd_schema(crd)) == theirs["openAPIV3Schema"]
    assert cel_rules(theirs["openAPIV3Schema"]) == []  # nothing to translate: jsonschema decides


def _rewrite(group: str, *rules: dict[str, Any], pool_ref: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": {"name": "canary"},
        "spec": {"poolRef": pool_ref or {"name": "vllm-llama3-8b-instruct"}, "rules": list(rules)},
    }


def _target(model: str, weight: Any = None) -> dict[str, Any]:
    return {"modelRewrite": model} if weight is None else {"modelRewrite": model, "weight": weight}


ALIAS = {"matches": [{"model": {"value": "llama"}}], "targets": [_target("meta-llama/Llama-3.1-8B-Instruct")]}
REWRITES: list[tuple[str, list[dict[str, Any]], bool]] = [
    ("alias", [ALIAS], True),
    ("weighted", [{"matches": ALIAS["matches"], "targets": [_target("v1", 90), _target("v2", 10)]}], True),
    ("generic", [{"targets": [_target("base")]}], True),
    ("no rules", [], True),
    ("no targets", [{"matches": ALIAS["matches"]}], True),
    ("empty targets", [{"matches": ALIAS["matches"], "targets": []}], False),
    ("weight 0", [{"targets": [_target("a", 0)]}], False),
    ("weight too big", [{"targets": [_target("a", 1_000_001)]}], False),
    ("weight not an integer", [{"targets": [_target("a", "heavy")]}], False),
    (
        "prefix match",
        [{"matches": [{"model": {"type": "Prefix", "value": "l"}}], "targets": [_target("a")]}],
        False,
    ),
    ("empty model", [{"matches": [{"model": {"value": ""}}], "targets": [_target("a")]}], False),
    ("match without model", [{"matches": [{}], "targets": [_target("a")]}], False),
    ("target without model", [{"targets": [{"weight": 3}]}], False),
]


@pytest.mark.parametrize(("name", "rules", "accepted"), REWRITES, ids=[r[0] for r in REWRITES])
@pytest.mark.parametrize("group", ["llm-d.ai", "inference.networking.x-k8s.io"])
def test_rewrites_are_admitted_and_defaulted_as_released(
    group: str, name: str, rules: list[dict[str, Any]], accepted: bool
) -> None:
    filename = f"{group}_inferencemodelrewrites.yaml"
    manifest = _rewrite(group, *copy.deepcopy(rules))
    ours = admission.apply_defaults(chart.crd_schema(chart.crd(filename)), copy.deepcopy(manifest))
    theirs = admission.apply_defaults(UPSTREAM_CRDS[filename]["openAPIV3Schema"], copy.deepcopy(manifest))
    assert ours == theirs
    assert jsonschema.Draft4Validator(chart.crd_schema(chart.crd(filename))).is_valid(ours) is accepted, name


def test_rewrite_defaults_are_exact_and_gies_pool_group() -> None:
    filename = "llm-d.ai_inferencemodelrewrites.yaml"
    stored = admission.apply_defaults(chart.crd_schema(chart.crd(filename)), _rewrite("llm-d.ai", ALIAS))
    assert stored["spec"]["poolRef"] == {
        "name": "vllm-llama3-8b-instruct",
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
    }
    assert stored["spec"]["rules"][0]["matches"][0]["model"]["type"] == "Exact"


@pytest.mark.parametrize("group", ["llm-d.ai", "inference.networking.x-k8s.io"])
def test_objectives_are_admitted_as_released(group: str) -> None:
    filename = f"{group}_inferenceobjectives.yaml"
    schema = chart.crd_schema(chart.crd(filename))
    good = {
        "apiVersion": f"{group}/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": "batch"},
        "spec": {"poolRef": {"name": "pool"}, "priority": -1},
    }
    stored = admission.apply_defaults(schema, copy.deepcopy(good))
    assert jsonschema.Draft4Validator(schema).is_valid(stored)
    assert stored["spec"]["poolRef"]["group"] == "inference.networking.k8s.io"
    for bad in ({"poolRef": {"name": "pool"}, "priority": "high"}, {"priority": 1}):
        assert not jsonschema.Draft4Validator(schema).is_valid({**good, "spec": bad})
