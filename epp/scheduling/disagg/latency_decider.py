"""`pd-latency-decider`: epp's P/D decider. Split a request only where its first token comes
sooner with a remote prefill plus the KV transfer than with the decode pod's own prefill, onto
the prefill pod that makes it soonest, priced by the decode profile's `request-latency-scorer`
(or `predicted-ttft-scorer`): the same learned prefill rates, queues and step model.

Why: llm-d's `prefix-based-pd-decider` splits whenever `nonCachedTokens` of the prompt are not on
the decode pod. A fixed token count cannot see that the prefill pods are queued while the decode
pod is idle, that a short prompt's KV transfer costs more than its prefill, or that a decode pod
with many streams running makes its own prefill expensive for them (their tokens stall): the
threshold that suits one load and mix loses on another.

The run (`runner.DisaggScheduler`, decode first): the decode profile picks the decode pod `D`; the
prefill profile, which lists this plugin as a scorer after its prefix scorer, scores each prefill
candidate `P` by its prefill leg plus the transfer to `D`; this plugin then compares, in seconds of
the latency scorer's objective:

    local(D) = ttftWeight * ttft(D)                     queue + overhead + uncached prefill on D
             + othersWeight * stall(D)                  D's running streams stalled by that prefill
    split(P) = ttftWeight * (max(leg(P) + transfer(P, D), queue(D)) + overhead(D))
             + othersWeight * stall(P)                  P's own running streams, when it decodes too
    leg(P)   = queue(P) + overhead(P) + prefill(P)      P's learned rate and fluid queue
    transfer(P, D) = kvBytesPerToken * uncached(D) / bandwidth(P, D)

(`ttftWeight`, `othersWeight`: this plugin's) and splits when
`split(P) + marginSeconds < local(D) x (1 - marginRatio)` and the prompt has `minPromptTokens`.
`D`'s own decode is the same either way and is left out of both.
`uncached(D)` is what D does not hold: only those blocks move (vLLM's NixlConnector pulls the
blocks the decode pod lacks).

`bandwidth(P, D)` starts at `bandwidthBytesPerSecond` and is learned per pod pair from the TTFTs of
the requests split over that pair: the part of a TTFT the predicted prefill leg and D's step do
not explain is the transfer, per byte moved (a log-space moving average, weight
`bandwidthLearningRate`, within 1/1000 to 10 times the prior).

Effects: on a split, the prefill is booked on P's fluid queue in the latency scorer (the decode
pod's booking then holds no prefill), and the request's pair and bytes are kept for the learning.
Explain: per prefill candidate `leg_s`, `queue_s`, `prefill_s`, `uncached_tokens`,
`transfer_s`, `transfer_bytes`, `bandwidth_bytes_per_s`, `split_s`; per request `local_s`,
`local_ttft_s`, `local_stall_s`, `best_split_s`, `split`, `decode_pod`.

Parameters:
- `latencyScorer` (""): the decode profile's `request-latency-scorer` / `predicted-ttft-scorer`
  (default: the first there).
- `kvBytesPerToken` (131072, > 0): KV bytes per token (layers x 2 x KV heads x head size x dtype
  bytes; 131072 is Llama-3-8B in bf16).
- `bandwidthBytesPerSecond` (1.25e10, > 0): the prior transfer rate of every pod pair (100 Gb/s).
- `bandwidthLearningRate` (0.2, (0, 1]).
- `marginSeconds` (0, >= 0), `marginRatio` (0, [0, 1)): what a split must save, in seconds and as
  a share of the local price.
- `ttftWeight` (1), `othersWeight` (2): the weights of the request's own first token and of the
  stall it imposes on the streams running where it is prefilled, in the comparison (the latency
  scorer's own `ttftWeight`, 4 in epp's default, ranks the decode pods). A stall delays every
  token after it of each stream it hits, and a decode pod's streams are the long ones: with 1,
  `epp bench pd` (pd-mixed, --load 4, seeds 1-2) kept prefills local that left its E2E p99 3%
  above llm-d's always-split; with 2 it is 0.4% below, with a third lower TTFT p99.
- `minPromptTokens` (0): shorter prompts never split.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Final

import msgspec

from epp import clock
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry
from epp.scheduling.disagg import deciders
from epp.scheduling.disagg.runner import PEER_KEY
from epp.scheduling.plugins.precise_prefix_cache_scorer import PrefixMatch
from epp.scheduling.plugins.predicted_ttft_scorer import PredictedTTFTScorer, TTFTDecision

MAX_PENDING: Final = 65536


@dataclasses.dataclass(slots=True)
class _Leg:
    """One prefill candidate's price for the request being scheduled."""

    queue_s: float
    overhead_s: float
    prefill_s: float
    uncached: float
    transfer_s: float
    transfer_bytes: float
    bandwidth: float
    stall_s: float
    split_s: float


@dataclasses.dataclass(slots=True)
class _Pricing:
    request: InferenceRequest
    decode: Endpoint | None
    legs: dict[str, _Leg]
    local_ttft_s: float = 0.0
    local_stall_s: float = 0.0
    local_s: float = 0.0
    best_split_s: float = math.inf
    split: bool = False
    reason: str = ""


@dataclasses.dataclass(slots=True)
class _Pending:
    request: InferenceRequest
    pair: tuple[str, str]
    bytes: float
    leg_s: float
    overhead_s: float


@registry.register("pd-latency-decider")
class PDLatencyDecider(registry.PluginBase):
    prices_prefill: ClassVar[bool] = True
    consumes_tokens: ClassVar[bool] = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        latencyScorer: str = ""
        kvBytesPerToken: Annotated[int, msgspec.Meta(gt=0)] = 131072
        bandwidthBytesPerSecond: Annotated[float, msgspec.Meta(gt=0.0)] = 1.25e10
        bandwidthLearningRate: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.2
        marginSeconds: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
        marginRatio: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.0
        ttftWeight: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
        othersWeight: Annotated[float, msgspec.Meta(ge=0.0)] = 2.0
        minPromptTokens: Annotated[int, msgspec.Meta(ge=0)] = 0

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        if not math.isfinite(params.bandwidthBytesPerSecond):
            raise registry.ConfigError(
                f"plugin {name!r} (type {self.type!r}): bandwidthBytesPerSecond must be finite"
            )
        self._scorer_ref = params.latencyScorer
        self._kv_bytes = float(params.kvBytesPerToken)
        self._prior_bw = params.bandwidthBytesPerSecond
        self._learn_w = params.bandwidthLearningRate
        self._margin = params.marginSeconds
        self._ratio = params.marginRatio
        self._min_prompt = params.minPromptTokens
        self._latency: PredictedTTFTScorer | None = None
        self._ttft_w = params.ttftWeight
        self._others_w = params.othersWeight
        self._stall_w = 1.0
        self._prefix = ""  # the prefill profile's prefix scorer (P's cached tokens)
        self._bandwidth: dict[tuple[str, str], float] = {}
        self._samples: dict[tuple[str, str], int] = collections.Counter()
        self._last: _Pricing | None = None
        self._pending: collections.OrderedDict[int, _Pending] = collections.OrderedDict()
        handle.datastore.subscribe(self._on_endpoints_changed)

    def bind(self, decode: framework.Profile, prefill: framework.Profile) -> None:
        """Find the latency scorer in the decode profile and check the prefill profile scores with
        this plugin (after its prefix scorer). Raises ConfigError otherwise."""
        label = f"plugin {self.name!r} (type {self.type!r})"
        found = [s for s, _ in decode.scorers if isinstance(s, PredictedTTFTScorer)]
        if self._scorer_ref:
            found = [s for s in found if s.name == self._scorer_ref]
        if not found:
            what = (
                repr(self._scorer_ref)
                if self._scorer_ref
                else "a request-latency-scorer or predicted-ttft-scorer"
            )
            raise registry.ConfigError(
                f"{label}: the decode profile {decode.name!r} has no {what} to price with"
            )
        self._latency = found[0]
        self._stall_w = float(getattr(found[0], "_stall_w", 1.0))
        scorers = [s for s, _ in prefill.scorers]
        if self not in scorers:
            raise registry.ConfigError(
                f"{label}: list it as a scorer of the prefill profile {prefill.name!r}: "
                "it prices the prefill pods"
            )
        if any(s is self._latency for s in scorers):
            raise registry.ConfigError(
                f"{label}: {self._latency.name!r} prices the decode pods; "
                "the prefill profile must not list it"
            )
        prefix = deciders.prefix_scorer(scorers[: scorers.index(self)])
        self._prefix = prefix.name if prefix is not None else ""

    # --- pricing the prefill pods (a scorer of the prefill profile) -------------------------------

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        latency = self._latency
        decode = cycle.get(PEER_KEY)
        decided = cycle.get(latency.name) if latency is not None else None
        if latency is None or not isinstance(decode, Endpoint) or not isinstance(decided, TTFTDecision):
            # Not in a P/D run (no decode pod chosen, or not priced): every candidate alike.
            self._last = _Pricing(request, None, {}, reason="no decode pod priced")
            return [1.0] * len(endpoints)
        local = decided.terms.get(decode.name)
        tokens = deciders.prompt_tokens(request)
        moved = local.uncached if local is not None else float(tokens)
        now = clock.now()
        match = cycle.get(self._prefix) if self._prefix else None
        legs: dict[str, _Leg] = {}
        costs: list[float] = []
        d_queue = local.queue_s if local is not None else 0.0
        d_overhead = latency.overhead_seconds * (local.slowdown if local is not None else 1.0)
        for ep in endpoints:
            uncached = float(tokens) - _held(match, ep, tokens)
            queue_s, overhead_s, prefill_s = latency.prefill_stage(ep, uncached, now)
            bw = self._bandwidth.get((ep.name, decode.name), self._prior_bw)
            nbytes = moved * self._kv_bytes if ep is not decode else 0.0
            transfer = nbytes / bw
            leg = queue_s + overhead_s + prefill_s
            # A prefill pod that also decodes (role prefill-decode) stalls its own streams.
            m = ep.metrics
            stall = self._stall_w * max(m.running - m.waiting, 0) * prefill_s
            split = self._ttft_w * (max(leg + transfer, d_queue) + d_overhead) + self._others_w * stall
            legs[ep.name] = _Leg(queue_s, overhead_s, prefill_s, uncached, transfer, nbytes, bw, stall, split)
            costs.append(split)
        self._last = _Pricing(request, decode, legs)
        best = min(costs)
        return [best / c if c > 0 else 1.0 for c in costs]

    # --- the decision ------------------------------------------------------------------------------

    def disaggregate(
        self,
        cycle: interfaces.CycleState,
        request: InferenceRequest,
        decode: Endpoint | None,
        prefill: interfaces.ProfileResult | None,
    ) -> bool:
        pricing = self._last
        if decode is None or prefill is None or pricing is None or pricing.request is not request:
            return False
        if pricing.decode is not decode:
            pricing.reason = "the prefill pods were not priced for this decode pod"
            return False
        decided = cycle.get(self._latency.name) if self._latency is not None else None
        local = decided.terms.get(decode.name) if isinstance(decided, TTFTDecision) else None
        if local is None:
            pricing.reason = "the decode pod was not priced"
            return False
        extras = decided.extras.get(decode.name, {}) if isinstance(decided, TTFTDecision) else {}
        pricing.local_ttft_s = local.ttft
        pricing.local_stall_s = extras.get("prefill_stall_others_s", 0.0)
        pricing.local_s = self._ttft_w * local.ttft + self._others_w * pricing.local_stall_s
        leg = pricing.legs.get(prefill.targets[0].name)
        if leg is None:
            pricing.reason = "the prefill pick was not priced"
            return False
        pricing.best_split_s = leg.split_s
        if deciders.prompt_tokens(request) < self._min_prompt:
            pricing.reason = f"prompt under minPromptTokens {self._min_prompt}"
        elif prefill.targets[0] is decode:
            pricing.reason = "the best prefill pod is the decode pod"
        elif leg.split_s + self._margin < pricing.local_s * (1.0 - self._ratio):
            pricing.split = True
            pricing.reason = f"saves {pricing.local_s - leg.split_s:.4f} s"
        else:
            pricing.reason = f"local is cheaper by {leg.split_s - pricing.local_s:.4f} s"
        return pricing.split

    # --- effects -----------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        pricing = self._last
        self._last = None
        prefill = result.stages.get("prefill")
        if pricing is None or pricing.request is not request or not prefill or self._latency is None:
            return
        pod = prefill[0]
        leg = pricing.legs.get(pod.name)
        if leg is None or pricing.decode is None:
            return
        self._latency.book_prefill(pod, leg.uncached, clock.now())
        pending = self._pending
        pending[id(request)] = _Pending(
            request,
            (pod.name, pricing.decode.name),
            leg.transfer_bytes,
            leg.queue_s + leg.overhead_s + leg.prefill_s,
            self._latency.overhead_seconds,
        )
        while len(pending) > MAX_PENDING:
            pending.popitem(last=False)

    def response_complete(self, request: InferenceRequest, outcome: interfaces.RequestOutcome) -> None:
        booked = self._pending.pop(id(request), None)
        if booked is None or booked.request is not request or not outcome.ok or outcome.ttft_s is None:
            return
        if booked.bytes <= 0.0:
            return
        residual = outcome.ttft_s - booked.leg_s - booked.overhead_s
        if residual <= 0.0:
            return  # the prediction of the leg was high: nothing to say about the transfer
        seen = booked.bytes / residual
        old = self._bandwidth.get(booked.pair, self._prior_bw)
        new = math.exp(math.log(old) + self._learn_w * (math.log(seen) - math.log(old)))
        self._bandwidth[booked.pair] = min(max(new, self._prior_bw / 1000.0), self._prior_bw * 10.0)
        self._samples[booked.pair] += 1

    def bandwidth(self, prefill: str, decode: str) -> float:
        """The learned transfer rate of a pod pair, bytes per second (the prior until learned)."""
        return self._bandwidth.get((prefill, decode), self._prior_bw)

    def _on_endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        if removed:
            gone = {ep.name for ep in removed}
            for pair in [p for p in self._bandwidth if gone.intersection(p)]:
                del self._bandwidth[pair]
                self._samples.pop(pair, None)

    def explain(self, cycle: interfaces.CycleState) -> Mapping[str, Any]:
        pricing = self._last
        if pricing is None:
            return {}
        if pricing.decode is None:
            unpriced = {ep.name: {"priced": False} for ep in cycle.get(framework.CANDIDATES) or ()}
            return {"request": {"reason": pricing.reason}, "endpoints": unpriced}
        endpoints = {
            name: {
                "leg_s": leg.queue_s + leg.overhead_s + leg.prefill_s,
                "queue_s": leg.queue_s,
                "overhead_s": leg.overhead_s,
                "prefill_s": leg.prefill_s,
                "uncached_tokens": leg.uncached,
                "transfer_s": leg.transfer_s,
                "transfer_bytes": leg.transfer_bytes,
                "bandwidth_bytes_per_s": leg.bandwidth,
                "bandwidth_samples": self._samples.get((name, pricing.decode.name), 0),
                "stall_others_s": leg.stall_s,
                "split_s": leg.split_s,
            }
            for name, leg in pricing.legs.items()
        }
        request = {
            "decode_pod": pricing.decode.name,
            "local_s": pricing.local_s,
            "local_ttft_s": pricing.local_ttft_s,
            "local_stall_s": pricing.local_stall_s,
            "best_split_s": pricing.best_split_s if math.isfinite(pricing.best_split_s) else -1.0,
            "split": pricing.split,
            "reason": pricing.reason,
            "kv_bytes_per_token": self._kv_bytes,
        }
        return {"request": request, "endpoints": endpoints}


def _held(match: Any, ep: Endpoint, tokens: int) -> float:
    """Prompt tokens `ep` holds on GPU per the prefill profile's precise match (else 0)."""
    if not isinstance(match, PrefixMatch):
        return 0.0
    held = match.matches.get(ep.name)
    if held is None:
        return 0.0
    size = match.block_sizes.get(ep.name, match.block_size)
    # vLLM computes the prompt's last token even on a full hit.
    return float(min(held.gpu_blocks * size, max(tokens - 1, 0)))
