"""Several scheduling profiles per request: llm-d's disaggregation stages.

`DisaggScheduler` runs in place of `framework.Scheduler` when the configuration has a
disaggregation handler (`handler.DisaggProfileHandler`), in llm-d's order:

- decode first (the default): the decode profile picks the decode pod (the destination; no
  endpoint -> the request fails, as llm-d's; a decider that `ExpectsRemotePrefill` first says how
  likely a split is, which the decode profile's latency scorer prices); then, for a multimodal
  request, the encode stage if its decider says so; then the prefill stage if its decider says
  so. llm-d's deciders look at the decode pod (and its prefix match) only; a decider that
  `prices_prefill` (epp's `pd-latency-decider`) is handed the prefill profile's pick, made
  knowing the decode pod (`PEER_KEY` in the cycle state), and says whether the split is worth it.
- prefill first: the prefill profile always runs, then encode (its decider), then decode, with the
  prefill pod in the cycle state (`PEER_KEY`) for plugins that place decode near it.

An optional stage whose profile finds no endpoint is skipped (the decode pod prefills, or encodes,
itself), as llm-d's handler skips a stage with no result. The result's primary is the decode
profile; `SchedulingResult.stages` names the pods of the other stages, which the handler's
pre-request hook puts in the request's headers and the Director books.

Every decision is counted in `llm_d_epp_disagg_decision_total` / `llm_d_epp_pd_decision_total`
(llm-d's names and labels) and each profile's scores and facts are in `POST /debug/score`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, Final, Literal

from prometheus_client import Counter

from epp.api import errors
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.observability import llmd_metrics, metrics
from epp.scheduling import framework, interfaces
from epp.scheduling.disagg.deciders import Decider, ExpectsRemotePrefill
from epp.scheduling.plugins.predicted_ttft_terms import REMOTE_PREFILL_KEY

PEER_KEY: Final = "epp.disagg/peer"
"""Cycle-state key of the pod chosen by the stage that ran before (decode-first: the decode pod,
while the prefill profile runs; prefill-first: the prefill pod, while decode runs)."""
DECISION_KEY: Final = "epp.disagg/decision"
"""Cycle-state key of the decision, for explain: {"stages": [...], "decision": ..., "why": {...}}."""

DECODE_ONLY, PREFILL_DECODE, ENCODE_DECODE, ENCODE_PREFILL_DECODE = (
    "decode-only",
    "prefill-decode",
    "encode-decode",
    "encode-prefill-decode",
)

disagg_decisions = Counter(
    "llm_d_epp_disagg_decision",
    "Disaggregation decisions (llm-d's series): decode-only, prefill-decode, encode-decode, "
    "encode-prefill-decode",
    ["plugin_name", "plugin_type", "model_name", "decision_type"],
    registry=metrics.REGISTRY,
)
pd_decisions = Counter(
    "llm_d_epp_pd_decision",
    "P/D decisions (llm-d's series): decode-only or prefill-decode",
    ["plugin_name", "plugin_type", "model_name", "decision_type"],
    registry=metrics.REGISTRY,
)
# llm-d still writes both under their old names too, without the plugin labels.
llmd_metrics.TWINS.add(
    llmd_metrics.Twin(
        disagg_decisions,
        "llm_d_inference_scheduler_disagg_decision",
        "[Deprecated: Use llm_d_epp_disagg_decision_total] Total number of disaggregation routing "
        "decisions made",
        keep=("model_name", "decision_type"),
    ),
    llmd_metrics.Twin(
        pd_decisions,
        "llm_d_inference_scheduler_pd_decision",
        "[Deprecated: Use llm_d_epp_pd_decision_total] Total number of P/D disaggregation decisions made",
        keep=("model_name", "decision_type"),
    ),
)


def decision_type(encode: bool, prefill: bool) -> str:
    if encode and prefill:
        return ENCODE_PREFILL_DECODE
    if encode:
        return ENCODE_DECODE
    return PREFILL_DECODE if prefill else DECODE_ONLY


class DisaggScheduler(framework.Scheduler):
    """Runs decode, encode and prefill profiles as the handler orders; see the module."""

    splits = True

    def __init__(
        self,
        *,
        handler: interfaces.Plugin,
        decode: framework.Profile,
        prefill: framework.Profile | None,
        encode: framework.Profile | None,
        prefill_decider: Decider | None,
        encode_decider: Decider | None,
        order: Literal["decode-first", "prefill-first"],
        others: Sequence[framework.Profile] = (),
    ) -> None:
        self.handler = handler
        self.decode = decode
        self.prefill = prefill
        self.encode = encode
        self.prefill_decider = prefill_decider
        self.encode_decider = encode_decider
        self.order = order
        self.profiles = tuple(p for p in (decode, prefill, encode, *others) if p is not None)
        self.primary = decode.name
        self._profile = decode  # what `facts` reads without a multi-profile result
        self._observe = metrics.scheduler_duration.observe
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}
        # Decode first, a decider that prices the split (pd-latency-decider) says how likely one
        # is before the decode profile runs (`REMOTE_PREFILL_KEY`).
        self._expects = (
            prefill_decider
            if prefill is not None and isinstance(prefill_decider, ExpectsRemotePrefill)
            else None
        )

    def consumes_tokens(self) -> bool:
        deciders = (d for d in (self.prefill_decider, self.encode_decider) if d is not None)
        return super().consumes_tokens() or any(getattr(d, "consumes_tokens", False) for d in deciders)

    @functools.cached_property
    def preparers(self) -> tuple[interfaces.Preparer, ...]:
        seen: dict[int, interfaces.Preparer] = {}
        for p in self.profiles:
            for s, _ in p.scorers:
                if isinstance(s, interfaces.Preparer):
                    seen.setdefault(id(s), s)
        return tuple(seen.values())

    def schedule(
        self, request: InferenceRequest, endpoints: list[Endpoint], *, explain: bool = False
    ) -> interfaces.SchedulingResult:
        if not endpoints:
            raise errors.ServiceUnavailable("no ready endpoints")
        start = time.perf_counter()
        cycle: interfaces.CycleState = {}
        try:
            if self.order == "prefill-first":
                result = self._prefill_first(cycle, request, endpoints, explain)
            else:
                result = self._decode_first(cycle, request, endpoints, explain)
        finally:
            self._observe(time.perf_counter() - start)
        self._count(request, result)
        return result

    def _decode_first(
        self,
        cycle: interfaces.CycleState,
        request: InferenceRequest,
        endpoints: list[Endpoint],
        explain: bool,
    ) -> interfaces.SchedulingResult:
        expects = self._expects
        if expects is not None:
            remote = expects.expected_remote(request)
            if remote is not None:
                cycle[REMOTE_PREFILL_KEY] = remote
        decode = self.decode.run(cycle, request, endpoints, explain=explain)
        result = interfaces.SchedulingResult(self.decode.name, {self.decode.name: decode}, cycle)
        pod = decode.targets[0]
        why: dict[str, Any] = {}
        if self.encode is not None and self.encode_decider is not None:
            if self.encode_decider.disaggregate(cycle, request, pod, None):
                self._stage(result, "encode", self.encode, request, endpoints, explain, why)
            else:
                why["encode"] = "skipped: the decider said no"
        if self.prefill is not None and self.prefill_decider is not None:
            decider = self.prefill_decider
            if decider.prices_prefill:
                cycle[PEER_KEY] = pod
                priced = self._run(self.prefill, cycle, request, endpoints, explain, why, "prefill")
                split = priced is not None and decider.disaggregate(cycle, request, pod, priced)
                if priced is not None and explain:
                    priced.facts = self.prefill.facts(cycle)  # with the decision's own terms
                if priced is not None and split:
                    self._keep(result, "prefill", priced, why)
                elif priced is not None:
                    why["prefill"] = "skipped: cheaper on the decode pod"
                    if explain:  # the priced prefill pods stay in the explanation
                        result.profiles[priced.profile] = priced
            elif decider.disaggregate(cycle, request, pod, None):
                cycle[PEER_KEY] = pod
                self._stage(result, "prefill", self.prefill, request, endpoints, explain, why)
            else:
                why["prefill"] = "skipped: the decider said no"
        cycle[DECISION_KEY] = {"order": self.order, "stages": sorted(result.stages), "why": why}
        return result

    def _prefill_first(
        self,
        cycle: interfaces.CycleState,
        request: InferenceRequest,
        endpoints: list[Endpoint],
        explain: bool,
    ) -> interfaces.SchedulingResult:
        why: dict[str, Any] = {}
        prefill = None
        if self.prefill is not None:
            prefill = self._run(self.prefill, cycle, request, endpoints, explain, why, "prefill")
        encode = None
        if self.encode is not None and self.encode_decider is not None:
            if self.encode_decider.disaggregate(cycle, request, None, None):
                encode = self._run(self.encode, cycle, request, endpoints, explain, why, "encode")
            else:
                why["encode"] = "skipped: the decider said no"
        if prefill is not None:
            cycle[PEER_KEY] = prefill.targets[0]
        decode = self.decode.run(cycle, request, endpoints, explain=explain)
        result = interfaces.SchedulingResult(self.decode.name, {self.decode.name: decode}, cycle)
        if encode is not None:
            self._keep(result, "encode", encode, why)
        if prefill is not None:
            self._keep(result, "prefill", prefill, why)
        cycle[DECISION_KEY] = {"order": self.order, "stages": sorted(result.stages), "why": why}
        return result

    def _run(
        self,
        profile: framework.Profile,
        cycle: interfaces.CycleState,
        request: InferenceRequest,
        endpoints: list[Endpoint],
        explain: bool,
        why: dict[str, Any],
        stage: str,
    ) -> interfaces.ProfileResult | None:
        try:
            return profile.run(cycle, request, endpoints, explain=explain)
        except errors.NoCapacity as err:
            why[stage] = f"skipped: {err.reason}"
            return None

    def _stage(
        self,
        result: interfaces.SchedulingResult,
        stage: str,
        profile: framework.Profile,
        request: InferenceRequest,
        endpoints: list[Endpoint],
        explain: bool,
        why: dict[str, Any],
    ) -> None:
        found = self._run(profile, result.cycle, request, endpoints, explain, why, stage)
        if found is not None:
            self._keep(result, stage, found, why)

    @staticmethod
    def _keep(
        result: interfaces.SchedulingResult, stage: str, found: interfaces.ProfileResult, why: dict[str, Any]
    ) -> None:
        result.profiles[found.profile] = found
        # Encode may fan out to several pods (llm-d sends every target); prefill uses the first.
        result.stages[stage] = found.targets if stage == "encode" else found.targets[:1]
        why[stage] = "ran: " + ",".join(ep.name for ep in result.stages[stage])

    def _count(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        kind = decision_type("encode" in result.stages, "prefill" in result.stages)
        model = request.target_model or "unknown"
        key = (model, kind)
        children = self._children.get(key)
        if children is None:
            if len(self._children) > 4096:  # model names come from clients: bounded
                self._children.clear()
            h = self.handler
            children = self._children[key] = (
                disagg_decisions.labels(h.name, h.type, model, kind),
                pd_decisions.labels(
                    h.name, h.type, model, PREFILL_DECODE if "prefill" in result.stages else DECODE_ONLY
                ),
            )
        children[0].inc()
        children[1].inc()

    def facts(self, result: interfaces.SchedulingResult) -> dict[str, Any]:
        """The decode profile's explainer findings, and each other stage's under "stages"."""
        facts = self.decode.facts(result.cycle)
        by_name = {p.name: p for p in self.profiles}
        facts["stages"] = {
            stage: by_name[r.profile].facts(result.cycle)
            for stage, r in ((s, result.profiles.get(self._profile_of(s))) for s in result.stages)
            if r is not None and r.profile in by_name
        }
        decision = result.cycle.get(DECISION_KEY)
        if decision is not None:
            facts["disaggregation"] = decision
        return facts

    def _profile_of(self, stage: str) -> str:
        profile = self.prefill if stage == "prefill" else self.encode if stage == "encode" else None
        return profile.name if profile is not None else ""
