"""`endpoint-attribute-filter` and `endpoint-attribute-scorer` (llm-d, Alpha): filter and score by
one numeric endpoint attribute, such as the GPU utilization of `dcgm-extractor`
(`("GPUUtilization", "dcgm-extractor")`, epp.datastore.dcgm) or a custom metric of
`core-metrics-extractor`'s engine configs (`ModelServerMetrics.custom`).

The attribute is named by `attribute` (filter) / `attributeKey` (scorer) and `producer`: omitted,
the core metrics extractor; "" a producer-agnostic attribute. A name with "/" and no producer is
refused, as llm-d refuses it (it is the old "Attribute/Producer" spelling, which would match
nothing).

Filter: `algorithm: {type: threshold, threshold: {operator, value}}` with operator one of
LessThan, LessThanOrEqual, GreaterThan, GreaterThanOrEqual, Equal, NotEqual keeps the endpoints
whose value compares true; `onMissing` Pass (default) keeps those without the attribute, Fail
drops them; `fallbackOnEmpty` returns every candidate when none is left.

Scorer: `algorithm.type` linear_lower_is_better or linear_higher_is_better, normalized over
`normalization.fixedRange {min, max}` (clamped) or, by default, the candidates' own range
(`adaptiveRange`; all equal: 1.0 each); an endpoint without the attribute scores 0.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry

CORE_METRICS = "core-metrics-extractor"

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "LessThan": operator.lt,
    "LessThanOrEqual": operator.le,
    "GreaterThan": operator.gt,
    "GreaterThanOrEqual": operator.ge,
    "Equal": operator.eq,
    "NotEqual": operator.ne,
}


def attribute_key(label: str, attribute: str, producer: str | None) -> tuple[str, str]:
    if not attribute:
        raise registry.ConfigError(f"{label}: a non-empty attribute is required")
    if producer is not None:
        return (attribute, producer)
    if "/" in attribute:
        name, _, owner = attribute.rpartition("/")
        raise registry.ConfigError(
            f"{label}: attribute {attribute!r} contains '/' but no producer is set: the attribute and its "
            f"producer are separate parameters (attribute: {name!r}, producer: {owner!r})"
        )
    return (attribute, CORE_METRICS)


def read(ep: Endpoint, key: tuple[str, str]) -> float | None:
    """The endpoint's value of attribute `key`, None when it has none."""
    if key[1] == CORE_METRICS:
        return ep.metrics.custom.get(key[0])
    value = ep.attributes.get(key)
    return float(value) if isinstance(value, int | float) else None


class _Threshold(msgspec.Struct, forbid_unknown_fields=True):
    operator: str = ""
    value: float = 0.0


class _FilterAlgorithm(msgspec.Struct, forbid_unknown_fields=True):
    type: str = ""
    threshold: _Threshold | None = None


@registry.register("endpoint-attribute-filter")
class EndpointAttributeFilter(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        attribute: str = ""
        producer: str | None = None
        onMissing: str = "Pass"
        fallbackOnEmpty: bool = False
        algorithm: _FilterAlgorithm = msgspec.field(default_factory=_FilterAlgorithm)

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        label = f"plugin {name!r} (type {self.type!r})"
        self.key = attribute_key(label, params.attribute, params.producer)
        if params.onMissing not in ("Pass", "Fail"):
            raise registry.ConfigError(
                f"{label}: parameter onMissing must be 'Pass' or 'Fail', got {params.onMissing!r}"
            )
        if params.algorithm.type != "threshold":
            raise registry.ConfigError(
                f"{label}: parameter algorithm.type must be 'threshold', got {params.algorithm.type!r}"
            )
        threshold = params.algorithm.threshold
        if threshold is None:
            raise registry.ConfigError(f"{label}: parameter algorithm.threshold is required")
        compare = _OPERATORS.get(threshold.operator)
        if compare is None:
            raise registry.ConfigError(
                f"{label}: parameter algorithm.threshold.operator must be one of {', '.join(_OPERATORS)}, "
                f"got {threshold.operator!r}"
            )
        self._compare = compare
        self._value = threshold.value
        self._pass_missing = params.onMissing == "Pass"
        self._fallback = params.fallbackOnEmpty

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        kept = []
        for ep in endpoints:
            value = read(ep, self.key)
            if value is None:
                if self._pass_missing:
                    kept.append(ep)
            elif self._compare(value, self._value):
                kept.append(ep)
        return endpoints if not kept and self._fallback else kept


class _FixedRange(msgspec.Struct, forbid_unknown_fields=True):
    min: float = 0.0
    max: float = 0.0


class _AdaptiveRange(msgspec.Struct, forbid_unknown_fields=True):
    pass


class _Normalization(msgspec.Struct, forbid_unknown_fields=True):
    fixedRange: _FixedRange | None = None
    adaptiveRange: _AdaptiveRange | None = None


class _ScorerAlgorithm(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["linear_lower_is_better", "linear_higher_is_better", ""] = ""
    normalization: _Normalization = msgspec.field(default_factory=_Normalization)


@registry.register("endpoint-attribute-scorer")
class EndpointAttributeScorer(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        attributeKey: str = ""
        producer: str | None = None
        algorithm: _ScorerAlgorithm = msgspec.field(default_factory=_ScorerAlgorithm)

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        label = f"plugin {name!r} (type {self.type!r})"
        self.key = attribute_key(label, params.attributeKey, params.producer)
        if not params.algorithm.type:
            raise registry.ConfigError(
                f"{label}: parameter algorithm.type must be 'linear_lower_is_better' or "
                "'linear_higher_is_better'"
            )
        norm = params.algorithm.normalization
        if norm.fixedRange is not None and norm.adaptiveRange is not None:
            raise registry.ConfigError(f"{label}: give one normalization, fixedRange or adaptiveRange")
        if norm.fixedRange is not None and norm.fixedRange.min >= norm.fixedRange.max:
            raise registry.ConfigError(
                f"{label}: parameter algorithm.normalization.fixedRange needs min < max"
            )
        self._lower = params.algorithm.type == "linear_lower_is_better"
        self._range = (norm.fixedRange.min, norm.fixedRange.max) if norm.fixedRange is not None else None

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        values = [read(ep, self.key) for ep in endpoints]
        present = [v for v in values if v is not None]
        if not present:
            return [0.0] * len(endpoints)
        if self._range is not None:
            lo, hi = self._range
        else:
            lo, hi = min(present), max(present)
            if lo == hi:
                return [0.0 if v is None else 1.0 for v in values]
        out = []
        for v in values:
            if v is None:
                out.append(0.0)
                continue
            x = min(1.0, max(0.0, (v - lo) / (hi - lo)))
            out.append(1.0 - x if self._lower else x)
        return out

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        return framework.explain_inputs(cycle, lambda ep: {self.key[0]: read(ep, self.key)})
