"""InferenceModelRewrites of our pool, parsed for `epp.datastore.model_rewrites`.

InferenceModelRewrite `v1alpha2`, in the pool's namespace, read from `llm-d.ai` or (legacy)
`inference.networking.x-k8s.io` by llm-d's rule (`epp.k8s.groups`); the fields:

- `spec.poolRef {group, kind, name}`: only rewrites naming our pool count (as objectives);
- `spec.rules[]`: `matches[].model {type: Exact, value}` (any one matches; none: every model)
  and `targets[] {modelRewrite, weight}` (weight 1-1,000,000; all set or none).

Precedence and weighting are `epp.datastore.model_rewrites`'s. The API server validates these
objects against the CRD, so a bad one reaches epp only from a CRD other than crds/'s: it is left
out whole and logged (the operator logs each problem once), and the others stay in force. A
rule whose targets mix weighted and unweighted entries is kept (the unweighted ones are then
never chosen, as in llm-d) and reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from epp.datastore.model_rewrites import ModelRewrite, Rule, Target
from epp.k8s.objectives import belongs_to

MAX_WEIGHT = 1_000_000


def parse_rewrite(obj: Mapping[str, Any], pool_name: str) -> tuple[ModelRewrite | None, list[str]]:
    """(the rewrite if it belongs to pool `pool_name`, else None; notes to log about it).

    Raises ValueError when it names our pool but cannot be read."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not belongs_to(spec, pool_name):
        return None, []
    rules_in = spec.get("rules")
    if not isinstance(rules_in, list):
        raise ValueError("spec.rules is not a list")
    notes: list[str] = []
    rules: list[Rule] = []
    for i, rule in enumerate(rules_in):
        where = f"spec.rules[{i}]"
        if not isinstance(rule, Mapping):
            raise ValueError(f"{where} is not an object")
        models: set[str] = set()
        for j, match in enumerate(rule.get("matches") or []):
            model = (match or {}).get("model") if isinstance(match, Mapping) else None
            if not isinstance(model, Mapping):
                raise ValueError(f"{where}.matches[{j}].model is missing")
            kind = model.get("type") or "Exact"
            if kind != "Exact":
                raise ValueError(f"{where}.matches[{j}].model.type {kind!r} is not Exact (the only type)")
            value = model.get("value")
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}.matches[{j}].model.value must be a non-empty string")
            models.add(value)
        targets: list[Target] = []
        for j, target in enumerate(rule.get("targets") or []):
            if not isinstance(target, Mapping):
                raise ValueError(f"{where}.targets[{j}] is not an object")
            name = target.get("modelRewrite")
            if not isinstance(name, str) or not name:
                raise ValueError(f"{where}.targets[{j}].modelRewrite must be a non-empty string")
            weight = target.get("weight")
            if weight is not None and (
                isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT
            ):
                raise ValueError(
                    f"{where}.targets[{j}].weight {weight!r} is not an integer in 1-{MAX_WEIGHT}"
                )
            targets.append(Target(name, weight))
        if not targets:
            notes.append(f"{where} has no targets: requests it matches are refused with 400 (as llm-d)")
        elif len({t.weight is None for t in targets}) == 2:
            unweighted = ", ".join(t.model for t in targets if t.weight is None)
            notes.append(
                f"{where} mixes weighted and unweighted targets: {unweighted} never chosen (as llm-d)"
            )
        rules.append(Rule(frozenset(models), tuple(targets)))
    created = meta.get("creationTimestamp")
    return ModelRewrite(name=meta["name"], created=str(created or ""), rules=tuple(rules)), notes


def rewrites(objects: Iterable[Mapping[str, Any]], pool_name: str) -> tuple[list[ModelRewrite], list[str]]:
    """(the rewrites of our pool, problems and notes to log)."""
    found: list[ModelRewrite] = []
    problems: list[str] = []
    for obj in objects:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            continue
        try:
            rewrite, notes = parse_rewrite(obj, pool_name)
        except ValueError as err:
            problems.append(f"InferenceModelRewrite {name} is ignored: {err}")
            continue
        problems.extend(f"InferenceModelRewrite {name}: {note}" for note in notes)
        if rewrite is not None:
            found.append(rewrite)
    return found, problems
