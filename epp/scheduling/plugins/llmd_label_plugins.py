"""llm-d's plugins that decide on endpoint labels and request headers: `by-label` (deprecated
filter), `header-label-affinity-scorer` (Alpha) and `context-length-aware` (a filter and scorer).

- `by-label`: keeps endpoints whose label `label` has one of `validValues`, and, with
  `allowsNoLabel`, those without the label. One of the two must allow something.
- `header-label-affinity-scorer`: 1.0 for endpoints whose label `labelKey` equals the request's
  header `headerName`, else 0 (no header: 0 everywhere). Both parameters required.
- `context-length-aware`: endpoints labelled with a context range (`label`, default
  `llm-d.ai/context-length-range`, value `min-max` in tokens) score by how well the request's
  length (its token ids when tokenized, else epp's estimate) fits: inside, 0.3 + 0.7 x (0.7 x
  narrowness + 0.3 x headroom); outside, 0.3 / (1 + distance / 1000); unlabelled 0.5, a
  malformed label 0 (llm-d's formula). With `enableFiltering`, it also keeps only the endpoints
  whose range holds the length (and the unlabelled).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry

CONTEXT_LABEL = "llm-d.ai/context-length-range"


@registry.register("by-label")
class ByLabelFilter(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        label: str = ""
        validValues: list[str] = []
        allowsNoLabel: bool = False

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        label = f"plugin {name!r} (type {self.type!r})"
        if not params.label:
            raise registry.ConfigError(f"{label}: parameter label must be given")
        if not params.validValues and not params.allowsNoLabel:
            raise registry.ConfigError(f"{label}: either validValues must be non-empty or allowsNoLabel true")
        self.config_notes = [f"{label} is deprecated in llm-d: use label-selector-filter or the role filters"]
        self._label = params.label
        self._values = frozenset(params.validValues)
        self._no_label = params.allowsNoLabel

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        kept = []
        for ep in endpoints:
            value = ep.spec.labels.get(self._label)
            if (value is None and self._no_label) or (value is not None and value in self._values):
                kept.append(ep)
        return kept


@registry.register("header-label-affinity-scorer")
class HeaderLabelAffinityScorer(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        headerName: str = ""
        labelKey: str = ""

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        for key in ("headerName", "labelKey"):
            if not getattr(params, key):
                raise registry.ConfigError(
                    f"plugin {name!r} (type {self.type!r}): parameter {key} is required"
                )
        self._header = params.headerName.lower()
        self._label = params.labelKey

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        wanted = request.headers.get(self._header, "")
        if not wanted:
            return [0.0] * len(endpoints)
        return [1.0 if ep.spec.labels.get(self._label) == wanted else 0.0 for ep in endpoints]

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        return framework.explain_inputs(cycle, lambda ep: {self._label: ep.spec.labels.get(self._label, "")})


def context_range(text: str) -> tuple[int, int] | None:
    low, sep, high = text.partition("-")
    try:
        lo, hi = int(low.strip()), int(high.strip())
    except ValueError:
        return None
    return (lo, hi) if sep and "-" not in high and lo <= hi else None


def range_score(length: int, lo: int, hi: int) -> float:
    fallback = 0.3
    if lo <= length <= hi:
        width = hi - lo
        if width == 0:
            return 1.0
        raw = 0.7 * (1.0 / (1.0 + width / 10000.0)) + 0.3 * ((hi - length) / width)
        return fallback + raw * (1.0 - fallback)
    distance = length - hi if length > hi else lo - length
    return fallback / (1.0 + distance / 1000.0)


@registry.register("context-length-aware")
class ContextLengthAware(registry.PluginBase):
    consumes_tokens: Final = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        label: str = CONTEXT_LABEL
        enableFiltering: bool = False

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        if not params.label:
            raise registry.ConfigError(f"plugin {name!r} (type {self.type!r}): parameter label must be given")
        self._label = params.label
        self._filtering = params.enableFiltering

    @staticmethod
    def _length(request: InferenceRequest) -> int:
        return len(request.token_ids) if request.token_ids else request.prompt_tokens_estimate

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        if not self._filtering:
            return endpoints
        length = self._length(request)
        kept = []
        for ep in endpoints:
            text = ep.spec.labels.get(self._label)
            if text is None:
                kept.append(ep)
                continue
            found = context_range(text)
            if found is not None and found[0] <= length <= found[1]:
                kept.append(ep)
        return kept

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        length = self._length(request)
        out = []
        for ep in endpoints:
            text = ep.spec.labels.get(self._label)
            if text is None:
                out.append(0.5)
                continue
            found = context_range(text)
            out.append(0.0 if found is None else range_score(length, *found))
        return out

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        return framework.explain_inputs(
            cycle, lambda ep: {"context_range": ep.spec.labels.get(self._label, "")}
        )
