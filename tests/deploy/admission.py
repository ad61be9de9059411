"""What a real API server checks when a CustomResourceDefinition is created, reimplemented.

No API server runs here, so the rules that make `kubectl apply -f crds/` fail on a cluster but
pass every schema check are written down from Kubernetes' apiextensions validation
(apiextensions.k8s.io/v1):

- Protected groups (KEP-1111): a CRD whose group is k8s.io, kubernetes.io or a subdomain of
  either needs the annotation api-approved.kubernetes.io, set to the URL of the API review that
  approved it (or a value starting with "unapproved", which the server accepts and flags); a
  CRD in any other group must not carry it.
- Structural schemas: every node says its type (unless it is int-or-string or keeps unknown
  fields), properties and additionalProperties never together, no JSON-schema keywords that v1
  forbids, metadata at the root constrained to at most name and generateName, defaults valid
  against their own node, and map lists keyed by scalar properties that are required or
  defaulted.

`admission_errors` returns the reasons the server would give (empty: it would accept).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import jsonschema

APPROVAL = "api-approved.kubernetes.io"
FORBIDDEN_KEYWORDS = (
    "$ref",
    "$schema",
    "id",
    "definitions",
    "additionalItems",
    "patternProperties",
    "dependencies",
)
LIST_TYPES = ("atomic", "set", "map")


def is_protected_group(group: str) -> bool:
    return group in ("k8s.io", "kubernetes.io") or group.endswith((".k8s.io", ".kubernetes.io"))


def approval_errors(crd: dict[str, Any]) -> list[str]:
    group = crd["spec"]["group"]
    value = (crd["metadata"].get("annotations") or {}).get(APPROVAL)
    if not is_protected_group(group):
        # KEP-1111: in apiextensions.k8s.io/v1 the annotation outside the protected groups is an error too.
        return [] if value is None else [f"{APPROVAL} is only for protected groups, not {group}"]
    if value is None:
        return [f"protected groups must have approval annotation {APPROVAL!r} ({group})"]
    if value.startswith("unapproved"):
        return []
    url = urlparse(value)
    if url.scheme not in ("http", "https") or not url.netloc:
        return [f"{APPROVAL} must be a URL of the API review or start with 'unapproved': {value!r}"]
    return []


def structural_errors(schema: dict[str, Any], path: str = "openAPIV3Schema") -> list[str]:
    errors: list[str] = []
    if schema.get("type") != "object":
        errors.append(f"{path}.type: must be object at the root")
    _check_node(schema, path, errors, root=True)
    return errors


def _check_node(node: dict[str, Any], path: str, errors: list[str], *, root: bool = False) -> None:
    for keyword in FORBIDDEN_KEYWORDS:
        if keyword in node:
            errors.append(f"{path}.{keyword}: forbidden in apiextensions.k8s.io/v1")
    if node.get("uniqueItems") is True:
        errors.append(f"{path}.uniqueItems: true is forbidden (use x-kubernetes-list-type: set)")
    untyped_ok = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    if not node.get("type") and not untyped_ok:
        errors.append(f"{path}.type: must not be empty for specified object fields")
    if "properties" in node and "additionalProperties" in node:
        errors.append(f"{path}: properties and additionalProperties are mutually exclusive")
    if isinstance(node.get("items"), list):
        errors.append(f"{path}.items: must be a schema, not a list of schemas")
    for i, value in enumerate(node.get("enum", [])):
        if not _matches_type(node, value):
            errors.append(f"{path}.enum[{i}]: {value!r} is not of type {node.get('type')}")
    if "default" in node:
        failure = _first_failure(node, node["default"])
        if failure:
            errors.append(f"{path}.default: {failure}")
    _check_list(node, path, errors)
    for i, rule in enumerate(node.get("x-kubernetes-validations", [])):
        if not isinstance(rule.get("rule"), str) or not rule["rule"].strip():
            errors.append(f"{path}.x-kubernetes-validations[{i}].rule: required")
    properties = node.get("properties", {})
    if root and "metadata" in properties:
        _check_root_metadata(properties["metadata"], f"{path}.properties[metadata]", errors)
    for name, child in properties.items():
        if not (root and name == "metadata"):
            _check_node(child, f"{path}.properties[{name}]", errors)
    if isinstance(node.get("additionalProperties"), dict):
        _check_node(node["additionalProperties"], f"{path}.additionalProperties", errors)
    if isinstance(node.get("items"), dict):
        _check_node(node["items"], f"{path}.items", errors)


def _check_root_metadata(node: dict[str, Any], path: str, errors: list[str]) -> None:
    if node.get("type") != "object":
        errors.append(f"{path}.type: must be object")
    allowed = {"type", "description", "properties"}
    for key in set(node) - allowed:
        errors.append(f"{path}.{key}: must not be specified (only name and generateName may be constrained)")
    for name, child in node.get("properties", {}).items():
        if name not in ("name", "generateName"):
            errors.append(f"{path}.properties[{name}]: only name and generateName may be specified")
        elif child.get("type") != "string" or "default" in child:
            errors.append(f"{path}.properties[{name}]: must be a string without default")


def _check_list(node: dict[str, Any], path: str, errors: list[str]) -> None:
    list_type = node.get("x-kubernetes-list-type")
    keys = node.get("x-kubernetes-list-map-keys")
    if list_type is not None and (node.get("type") != "array" or list_type not in LIST_TYPES):
        errors.append(f"{path}.x-kubernetes-list-type: must be one of {LIST_TYPES} on an array")
    if keys is not None and list_type != "map":
        errors.append(f"{path}.x-kubernetes-list-map-keys: only with x-kubernetes-list-type: map")
    if list_type != "map":
        return
    items = node.get("items") if isinstance(node.get("items"), dict) else {}
    if items.get("type") != "object" or not keys:
        errors.append(f"{path}: a map list needs object items and x-kubernetes-list-map-keys")
        return
    for key in keys:
        prop = items.get("properties", {}).get(key)
        if prop is None or prop.get("type") not in ("string", "integer", "number", "boolean"):
            errors.append(f"{path}.x-kubernetes-list-map-keys: {key!r} must be a scalar property")
        elif key not in items.get("required", []) and "default" not in prop:
            errors.append(f"{path}.x-kubernetes-list-map-keys: {key!r} must be required or have a default")


_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def _matches_type(node: dict[str, Any], value: Any) -> bool:
    check = _TYPE_CHECKS.get(node.get("type", ""))
    return check is None or check(value)


def _first_failure(node: dict[str, Any], value: Any) -> str | None:
    schema = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-")}
    error = jsonschema.exceptions.best_match(jsonschema.Draft4Validator(schema).iter_errors(value))
    return None if error is None else error.message


def admission_errors(crd: dict[str, Any]) -> list[str]:
    """Why an API server would refuse to create `crd` (apiextensions.k8s.io/v1); empty if it would not."""
    errors = approval_errors(crd)
    if crd.get("apiVersion") != "apiextensions.k8s.io/v1":
        errors.append(f"apiVersion: {crd.get('apiVersion')!r} is not served (apiextensions.k8s.io/v1)")
    for version in crd["spec"]["versions"]:
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema is None:
            errors.append(f"spec.versions[{version['name']}].schema.openAPIV3Schema: required")
        else:
            errors.extend(
                structural_errors(schema, f"spec.versions[{version['name']}].schema.openAPIV3Schema")
            )
    return errors


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """`value` with the schema's defaults filled in, as the API server defaults on create."""
    if isinstance(value, dict):
        out = dict(value)
        for name, child in schema.get("properties", {}).items():
            if name not in out and "default" in child:
                out[name] = child["default"]
            if name in out:
                out[name] = apply_defaults(child, out[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in set(out) - set(schema.get("properties", {})):
                out[name] = apply_defaults(extra, out[name])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], v) for v in value]
    return value
