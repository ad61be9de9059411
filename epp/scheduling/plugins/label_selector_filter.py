"""`label-selector-filter` (and its older llm-d name `by-label-selector`): keep the endpoints whose
pod labels match a Kubernetes label selector.

What it does: the parameters are a Kubernetes `LabelSelector`: every `matchLabels` entry must be
present with that value, and every `matchExpressions` requirement must hold (`In`: the label is
one of `values`; `NotIn`: absent or none of them; `Exists` / `DoesNotExist`: present / absent).
An empty selector keeps every endpoint, as in Kubernetes. Input order is kept. The selector is
checked as Kubernetes checks it: `In`/`NotIn` need values, `Exists`/`DoesNotExist` take none.

Inputs consumed: `Endpoint.spec.labels`.

Parameters: `matchLabels` ({}), `matchExpressions` ([{key, operator, values}]).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry


class _Requirement(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = []


@registry.register("label-selector-filter")
class LabelSelectorFilter(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        matchLabels: dict[str, str] = {}
        matchExpressions: list[_Requirement] = []

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        for i, req in enumerate(params.matchExpressions):
            needs_values = req.operator in ("In", "NotIn")
            if needs_values != bool(req.values):
                what = "needs values" if needs_values else "takes no values"
                raise registry.ConfigError(
                    f"plugin {name!r} (type {self.type!r}): parameter matchExpressions[{i}]: operator "
                    f"{req.operator} {what}"
                )
        self._labels = dict(params.matchLabels)
        self._reqs = [(r.key, r.operator, frozenset(r.values)) for r in params.matchExpressions]

    def _matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self._labels.items()):
            return False
        for key, op, values in self._reqs:
            present = key in labels
            if op == "In" and not (present and labels[key] in values):
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        return [ep for ep in endpoints if self._matches(ep.spec.labels)]


@registry.register("by-label-selector")
class ByLabelSelectorFilter(LabelSelectorFilter):
    """llm-d's deprecated name of `label-selector-filter`."""
