"""Runs the scheduling pipeline: filter -> weighted score -> pick, per profile.

The framework does the work every plugin would otherwise repeat, so that a plugin holds only its
decision (house rule 4):

- filters run in configured order; one that leaves no endpoint ends the profile with `NoCapacity`
  (429, as GIE maps "no endpoints available") naming that filter;
- each score is clamped to [0, 1] (NaN counts as 0), multiplied by the scorer's weight and summed
  over scorers; there is no normalisation by the sum of weights;
- plugin calls are timed into `inference_extension_plugin_duration_seconds` on one scheduling
  cycle in `PLUGIN_TIMING_EVERY` (a Prometheus histogram observation costs ~2 µs, and timing every
  plugin on every cycle was a tenth of the whole decision; a regular sample keeps the
  distribution), and every `Scheduler.schedule` into
  `inference_extension_scheduler_e2e_duration_seconds`;
- with `explain=True` each endpoint's clamped per-scorer scores are kept in `ProfileResult.scores`,
  the scored candidates are left in the cycle state under `CANDIDATES` (so an explainer that scores
  from endpoint state, like the load scorers, can say which inputs it read), and the explainers'
  findings are kept in `ProfileResult.facts`, merged and per plugin.

Cost, since this runs on every request (budget: well under 100 µs for 8 endpoints on 2 cores):
Prometheus label children are bound once per plugin in `Profile.__init__` (a `labels()` lookup
costs about 1.5 µs here, more than the observation itself), totals are built with one list
comprehension per scorer, and the explain breakdown, a dict per endpoint, is only built when asked
for. `tests/scheduling/bench_scheduler.py` measures a whole decision.

Profile handlers: `Scheduler` is GIE's `single-profile-handler` (one profile, primary);
disaggregation's several profiles per request run in `epp.scheduling.disagg.runner.DisaggScheduler`,
a subclass.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from epp.api import errors
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.observability import metrics
from epp.scheduling import interfaces

_Observe = Callable[[float], None]

PLUGIN_TIMING_EVERY = 8
"""Per-plugin durations are observed on one scheduling cycle in this many."""

CANDIDATES = "epp.framework/candidates"
"""Cycle-state key of the endpoints the scorers scored (explain only). The slash keeps it apart
from plugin names, which key the rest of the cycle state."""


def _observer(extension_point: str, plugin: interfaces.Plugin) -> _Observe:
    return metrics.plugin_duration.labels(extension_point, plugin.type, plugin.name).observe


def _no_clock() -> float:
    return 0.0


def _clamp(score: float) -> float:
    # `not score >= 0.0` is also true for NaN, which therefore counts as 0.
    return 1.0 if score > 1.0 else score if score >= 0.0 else 0.0


class Profile:
    """One scheduling profile: filters in order, weighted scorers, one picker."""

    def __init__(
        self,
        name: str,
        filters: Sequence[interfaces.Filter],
        scorers: Sequence[tuple[interfaces.Scorer, float]],
        picker: interfaces.Picker,
    ) -> None:
        for scorer, weight in scorers:
            if not (math.isfinite(weight) and weight >= 0.0):
                raise ValueError(
                    f"profile {name!r}: weight {weight} of scorer {scorer.name!r} is not a finite number >= 0"
                )
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple((scorer, float(weight)) for scorer, weight in scorers)
        self.picker = picker
        self._timed_filters = tuple((f, _observer("Filter", f)) for f in self.filters)
        self._timed_scorers = tuple((s, w, _observer("Scorer", s)) for s, w in self.scorers)
        self._observe_pick = _observer("Picker", picker)
        self._cycles = 0

    def __repr__(self) -> str:
        return f"Profile({self.name!r})"

    def run(
        self,
        cycle: interfaces.CycleState,
        request: InferenceRequest,
        endpoints: list[Endpoint],
        *,
        explain: bool = False,
    ) -> interfaces.ProfileResult:
        """Filter, score and pick. Raises NoCapacity if a filter or the picker leaves nothing."""
        self._cycles += 1
        timed = self._cycles % PLUGIN_TIMING_EVERY == 1 or PLUGIN_TIMING_EVERY == 1
        clock = time.perf_counter if timed else _no_clock
        for filter_, observe in self._timed_filters:
            start = clock()
            endpoints = filter_.filter(cycle, request, endpoints)
            if timed:
                observe(clock() - start)
            if not endpoints:
                raise errors.NoCapacity(f"no endpoints available: filter {filter_.name!r} removed them all")

        n = len(endpoints)
        totals = [0.0] * n
        breakdown: dict[str, dict[str, float]] = {}
        if explain:
            breakdown = {ep.name: {} for ep in endpoints}
            cycle[CANDIDATES] = endpoints
        for scorer, weight, observe in self._timed_scorers:
            start = clock()
            scores = scorer.score(cycle, request, endpoints)
            if timed:
                observe(clock() - start)
            if len(scores) != n:
                raise RuntimeError(f"scorer {scorer.name!r} returned {len(scores)} scores for {n} endpoints")
            # _clamp inline: one call less per endpoint per scorer
            totals = [
                t + (1.0 if s > 1.0 else s if s >= 0.0 else 0.0) * weight
                for t, s in zip(totals, scores, strict=True)
            ]
            if explain:
                for ep, s in zip(endpoints, scores, strict=True):
                    breakdown[ep.name][scorer.name] = _clamp(s)

        scored = [interfaces.ScoredEndpoint(ep, t) for ep, t in zip(endpoints, totals, strict=True)]
        start = clock()
        targets = self.picker.pick(cycle, request, scored)
        if timed:
            self._observe_pick(clock() - start)
        if not targets:
            raise errors.NoCapacity(f"no endpoints available: picker {self.picker.name!r} chose none")
        result = interfaces.ProfileResult(self.name, targets, breakdown, scored=scored)
        if explain:
            result.facts = self.facts(cycle)
        return result

    def facts(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        """The explainers' findings for the request scored in `cycle`: merged over the plugins
        ("request", "endpoints": later plugins win a shared field), and each plugin's own under
        "plugins" as {plugin name: {"request": {...}, "endpoints": {name: {...}}}}, so that fields
        two scorers both report (a matched-block count, say) stay apart."""
        request: dict[str, Any] = {}
        per_endpoint: dict[str, dict[str, Any]] = {}
        per_plugin: dict[str, dict[str, Any]] = {}
        for plugin in (*self.filters, *(s for s, _ in self.scorers), self.picker):
            if isinstance(plugin, interfaces.Explainer):
                found = plugin.explain(cycle)
                if not found:
                    continue
                own_request = dict(found.get("request", {}))
                own_endpoints = {name: dict(fields) for name, fields in found.get("endpoints", {}).items()}
                per_plugin[plugin.name] = {"request": own_request, "endpoints": own_endpoints}
                request.update(own_request)
                for name, fields in own_endpoints.items():
                    per_endpoint.setdefault(name, {}).update(fields)
        return {"request": request, "endpoints": per_endpoint, "plugins": per_plugin}


class Scheduler:
    """Runs the configured profiles for a request and names the primary result."""

    splits = False
    """Whether a result may name other stages' pods (`SchedulingResult.stages`: P/D)."""

    def __init__(self, profiles: Sequence[Profile], primary: str) -> None:
        if len(profiles) != 1:
            raise ValueError(
                f"the single-profile handler needs exactly one profile, got {len(profiles)}; "
                "multi-profile handlers are not supported yet"
            )
        if profiles[0].name != primary:
            raise ValueError(f"primary profile {primary!r} is not among the profiles")
        self.profiles = tuple(profiles)
        self.primary = primary
        self._profile = profiles[0]
        self._observe = metrics.scheduler_duration.observe

    def profile_names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def consumes_tokens(self) -> bool:
        """Whether any plugin reads `InferenceRequest.token_ids` (worth tokenizing for)."""
        return any(
            getattr(plugin, "consumes_tokens", False)
            for p in self.profiles
            for plugin in (*p.filters, *(s for s, _ in p.scorers), p.picker)
        )

    @functools.cached_property
    def preparers(self) -> tuple[interfaces.Preparer, ...]:
        """The profiles' scorers that can do part of their work ahead (`prepare`)."""
        return tuple(s for p in self.profiles for s, _ in p.scorers if isinstance(s, interfaces.Preparer))

    def prepare(self, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        """Every preparer's `prepare`; meant for a worker thread, before `schedule`."""
        for preparer in self.preparers:
            preparer.prepare(request, endpoints)

    def schedule(
        self, request: InferenceRequest, endpoints: list[Endpoint], *, explain: bool = False
    ) -> interfaces.SchedulingResult:
        """Choose the endpoints to try, primary first.

        Raises ServiceUnavailable (503) when `endpoints` is empty and NoCapacity (429) when the
        profile leaves no endpoint.
        """
        if not endpoints:
            raise errors.ServiceUnavailable("no ready endpoints")
        profile = self.choose(request)
        start = time.perf_counter()
        cycle: interfaces.CycleState = {}
        try:
            result = profile.run(cycle, request, endpoints, explain=explain)
        finally:
            self._observe(time.perf_counter() - start)
        return interfaces.SchedulingResult(profile.name, {profile.name: result}, cycle)

    def choose(self, request: InferenceRequest) -> Profile:
        """The one profile `request` runs, primary (a per-request handler overrides it)."""
        return self._profile

    def facts(self, result: interfaces.SchedulingResult) -> dict[str, Any]:
        """The primary profile's explainer findings for a decision made without `explain`."""
        return self._profile.facts(result.cycle)


def explain_inputs(
    cycle: interfaces.CycleState,
    read: Callable[[Endpoint], dict[str, Any]],
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An `Explainer` answer for a scorer that scores from endpoint state: `read` of each scored
    candidate (explain leaves them in the cycle under `CANDIDATES`; the explain call follows the
    scoring with no await between, so it reads the values the scorer read), plus `request`.
    {} when the cycle holds no candidates (a decision scored without explain)."""
    endpoints = cycle.get(CANDIDATES)
    if not endpoints:
        return {}
    found: dict[str, Any] = {"endpoints": {ep.name: read(ep) for ep in endpoints}}
    if request:
        found["request"] = request
    return found


def lower_is_better(values: Sequence[float]) -> list[float]:
    """Min-max normalise so that the smallest value scores 1.0 and the largest 0.0.

    All values equal -> 1.0 each (GIE's convention: no endpoint is worse than another). Shared by
    the scorers of load measures (queue, running requests, in-flight load).
    """
    lo = min(values)
    hi = max(values)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]
