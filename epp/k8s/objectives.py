"""InferenceObjectives: the priority of each named objective of our pool.

InferenceObjective `v1alpha2`, in the pool's namespace, read from `llm-d.ai` (llm-d Router's
group) or `inference.networking.x-k8s.io` (GIE's, legacy) by llm-d's rule (`epp.k8s.groups`):

- `spec.poolRef {group, kind, name}`: the pool it belongs to. Only objectives naming our pool
  count (group `inference.networking.k8s.io` and kind `InferencePool`, their defaults when left
  out); others belong to another EPP.
- `spec.priority`: an integer, higher is more important, negative is "sheddable" (refused with 429
  while the pool is saturated); unset is 0.

A request names its objective in the header `x-llm-d-inference-objective` (llm-d v0.10) or
`x-gateway-inference-objective` (GIE's name, which llm-d still reads); an unknown name (or none)
is priority 0, as in both. The `PoolOperator` (pool mode only: pool-less mode has no
objectives, as GIE's and llm-d's) watches the objectives and replaces the store's contents on
every change; the data path reads `ObjectiveStore.priority_of` through a Protocol of its own, so
it never imports this package.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from epp.k8s import pools

POOL_KIND = "InferencePool"


def belongs_to(spec: Mapping[str, Any], pool_name: str) -> bool:
    """Whether `spec.poolRef` names our pool (group and kind defaulted as their CRDs do)."""
    ref = spec.get("poolRef") or {}
    return (
        ref.get("name") == pool_name
        and (ref.get("group") or pools.GROUP) == pools.GROUP
        and (ref.get("kind") or POOL_KIND) == POOL_KIND
    )


def parse_objective(obj: Mapping[str, Any], pool_name: str) -> int | None:
    """The objective's priority if it belongs to pool `pool_name`, else None.

    Raises ValueError when it names our pool but its priority is not an integer."""
    spec = obj.get("spec") or {}
    if not belongs_to(spec, pool_name):
        return None
    priority = spec.get("priority")
    if priority is None:
        return 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"spec.priority {priority!r} is not an integer")
    return priority


def priorities(objects: Iterable[Mapping[str, Any]], pool_name: str) -> tuple[dict[str, int], list[str]]:
    """(objective name -> priority for the objectives of our pool, problems to log)."""
    found: dict[str, int] = {}
    problems: list[str] = []
    for obj in objects:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            continue
        try:
            priority = parse_objective(obj, pool_name)
        except ValueError as err:
            problems.append(f"InferenceObjective {name} is ignored: {err}")
            continue
        if priority is not None:
            found[name] = priority
    return found, problems


class ObjectiveStore:
    """Objective name -> priority, replaced whole by the operator; read on every request."""

    def __init__(self) -> None:
        self._priorities: dict[str, int] = {}

    def priority_of(self, name: str) -> int | None:
        """The priority of objective `name`; None when our pool has no such objective."""
        return self._priorities.get(name)

    def replace(self, priorities: Mapping[str, int]) -> None:
        self._priorities = dict(priorities)

    def snapshot(self) -> dict[str, int]:
        return dict(self._priorities)
