"""`request-latency-scorer`: pick the endpoint where the whole request costs least: its own time
to first token, its own decode at the batch it joins, and what it does to the requests already
there.

Why: `predicted-ttft-scorer` prices cache affinity against load for the first token only. A pod
holding a hot prefix then keeps winning on TTFT (a hit is cheap) while its batch grows: every
sequence there reads more KV per step, and per-token time doubles (issue 18: 25 sequences at ~95
ms a token beside pods decoding 12 at ~55 ms). The user waits for the last token, not the first.

The objective, per candidate endpoint `e`, in seconds of someone's latency:

    objective(e) = ttftWeight * (ttft_objective(e)        predicted-ttft-scorer's (queue, uncached
                                                          prefill, KV pressure, miss penalty)
                   + admission(e))                        waiting for KV blocks
                 + out * step(n + 1, ctx + L)             its own decode
                 + n * overlap * (step(n + 1, ctx + L) - step(n, ctx))
                                                          the slowdown it imposes on the n there
                 + stallWeight * decoding * prefill(e)    its prefill stalls their streams

- `step(n, ctx) = a + b * n + c * ctx`: the per-token time of a pod decoding `n` sequences over
  `ctx` context tokens, the simulator's (and vLLM's) roofline: a fixed part (weights read, step
  overhead), a per-sequence part (the linear layers once compute-bound) and a per-context-token
  part (attention reading the KV). `a`, `b`, `c` are learned from the pods' own numbers: each
  completed response's time per output token ((duration - TTFT) / (tokens - 1)) against the batch
  and context its endpoint had on average over the response's life, by recursive least squares
  (forgetting `tpotForgetting`), from a prior of `stepSeconds`, 0 and 0 (until responses complete
  the decode terms price only the batch's size at the prior fixed step). The model is shared;
  with `podStepFactors` (default on, with `learnFromMetrics`) each pod's step is its own factor
  times it, learned from the pod's /metrics: over a window of its scrapes, its mean inter-token
  latency (vLLM's `inter_token_latency_seconds`; `metrics_learning.py`) against the model's
  prediction for the batch and context epp had in flight there meanwhile, the log of the ratio
  averaged, the factors kept at a geometric mean of 1. A pool of A100 and H100 pods decodes at two
  paces, which one model priced at their mean (docs/bench/routing.md#pod-step-factors).
- `n`, `ctx`: the requests epp has in flight on `e` and their context (prompt + half the expected
  output: a sequence's average size over its decode), or the scraped running + waiting when more
  (other replicas' traffic), its context scaled alike. `L` the new request's, `out` its expected
  output: `max_tokens` times the learned ratio of generated to allowed tokens, else the learned
  mean output.
- `admission(e)`: past `kvSoftLimit` of its KV cache, the scraped waiting requests are waiting for
  blocks, admitted one per finishing sequence: `waiting x decode / running` (Little's law; `decode`
  the learned mean time from first token to the end), which predicted-ttft-scorer's prefill-rate
  queue misses under overload.
- `overlap`: how many of their steps the new sequence shares: the lesser of its output and half
  the mean output (the others' mean remaining tokens).
- `decoding`: requests running there (not waiting), whose streams stall while a prefill shares
  their steps; `prefill(e)` is the uncached prefill time predicted-ttft-scorer prices.

A prompt no endpoint holds goes to its rendezvous home (predicted-ttft-scorer) among the
endpoints whose objective is within `homeTolerance` of the request's own first-token work on the
best one (explain's `overhead_s` + `prefill_s`, at ttftWeight), or `homeSlackSeconds`, of the
minimum. A share of the whole objective, or of its TTFT, grows with the decode and the queues:
cold prompts then waited behind others' prefills, and past capacity the hash, not the queues,
placed them. No pod where it would wait more than `homeWaitShare` of its own prefill (and more
than `homeSlackSeconds` beyond the least wait) is its home: the stall term prices a cold prefill
on a pod decoding many streams above a queue on an idle one, and without it a pod just back from a
restart drew every prompt the pod going down had held, each behind the others.

A prompt some pod holds stays on the pod holding most of it when another is better by less than
`holderTolerance` of the whole objective (predicted-ttft-scorer's rule; 0.05 in epp's default
config): the decode terms rest on an expected output and a batch to come, while the miss a move
costs is certain and lands at the first-token tail (BENCHMARKS.md#holder-tolerance).

Hot prefixes replicate through this objective: the pods holding a hot prefix gather its requests
and their batch and context grow, so their decode price rises until a miss elsewhere (one prefill,
paid once per new replica) is cheaper; the next request seeds a new replica, which its successors
then hit. predicted-ttft-scorer's popularity scaling of the miss penalty still applies.

Under P/D, decode first, `pd-latency-decider` may say before this profile runs that it splits most
requests like this one (`RemotePrefill` in the cycle state: that share, and the KV's transfer
seconds per token): that share of each endpoint's own prefill and miss price is then the transfer
of its uncached tokens instead, and that share of the stall is dropped (its streams do not stall
for a prefill run elsewhere).

Latency targets (`x-slo-ttft-ms`, `x-slo-tpot-ms`; `slo_targets.py`, docs/slo.md): with targets
in play, the candidates predicted to meet them (TTFT: `predicted_ttft_s` + `admission_wait_s`;
TPOT: `step_s` against the request's own target; for the targets of the requests running
there, `step_s` plus the stall this request's prefill imposes on them, spread over half a mean
output) outscore those that miss, and the objective decides among each tier. Without any, the
scores are the objective's alone.

Effects: `pre_request` books the request on its endpoint (batch, context, its TPOT target, the
time integrals the learning reads); `response_complete` releases it and learns. Explain: every
term per endpoint (`e2e_s`, `decode_s`, `step_s`, `slowdown_others_s`, `prefill_stall_others_s`,
`batch`, `context_tokens`, `output_tokens`) beside predicted-ttft-scorer's, the learned step
model, and with targets in play `slo` per endpoint and per request.

Parameters: predicted-ttft-scorer's, and
- `stepSeconds` (0.02, > 0): the prior per-token time of a lightly loaded pod.
- `decodeWeight` (1.0, >= 0): weight of the request's own decode time.
- `othersWeight` (1.0, >= 0): weight of the slowdown and stalls it imposes on others.
- `stallWeight` (1.0, >= 0): the prefill stall's share of that (0: the slowdown of their steps
  only; on `unique` traffic, where every request is a miss, 0.3 trades a few of the others'
  per-token milliseconds for a lower TTFT tail: docs/bench/routing.md#five-seeds).
- `tpotForgetting` (0.999, (0.9, 1]): how fast old observations of the step model fade.
- `meanOutputTokens` (256, >= 1): the prior mean output of a request without `max_tokens`.
- `podStepFactors` (true): each pod's own factor on the step model, from its /metrics (needs
  `learnFromMetrics`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping
from typing import Annotated, Any, Final

import msgspec

from epp import clock
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import slo_targets
from epp.scheduling.plugins.metrics_learning import Growth
from epp.scheduling.plugins.precise_prefix_cache_scorer import PrefixMatch
from epp.scheduling.plugins.predicted_ttft_scorer import PredictedTTFTScorer
from epp.scheduling.plugins.predicted_ttft_terms import (
    REMOTE_PREFILL_KEY,
    Prediction,
    RemotePrefill,
    TTFTDecision,
)
from epp.scheduling.plugins.step_model import StepModel, step_at

MAX_ACTIVE: Final = 65536
"""Requests tracked in flight; beyond it the oldest are dropped (lost responses)."""

POD_SPEED_RATE: Final = 0.05
"""The least weight of a pod's latest metrics window in its step factor (`podStepFactors`): the
factor follows a change within ~20 windows (~40 s at the default window)."""


@dataclasses.dataclass(slots=True)
class _Load:
    """What epp has in flight on one endpoint, and its integral over time."""

    n: int = 0
    ctx: float = 0.0
    at: float = 0.0  # clock time of the last change
    area_n: float = 0.0  # integral of n dt up to `at`
    area_ctx: float = 0.0

    def advance(self, now: float) -> None:
        if now > self.at:
            dt = now - self.at
            self.area_n += self.n * dt
            self.area_ctx += self.ctx * dt
        self.at = max(self.at, now)


@dataclasses.dataclass(slots=True)
class _Active:
    endpoint: str
    ctx: float
    max_tokens: int | None
    start: float
    area_n: float
    area_ctx: float
    tpot_target: float | None = None


@dataclasses.dataclass(slots=True)
class _Scoring:
    """The request being scored, as `_predict` (called per endpoint by the base class) needs it:
    what does not depend on the endpoint is worked out once per request."""

    request: InferenceRequest
    out: float  # expected output tokens
    size: float  # its context: prompt + half its expected output
    terms: dict[str, tuple[float, ...]]  # per endpoint, values in the order of EXTRA_FIELDS
    slo: bool  # targets in play: the request's, or those of requests in flight
    verdicts: dict[str, slo_targets.Verdict]
    coefficients: tuple[float, float, float]  # the step model's, as `StepModel.step` uses them
    overlap: float  # the tokens of its decode that overlap a running stream's
    # per endpoint: its first token had it no wait (overhead + uncached prefill, slowed by decodes)
    own: dict[str, float] = dataclasses.field(default_factory=dict)
    remote: RemotePrefill | None = None  # P/D: the prefill expected on another pod


@registry.register("request-latency-scorer")
class RequestLatencyScorer(PredictedTTFTScorer):
    class Params(PredictedTTFTScorer.Params, forbid_unknown_fields=True):
        stepSeconds: Annotated[float, msgspec.Meta(gt=0.0, le=10.0)] = 0.02
        ttftWeight: Annotated[float, msgspec.Meta(ge=0.0, le=1e6)] = 1.0
        decodeWeight: Annotated[float, msgspec.Meta(ge=0.0, le=1e6)] = 1.0
        othersWeight: Annotated[float, msgspec.Meta(ge=0.0, le=1e6)] = 1.0
        stallWeight: Annotated[float, msgspec.Meta(ge=0.0, le=1e6)] = 1.0
        tpotForgetting: Annotated[float, msgspec.Meta(gt=0.9, le=1.0)] = 0.999
        meanOutputTokens: Annotated[float, msgspec.Meta(ge=1.0, le=1e7)] = 256.0
        podStepFactors: bool = True

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        super().__init__(name, params, handle)
        self._model = StepModel(params.stepSeconds, params.tpotForgetting)
        self._ttft_w = params.ttftWeight
        self._decode_w = params.decodeWeight
        self._others_w = params.othersWeight
        self._stall_w = params.stallWeight
        self._mean_out = params.meanOutputTokens
        self._out_ratio = 1.0  # learned: generated / allowed tokens
        self._out_seen = 0.0
        self._loads: dict[str, _Load] = {}
        # Per endpoint, (clock time, area_n, area_ctx) of its load at its last metrics growth.
        self._metric_areas: dict[str, tuple[float, float, float]] = {}
        # Per endpoint, its per-token time as a factor on the shared step model, learned from its
        # /metrics (`podStepFactors`); 1 until it has some. The model learns from responses.
        self._pod_speed = params.podStepFactors and params.learnFromMetrics
        self._speeds: dict[str, float] = {}
        self._speed_seen: dict[str, int] = {}
        self._active: collections.OrderedDict[int, _Active] = collections.OrderedDict()
        # endpoint -> the TPOT targets of the requests in flight there (target -> count)
        self._tpot_targets: dict[str, collections.Counter[float]] = {}
        self._slo_key = f"{name}/slo"
        self._scoring: _Scoring | None = None

    # --- decision -------------------------------------------------------------------------------

    def expected_output(self, request: InferenceRequest) -> float:
        """Output tokens the request is expected to generate."""
        allowed = request.max_output_tokens
        if allowed is not None and allowed > 0:
            return max(1.0, allowed * self._out_ratio)
        return self._mean_out

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        found = cycle.get(self._prefix)
        match = found if isinstance(found, PrefixMatch) else None
        tokens = (match.request_tokens if match is not None else 0) or _prompt_len(request)
        out = self.expected_output(request)
        terms: dict[str, tuple[float, ...]] = {}
        slo = request.slo_ttft is not None or request.slo_tpot is not None or bool(self._tpot_targets)
        overlap = min(out, self._mean_out / 2.0)
        remote = cycle.get(REMOTE_PREFILL_KEY)
        scoring = _Scoring(
            request, out, tokens + out / 2.0, terms, slo, {}, self._model.coefficients, overlap,
            remote=remote if isinstance(remote, RemotePrefill) and remote.share > 0.0 else None,
        )  # fmt: skip
        self._scoring = scoring
        try:
            scores = super().score(cycle, request, endpoints)
        finally:
            self._scoring = None
        decision = cycle.get(self.name)
        if isinstance(decision, TTFTDecision):
            decision.extra_rows = terms
            decision.remote = scoring.remote
        verdicts = scoring.verdicts
        if verdicts and len(verdicts) == len(endpoints):
            tiered = slo_targets.tiered(scores, [verdicts[ep.name].tier for ep in endpoints])
            cycle[self._slo_key] = slo_targets.SloDecision(
                request.slo_ttft,
                request.slo_tpot,
                verdicts,
                objective_best=endpoints[slo_targets.best_index(scores)].name,
                preferred=endpoints[slo_targets.best_index(tiered)].name,
            )
            scores = tiered
        return scores

    def _predict(
        self, ep: Endpoint, tokens: int, match: PrefixMatch | None, now: float, penalty: float
    ) -> Prediction:
        p = super()._predict(ep, tokens, match, now, penalty)
        scoring = self._scoring
        if scoring is None:
            return p
        name = ep.name
        out, size = scoring.out, scoring.size
        load = self._loads.get(name)
        n, ctx = (load.n, load.ctx) if load is not None else (0, 0.0)
        m = ep.metrics
        waiting = m.waiting
        seen = m.running + waiting
        if seen > n:  # other replicas' requests too: their context taken as the average of ours
            ctx = ctx * seen / n if n else seen * size
            n = seen
        coefficients = scoring.coefficients
        speed = self._speeds.get(name, 1.0)
        before = speed * step_at(coefficients, n, ctx)
        after = speed * step_at(coefficients, n + 1, ctx + size)
        decode = out * after
        slowdown = n * scoring.overlap * (after - before)
        prefill = p.uncached * self._rates[name].cost * p.slowdown  # the base class made the rate
        stall = self._stall_w * (n - waiting if n > waiting else 0) * prefill
        ttft_objective = p.objective
        own = prefill
        remote = scoring.remote
        if remote is not None:
            # P/D: the prefill is expected on a prefill pod. This pod then computes none of it and
            # its streams do not stall; the uncached KV moves in instead. Priced locally, a
            # decode pod's choice followed a prefill that does not happen: the pods holding the
            # prompt, or with the fewest streams to stall, drew the requests (`epp bench pd`,
            # pd-mixed at 4 times with 5% prefill deaths: one decode pod of 4 took 41-43%), and
            # the prefills the sidecar fell back to there stalled their streams.
            q = remote.share
            transfer = p.uncached * remote.seconds_per_token
            local = p.objective - self._overhead * p.slowdown - p.queue_s - p.kv_price  # service + miss
            ttft_objective += q * (transfer - local)
            stall *= 1.0 - q
            own += q * (transfer - prefill)
        scoring.own[name] = self._overhead * p.slowdown + own
        admission = 0.0
        if waiting > 0 and m.kv_usage >= self._kv_soft:
            # Requests wait for KV blocks, admitted one per finishing sequence: the queue ahead
            # drains at `running` per mean decode time (Little), not at the prefill rate.
            admission = waiting * self._decode_s / max(m.running, 1)
        p.objective = (
            self._ttft_w * (ttft_objective + admission)
            + self._decode_w * decode
            + self._others_w * (slowdown + stall)
        )
        scoring.terms[name] = (  # EXTRA_FIELDS
            ttft_objective,
            admission,
            p.ttft + admission + decode,
            decode,
            after,
            speed,
            out,
            n,
            ctx,
            slowdown,
            stall,
        )
        if scoring.slo:
            running = self._tpot_targets.get(name)
            request = scoring.request
            # The streams running there stall for this prefill: spread over what is left of
            # them (half a mean output), it is part of their time per token.
            held = after + (prefill / max(self._mean_out / 2.0, 1.0) if n > m.waiting else 0.0)
            scoring.verdicts[ep.name] = slo_targets.verdict(
                p.ttft + admission,
                after,
                request.slo_ttft,
                request.slo_tpot,
                min(running) if running else None,
                held,
            )
        return p

    def _unplaced_choice(self, endpoints: list[Endpoint], scores: list[float], chosen: int) -> int:
        """With latency targets, the least objective among the endpoints predicted to meet them
        (what `slo_targets.tiered` prefers). A pre-warm that cannot be sent moves its request
        there, not to the objective's favourite where that misses them: on rolling-restart the
        favourite was a pod just back in rotation, and such moves stacked 3-4 cold prefills on
        it, their first tokens 1.5-2.6 s against a 1 s target other pods met."""
        scoring = self._scoring
        if scoring is None or not scoring.slo or len(scoring.verdicts) != len(endpoints):
            return chosen
        tiers = [scoring.verdicts[ep.name].tier for ep in endpoints]
        return slo_targets.best_index(slo_targets.tiered(scores, tiers))

    def _home_limit(self, endpoints: list[Endpoint], objectives: list[float], best: float) -> float:
        """How far above the minimum a prompt no endpoint holds may go to its rendezvous home:
        `homeTolerance` of the request's own first-token work on the best endpoint (overhead and
        uncached prefill at its decode slowdown: explain's `overhead_s` + `prefill_s`), at
        ttftWeight, or `homeSlackSeconds`.

        Not a share of the whole objective, nor of its TTFT: those add the request's decode and
        its waits, which grow with load, so 20% of them admitted homes whose queue alone was
        longer than the whole first token elsewhere (docs/bench/routing.md#five-seeds): cold prompts
        waited behind another's prefill, and past capacity the hash, not the queues, placed
        nearly every request."""
        scoring = self._scoring
        own = scoring.own.get(endpoints[objectives.index(best)].name) if scoring is not None else None
        if own is None:
            return super()._home_limit(endpoints, objectives, best)
        return best + max(self._home_tol * self._ttft_w * own, self._home_slack)

    # --- effects --------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        last = self._last
        super().pre_request(request, result)
        if last is None or last[0] is not request or not result.targets:
            return
        name = result.targets[0].name
        now = clock.now()
        load = self._loads.get(name)
        if load is None:
            load = self._loads[name] = _Load(at=now)
        load.advance(now)
        ctx = _prompt_len(request) + self.expected_output(request) / 2.0
        load.n += 1
        load.ctx += ctx
        active = self._active
        target = request.slo_tpot
        active[id(request)] = _Active(
            name, ctx, request.max_output_tokens, now, load.area_n, load.area_ctx, target
        )
        if target is not None:
            self._tpot_targets.setdefault(name, collections.Counter())[target] += 1
        while len(active) > MAX_ACTIVE:
            _, old = active.popitem(last=False)
            self._release(old, now)

    def _release(self, a: _Active, now: float) -> _Load | None:
        if a.tpot_target is not None:
            targets = self._tpot_targets.get(a.endpoint)
            if targets is not None:
                targets[a.tpot_target] -= 1
                if targets[a.tpot_target] <= 0:
                    del targets[a.tpot_target]
                if not targets:
                    del self._tpot_targets[a.endpoint]
        load = self._loads.get(a.endpoint)
        if load is None:
            return None
        load.advance(now)
        load.n = max(load.n - 1, 0)
        load.ctx = max(load.ctx - a.ctx, 0.0) if load.n else 0.0
        return load

    def response_complete(self, request: InferenceRequest, outcome: interfaces.RequestOutcome) -> None:
        super().response_complete(request, outcome)
        a = self._active.pop(id(request), None)
        if a is None:
            return
        now = clock.now()
        load = self._release(a, now)
        out = outcome.completion_tokens
        if not outcome.ok or out is None or out < 1:
            return
        self._out_seen += 1.0
        weight = max(1.0 / (self._out_seen + 1.0), self._min_rate)
        self._mean_out += weight * (out - self._mean_out)
        if a.max_tokens:
            self._out_ratio += weight * (min(out / a.max_tokens, 1.0) - self._out_ratio)
        ttft = outcome.ttft_s
        span = now - a.start
        if load is None or ttft is None or out < 2 or span <= 0 or outcome.duration_s <= ttft:
            return
        # The batch and context the request decoded among, averaged over its life (its own share
        # included, as the prediction counts it).
        n = (load.area_n - a.area_n) / span
        ctx = (load.area_ctx - a.area_ctx) / span
        speed = self._speeds.get(a.endpoint, 1.0)
        self._model.observe(n, ctx, (outcome.duration_s - ttft) / (out - 1) / speed)

    def _learn_growth(self, ep: Endpoint, growth: Growth) -> None:
        """Beside the base class's, the pod's step factor (`podStepFactors`): its mean time per
        token over the window against the shared model's prediction for the batch and context epp
        had in flight there meanwhile. The shared model itself learns from responses only: fed
        these windows too it chased their noise (in flight is not decoding: a 32k-token prompt
        in prefill counts), and on rag (fast mode, seeds 1 and 3) E2E p99 went from 11.9 and 11.1
        s to 15.3 and 15.0."""
        super()._learn_growth(ep, growth)
        if not self._pod_speed:
            return
        load = self._loads.get(ep.name)
        if load is None:
            return
        now = clock.now()
        load.advance(now)
        last = self._metric_areas.get(ep.name)
        self._metric_areas[ep.name] = (now, load.area_n, load.area_ctx)
        if last is None or growth.tokens < 1.0 or now <= last[0]:
            return
        span = now - last[0]
        n = (load.area_n - last[1]) / span
        if n <= 0.0:  # tokens made only for other replicas' requests say nothing of epp's batch
            return
        ctx = (load.area_ctx - last[2]) / span
        tpot = growth.token_seconds / growth.tokens
        # The factor moves by the log of observed over predicted, with a weight decaying to
        # POD_SPEED_RATE; the factors are then kept at a geometric mean of 1
        # (`_learned_from_pods`): only how the pods differ is theirs.
        seen = self._speed_seen.get(ep.name, 0) + 1
        self._speed_seen[ep.name] = seen
        old = self._speeds.get(ep.name, 1.0)
        ratio = min(max(tpot / max(old * self._model.step(n, ctx), 1e-6), 0.1), 10.0)
        self._speeds[ep.name] = old * math.exp(max(1.0 / seen, POD_SPEED_RATE) * math.log(ratio))

    def _learned_from_pods(self) -> None:
        speeds = self._speeds
        if len(speeds) > 1:
            mean = math.exp(sum(math.log(v) for v in speeds.values()) / len(speeds))
            for name in speeds:
                speeds[name] /= mean
        else:
            speeds.update(dict.fromkeys(speeds, 1.0))  # one pod alone: the model is its own

    def _on_endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        super()._on_endpoints_changed(added, removed)
        for ep in removed:
            self._metric_areas.pop(ep.name, None)
            self._speeds.pop(ep.name, None)
            self._speed_seen.pop(ep.name, None)
            self._loads.pop(ep.name, None)
            self._tpot_targets.pop(ep.name, None)

    @property
    def step_model(self) -> StepModel:
        """The learned per-token time model."""
        return self._model

    # --- explain --------------------------------------------------------------------------------

    def explain(self, cycle: interfaces.CycleState) -> Mapping[str, Any]:
        """predicted-ttft-scorer's terms per endpoint plus this objective's: `objective_s` =
        (`ttft_objective_s` (predicted-ttft-scorer's objective: overhead + queue + prefill + KV
        price + miss penalty) + `admission_wait_s`) x ttftWeight + `decode_s` x decodeWeight +
        (`slowdown_others_s` + `prefill_stall_others_s`) x othersWeight; `e2e_s` =
        `predicted_ttft_s` + `admission_wait_s` + `decode_s`.
        Under P/D (`remote_prefill`: the share of such requests the decider splits, and the
        KV's transfer seconds per token) `ttft_objective_s` and `prefill_stall_others_s` take that
        share of the transfer in place of the endpoint's own prefill and stall.
        `step_s` is the per-token time predicted after the pick (`batch` sequences over
        `context_tokens` before it), `pod_step_factor` the endpoint's factor on the shared model;
        request-level `step_model` gives the learned coefficients.
        With latency targets in play, `slo` per endpoint (predictions against the targets, met or
        not, the tier) and per request (who meets them, which target drove the preferred
        candidate): `slo_targets.Verdict.explain`, `SloDecision.explain`."""
        base = dict(super().explain(cycle))
        decision = cycle.get(self.name)
        if not base or not isinstance(decision, TTFTDecision):
            return base
        endpoints = base.get("endpoints", {})
        for name in decision.extra_rows:
            extra = decision.extras(name)
            row = endpoints.get(name)
            if row is None:
                continue
            parts = row["overhead_s"] + row["queue_s"] + row["prefill_s"] + row["kv_price_s"]
            off = abs(parts + row["miss_penalty_s"] - extra["ttft_objective_s"]) > 1e-9
            if off and decision.remote is None:
                # Without the candidates the miss penalty was taken as what was left of the whole
                # objective; it is what is left of the TTFT objective.
                row["miss_penalty_s"] = max(extra["ttft_objective_s"] - parts, 0.0)
            row.update(extra)
        slo = cycle.get(self._slo_key)
        if isinstance(slo, slo_targets.SloDecision):
            for name, verdict in slo.verdicts.items():
                row = endpoints.get(name)
                if row is not None:
                    row["slo"] = verdict.explain()
            base["request"]["slo"] = slo.explain()
        a, b, c = self._model.coefficients
        base["request"]["step_model"] = {
            "fixed_s": a,
            "per_sequence_s": b,
            "per_context_token_s": c,
            "observations": self._model.seen,
        }
        if decision.remote is not None:
            base["request"]["remote_prefill"] = {
                "share": decision.remote.share,
                "seconds_per_token": decision.remote.seconds_per_token,
            }
        base["request"]["output_ratio"] = self._out_ratio
        base["request"]["weights"] = {
            "ttft": self._ttft_w,
            "decode": self._decode_w,
            "others": self._others_w,
        }
        return base


def _prompt_len(request: InferenceRequest) -> int:
    if request.token_ids:
        return len(request.token_ids)
    return request.prompt_tokens_estimate
