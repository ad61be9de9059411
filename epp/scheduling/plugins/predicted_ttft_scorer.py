"""`predicted-ttft-scorer`: price cache affinity against load as the request's predicted time to
first token (TTFT) on each endpoint, and prefer the smallest.

Why: every other scorer measures one thing (prefix match, queue depth, KV usage) and the profile
sums them with fixed weights, so a load scorer outvotes a cache hit, or a cache hit piles a tenant
onto one hot pod, depending on the weights and the load. What a user feels is time, and both cache
and load convert to it: a cached block saves its prefill, a queued request delays this one.

The model, per candidate endpoint `e` (seconds):

    ttft(e) = (overhead + uncached(e) * cost(e)) * (1 + k * decodes(e))   a step, its own prefill
            + queue(e)                                                   prefill work ahead of it
            + kv_wait(e)                                                 waiting for free KV blocks

- `uncached(e)`: the prompt tokens the endpoint does not hold, from the `PrefixMatch` the precise
  prefix scorer (`prefixScorer`, earlier in the profile; weight 0 is fine) leaves in the cycle
  state, counted as vLLM counts cached tokens; a block held only off GPU costs `offloadCost` of a
  miss. Without a precise match every endpoint is priced as a miss: the approximate
  `prefix-cache-scorer` leaves only the request's block hashes there, not per-endpoint matches.
- `cost(e)` (seconds per prefill token, per endpoint), `overhead` and `k` (shared): learned online
  from the TTFTs observed on the response path, by a gradient step on the squared log error of the
  prediction (each parameter moves by its share of it), clipped to a factor of `maxUpdateRatio` per
  observation, so one stalled request moves nothing far. `cost` starts from the prior
  `prefillTokensPerSecond` weighing `priorObservations` observations, its step weight decaying to
  `minLearningRate`; `overhead` (`overheadSeconds`) and `k` (`decodeInterference`) start from their
  parameters and learn at `minLearningRate` (`learnShared: false` keeps them fixed). The tokens of
  an observation are the queue ahead at pick time plus the uncached tokens the model server
  reported (the learning rules: `predicted_ttft_learning`). Exported:
  `epp_predicted_ttft_prefill_tokens_per_second{plugin, endpoint}`.
  With `learnFromMetrics`, where few of a pod's responses pass through epp (one in many behind
  epp's own gateway config), its `vllm:time_to_first_token_seconds` teaches the rate too: each
  window's mean TTFT against the mean work of epp's own requests whose first token it predicted
  meanwhile, weighing as that many observations (`metrics_learning.FirstTokens`). vLLM's
  prefill histograms (`request_prefill_time_seconds` over `request_prefill_kv_computed_tokens`)
  are not used: they time the compute alone, about twice as fast as the rate that predicts TTFT
  with this model, and mixing the two moved a seed-stress TTFT p99 from 0.19 to 0.95 s (fast mode).
- `decodes(e)`: running requests (scraped, or epp's own in-flight count when larger): each takes a
  token of every step's budget and attention time, which slows the step a prefill runs in.
- `queue(e)`: the larger of (a) a fluid "busy until" time per endpoint, advanced at pick time by
  the booked request's own prefill time and drained by the passing of time (`epp.clock`, so it
  runs in a benchmark's virtual time), which sees every decision of this epp at once (each
  prefill booked 1/share times, this epp's learned share of the fleet's traffic: with N replicas
  it books 1/N of the work; `traffic_share.py`), and (b) the
  scraped queue depth (`vllm:num_requests_waiting`) times the mean booked prefill, times
  `queueDepthWeight`, which also sees other replicas' traffic, one scrape late.
- `kv_wait(e)`: past `kvSoftLimit` of the pod's KV cache in use (scraped `kv_usage` plus the
  request's own new blocks), vLLM admits new blocks only as running requests finish, and their
  decodes claim the freed blocks first: the price is `kvPressureWeight * decode * over`, `over`
  the excess as a fraction of the room above the limit (at most 2), `decode` the mean time from
  first token to the end of a response (learned from response durations, prior `decodeSeconds`;
  with `learnFromMetrics`, also from each pod's vLLM `request_decode_time_seconds` between its
  scrapes, `metrics_learning.py`: every request a pod serves, where epp reads one response in
  many behind its own gateway config).
  On a P/D decode pod the blocks in use also count the KV of the split requests booked there that
  has not landed: their prompt's KV arrives after a prefill elsewhere, which neither the pod's
  scrape nor its fluid queue shows until then (without it a decode pod looked emptier with each
  split it drew: docs/disaggregation.md#epps-decider-pd-latency-decider). It is counted off when the
  answer's headers arrive (a sidecar sends the decode leg once the prefill pod answered; an answer
  that does not stream has them at its end, and its KV counts twice meanwhile); if they say epp's
  sidecar prefills on the decode pod itself (`x-epp-prefill: local`, its prefill pod failed), that
  prefill joins the decode pod's fluid queue then.
  The choice pays that price in full (it keeps a pod from evicting hot prefixes and preempting);
  the prediction multiplies it by a scale learned from what such waits turned out to be.

The choice minimises `objective(e) = ttft(e) + penalty * uncached(e) * cost(e) * (1 + k *
decodes(e))`, with the kv price in place of the predicted kv wait: the request's own TTFT plus the
prefill time it adds to the endpoint, which every request queued behind it there pays and which a
cache hit avoids. TTFT alone is myopic: the second request of a burst waits on its holder behind
the first one's prefill about as long as a miss elsewhere takes, and a pure TTFT choice sends it
away, duplicating the prefill and the cached blocks (fewer hits for everyone later). The prefill
also delays every request waiting on that endpoint (scraped queue depth `w`), so the term is
`penalty * (1 + missPenaltyPerWaiting * w)`: under overload a miss is priced at what it costs the
queue, and affinity wins. `penalty` is `missPenalty`, except for a prefix carrying a large share
`s` of the recent traffic (requests per first block, decaying over `popularityWindowSeconds`; 0
turns this off): it needs about `s * N` of the N endpoints' capacity, so while only `h < s * N`
endpoints hold it the penalty is scaled by `(h / (s * N))^2` and copies spread. The score is
`min objective / objective(e)`, in (0, 1], so with `max-score-picker` (the only scorer, or the
others at weight 0) the minimum wins and exact ties are broken at random.

An endpoint that got less than half the mean of the recent requests per endpoint (decaying over
the same window; a restarted, readmitted or new pod, its cache empty) is warming up: it is priced
with no miss penalty, and a prefix with at least half an endpoint's share of the traffic counts it
as one more copy needed, so the hottest prefixes get a copy there first and it climbs to its share
(explain: `warming_up`).

A prompt no endpoint holds any block of (never seen, or evicted everywhere) goes to its
rendezvous home among the endpoints within `homeTolerance` (relative) or `homeSlackSeconds` of the
minimum objective that were sent the least new KV lately (uncached prompt tokens and pre-warms,
decaying over `popularityWindowSeconds`): its blocks evict the least recently used ones of its
home, and there those are the oldest, the least likely to be asked for again; and at light load,
where predictions barely differ, new prefixes spread as their prefill work does. Of several
(nothing routed yet), the highest of a 64-bit mix of a digest of the prompt's first block (with
the model and cache salt) and a CRC of the endpoint name, the same in every process. The home
scores 1.0, every other endpoint its score times (1 - 1e-9). Its next requests find it held there
(the precise scorer's speculative entries, then the pod's KV events). No endpoint is its home
where it would wait (queue and KV wait) more than `homeWaitShare` of its own first-token work
there and more than `homeSlackSeconds` beyond the least wait of any endpoint (explain:
`ttft_home_queued`); the minimum is then taken over the others. Why: the objective prices a cold
prefill on a pod decoding many streams (their stall, the miss) above a queue on an idle one, so
the prompts of a pod that went down all went to the one just back, each behind the others'
prefills: on rolling-restart (fast mode, 120 s, seeds 1-3) they and the requests queued behind
them there were each run's slowest first tokens (1.2-2.4 s). With the rule the TTFT p99 is
0.71-0.94x, the E2E p99 0.95-1.00x (BENCHMARKS.md#home-wait).

A prompt that some endpoint holds part of stays on the endpoint holding the most of it among those
whose objective is within `holderTolerance` (relative) of the minimum, when the minimum's endpoint
holds less (explain: `ttft_holder`; it scores 1.0, as a home does). The objective is a prediction
(request-latency-scorer's decode terms rest on an expected output and the batch it would join),
while the miss that a move costs is certain and lands at the first-token tail: a move for a gain
within the predictions' error buys a miss for nothing. 0 (the default here) turns it off; epp's
default config sets 0.05 (BENCHMARKS.md#holder-tolerance).

With `prewarm` (false here; epp's default config sets it), a move off the endpoint holding the
most of a prompt, by at least `prewarmMinShare` of it, is made a stay there plus a pre-warm of the
endpoint the objective chose (`epp.scheduling.prewarm`; explain: `prewarm`): the copy a move
would have made, with no request paying its cold prefill. `pre_request` books its prefill on that
endpoint's fluid queue as a routed request's (BENCHMARKS.md#prewarm).

Effects, in `pre_request` (the decision is final): the primary's fluid queue grows by the request's
predicted prefill, the prefix's traffic count by one, and the prediction is kept (bounded) until
`response_complete`, which learns from it and observes `actual - predicted` into
`epp_predicted_ttft_error_seconds{plugin}`. Explain facts: every term of each endpoint's
prediction and objective (`explain`), per request the shared parameters and `ttft_home` when the
home rule decided.

Parameters (each checked at startup; a misspelt or out-of-range one is a `ConfigError`):
- `prefixScorer` ("precise-prefix-cache-scorer"): the plugin name whose match to read.
- `prefillTokensPerSecond` (10000, > 0), `priorObservations` (20, >= 1): the prior prefill rate.
- `minLearningRate` (0.02, (0, 1]), `maxUpdateRatio` (2.0, > 1): how fast and how far it learns
  (faster tracking costs noise: per-endpoint rates that differ by chance skew the choice).
- `overheadSeconds` (0.01), `decodeInterference` (0.02), `learnShared` (true): see above.
- `queueDepthWeight` (1.0): weight of the scraped-queue-depth estimate of the queue.
- `kvPressureWeight` (1.0), `kvSoftLimit` (0.8, [0, 1)), `decodeSeconds` (5.0, > 0): KV pressure.
- `offloadCost` (0.2, [0, 1]): a block held only off GPU costs this fraction of a miss.
- `missPenalty` (1.0), `missPenaltyPerWaiting` (1.0), `popularityWindowSeconds` (60): the price of
  a miss to the fleet.
- `homeTolerance` (0.2), `homeSlackSeconds` (0.1): how near the minimum a home may be.
- `homeWaitShare` (0.5, >= 0): how long a home may make a prompt wait, as a share of its own
  first-token work there (beyond `homeSlackSeconds` more than the least wait).
- `holderTolerance` (0, >= 0): how near the minimum the endpoint holding most of a prompt keeps it.
- `prewarm` (false), `prewarmMinShare` (0.25, (0, 1]): pre-warms in place of moves, for a holder
  holding at least that share of the prompt more than the endpoint chosen (0.25 against 0.5:
  chat's TTFT p99 0.57x against 0.74x without pre-warms, BENCHMARKS.md#prewarm).
- `learnFromMetrics` (true), `metricsWindowSeconds` (2.0, > 0): learning the decode time, the
  prefill rate where few responses are read (and, in request-latency-scorer, each pod's step
  factor) from the pods' /metrics, at most once a window each.
- `trafficShare` (1, "auto", or a share in [1/64, 1]): this epp's share of the pods' traffic, which
  scales the prefill it books; "auto" learns it from the pods' `vllm:request_success_total`
  (opt-in: docs/bench/routing-live.md#replicas measured no gain from it on the shipped default).
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import msgspec

from epp import clock
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, prewarm, registry
from epp.scheduling.plugins.metrics_learning import FirstTokens, ScrapedLatency
from epp.scheduling.plugins.precise_prefix_cache_scorer import DEFAULT_BLOCK_SIZE, PrefixMatch, cached_tokens
from epp.scheduling.plugins.predicted_ttft_learning import TTFTLearning
from epp.scheduling.plugins.predicted_ttft_terms import (
    FINITE,
    Booked,
    NonNegative,
    Prediction,
    Rate,
    TTFTDecision,
    explain_endpoints,
    observations,
    prediction_error,
    prefill_rate,
    unqueued,
)
from epp.scheduling.plugins.prefix_popularity import Popularity, first_block_digest, prompt_tokens
from epp.scheduling.plugins.traffic_share import TrafficShare
from epp.scheduling.plugins.ttft_homes import Homes, holder
from epp.sidecar.protocol import PREFILL_RESULT_HEADER

MAX_PENDING: Final = 65536
"""Predictions kept for response_complete; beyond it the oldest are dropped (lost responses)."""

HOME_MARGIN: Final = 1e-9
"""How far below the home (or the holder) every other endpoint is scaled, so the picker cannot tie
with it."""


@registry.register("predicted-ttft-scorer")
class PredictedTTFTScorer(TTFTLearning, registry.PluginBase):
    consumes_tokens: Final = True
    # `response_headers` acts only on a request whose prefill ran on another pod (P/D): where no
    # request is split, an off-sample one may skip its response's headers (`ResponseHeaders`).
    split_responses_only: Final = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        prefixScorer: str = "precise-prefix-cache-scorer"
        prefillTokensPerSecond: Annotated[float, msgspec.Meta(gt=0.0)] = 10000.0
        priorObservations: Annotated[float, msgspec.Meta(ge=1.0)] = 20.0
        minLearningRate: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.02
        maxUpdateRatio: Annotated[float, msgspec.Meta(gt=1.0)] = 2.0
        overheadSeconds: NonNegative = 0.01
        queueDepthWeight: NonNegative = 1.0
        decodeInterference: NonNegative = 0.02
        learnShared: bool = True
        kvPressureWeight: NonNegative = 1.0
        kvSoftLimit: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.8
        decodeSeconds: Annotated[float, msgspec.Meta(gt=0.0)] = 5.0
        offloadCost: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.2
        homeTolerance: NonNegative = 0.2
        homeSlackSeconds: NonNegative = 0.1
        homeWaitShare: NonNegative = 0.5
        holderTolerance: NonNegative = 0.0
        missPenalty: NonNegative = 1.0
        popularityWindowSeconds: NonNegative = 60.0
        missPenaltyPerWaiting: NonNegative = 1.0
        # 1 by default: on the shipped default the learned share did not improve replicas
        # (docs/bench/routing-live.md#replicas); "auto" opts in.
        trafficShare: Literal["auto"] | float = 1.0
        learnFromMetrics: bool = True
        metricsWindowSeconds: Annotated[float, msgspec.Meta(gt=0.0, le=3600.0)] = 2.0
        prewarm: bool = False
        prewarmMinShare: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.25

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        for field in FINITE:
            if not math.isfinite(getattr(params, field)):
                raise registry.ConfigError(f"plugin {name!r} (type {self.type!r}): {field} must be finite")
        self._prefix = params.prefixScorer
        self._prior_cost = 1.0 / params.prefillTokensPerSecond
        self._prior_n = params.priorObservations
        self._min_rate = params.minLearningRate
        self._max_step = math.log(params.maxUpdateRatio)
        self._overhead = params.overheadSeconds
        self._queue_weight = params.queueDepthWeight
        self._prewarm = params.prewarm
        self._prewarm_share = params.prewarmMinShare
        self._k_decode = params.decodeInterference
        self._learn = params.learnShared
        self._kv_weight = params.kvPressureWeight
        self._kv_soft = params.kvSoftLimit
        self._decode_s = params.decodeSeconds  # learned: mean time from first token to the end
        self._decode_seen = 0.0
        self._kv_scale = 1.0  # learned: the wait a KV-pressure price turns out to mean
        self._offload = params.offloadCost
        self._home_tol = params.homeTolerance
        self._home_slack = params.homeSlackSeconds
        self._home_wait = params.homeWaitShare
        self._holder_tol = params.holderTolerance
        self._miss_penalty = params.missPenalty
        self._waiting_weight = params.missPenaltyPerWaiting
        window = params.popularityWindowSeconds
        self._popularity = Popularity(window) if window > 0 else None
        self._homes = Homes(window)
        self._rates: dict[str, Rate] = {}
        self._mean_prefill = 0.0  # EWMA of booked uncached tokens: the work a waiting request brings
        # pre_request gets no CycleState; the Director calls it right after `schedule` with no await
        # in between, so the last request scored is the one being routed.
        self._last: tuple[InferenceRequest, dict[str, Prediction], int | None] | None = None
        self._pending: collections.OrderedDict[int, Booked] = collections.OrderedDict()
        share = params.trafficShare
        try:
            self._share = TrafficShare(handle.datastore.endpoints, None if share == "auto" else float(share))
        except ValueError as e:
            raise registry.ConfigError(f"plugin {name!r} (type {self.type!r}): trafficShare: {e}") from None
        self._error = prediction_error.labels(name)
        self._endpoints = handle.datastore.endpoints
        # The pods' own latency histograms (module docstring); checked at most four times a window.
        self._scraped = ScrapedLatency(params.metricsWindowSeconds) if params.learnFromMetrics else None
        self._first = FirstTokens()  # the pairing of TTFT windows with epp's requests (metrics_learning)
        self._scraped_check = 0.0
        self._from_responses = observations.labels(name, "response")
        self._from_metrics = observations.labels(name, "metrics")
        handle.datastore.subscribe(self._on_endpoints_changed)

    # --- decision -------------------------------------------------------------------------------

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        found = cycle.get(self._prefix)
        match = found if isinstance(found, PrefixMatch) else None
        tokens = match.request_tokens if match is not None else 0
        tokens = tokens or prompt_tokens(request)
        now = clock.now()
        digest = first_block_digest(request, match.block_size if match is not None else 0)
        penalty = self._miss_penalty
        warming = self._homes.warming(endpoints, now)
        if penalty and digest is not None and self._popularity is not None:
            # A prefix carrying a share s of the traffic needs about s * N endpoints' capacity:
            # until that many hold it, another copy is an investment, not a waste.
            share = self._popularity.share(digest, now)
            needed = share * len(endpoints)
            holders = len(match.matches) if match is not None else 0
            if warming and share >= 0.5 / len(endpoints):
                # An endpoint far below its share of the traffic (restarted, readmitted, new)
                # holds nothing: the hottest prefixes count it as one more copy needed.
                needed = max(needed, holders + 1.0)
            if needed > holders:
                penalty *= (holders / needed) ** 2
        preds: dict[str, Prediction] = {}
        objectives: list[float] = []
        for ep in endpoints:
            p = self._predict(ep, tokens, match, now, 0.0 if ep.name in warming else penalty)
            preds[ep.name] = p
            objectives.append(p.objective)
        self._last = (request, preds, digest)
        decision = TTFTDecision(terms=preds, penalty=penalty, warming=warming)
        cycle[self.name] = decision
        best = min(objectives)
        scores = [best / t for t in objectives]
        placed = -1  # an endpoint the home or the holder rule picks
        if (match is None or not match.matches) and digest is not None:
            homed = unqueued([preds[ep.name] for ep in endpoints], self._home_wait, self._home_slack)
            limit = self._home_limit(endpoints, homed, min(homed))
            placed = self._homes.home(digest, endpoints, homed, limit, now)
            if placed >= 0:
                decision.home = endpoints[placed].name
            decision.home_wait = (self._home_wait, self._home_slack)
        elif self._holder_tol and match is not None and match.matches:
            uncached = [preds[ep.name].uncached for ep in endpoints]
            placed = holder(uncached, objectives, best * (1.0 + self._holder_tol))
            if placed >= 0:
                decision.holder = endpoints[placed].name
        if placed < 0 and self._prewarm and match is not None and match.matches:
            chosen = objectives.index(best)
            fallback = self._unplaced_choice(endpoints, scores, chosen)
            placed = self._plan_warmup(cycle, endpoints, chosen, preds, match, tokens, fallback)
        if placed >= 0:
            scores = [s * (1.0 - HOME_MARGIN) for s in scores]
            scores[placed] = 1.0
        return scores

    def _predict(
        self, ep: Endpoint, tokens: int, match: PrefixMatch | None, now: float, penalty: float
    ) -> Prediction:
        # Called per endpoint per request: the max()es below are spelt out as comparisons (same
        # results, ties and NaN included), a builtin call less each
        # (docs/bench/fleet-cost.md#per-request-pods).
        name = ep.name
        rate = self._rates.get(name)
        if rate is None:
            rate = self._rate(name)
        m = ep.metrics
        waiting = m.waiting
        uncached = float(tokens)
        block_size = DEFAULT_BLOCK_SIZE
        if match is not None:
            block_size = match.block_sizes.get(name, match.block_size) or DEFAULT_BLOCK_SIZE
            held = match.matches.get(name)
            if held is not None:
                gpu = cached_tokens(tokens, held.gpu_blocks, block_size)
                anywhere = cached_tokens(tokens, held.blocks, block_size)
                uncached = tokens - gpu - (anywhere - gpu) * (1.0 - self._offload)
        decodes = m.running  # max(running, inflight_requests - waiting, 0)
        own = ep.inflight_requests - waiting
        if own > decodes:
            decodes = own
        if decodes < 0:
            decodes = 0
        slowdown = 1.0 + self._k_decode * decodes
        cost = rate.cost * slowdown
        fluid = rate.busy_until - now  # rate.backlog(now), inlined
        if not fluid > 0.0:
            fluid = 0.0
        scraped = self._queue_weight * waiting * self._mean_prefill * cost
        queue_s = scraped if scraped > fluid else fluid
        service = uncached * cost
        kv_price = 0.0
        if self._kv_weight and m.num_gpu_blocks > 0:
            # Past the soft limit the pod admits new blocks only as running requests finish (and
            # their decodes keep claiming the freed ones): the wait grows towards a decode's length.
            after = m.kv_usage + (uncached + rate.incoming) / (block_size * m.num_gpu_blocks)
            over = (after - self._kv_soft) / (1.0 - self._kv_soft)
            if over > 0.0:
                kv_price = self._kv_weight * self._decode_s * min(over, 2.0)
        # The choice pays the full price (it protects the pod's cache); the prediction expects
        # the wait the observations so far say such a price comes with.
        kv_wait = kv_price * self._kv_scale
        base = self._overhead * slowdown + queue_s + service
        ttft = base + kv_wait  # max(base + kv_wait, 1e-9)
        if ttft < 1e-9:
            ttft = 1e-9
        # Every request waiting there is delayed by this prefill too (queueing is FIFO-ish).
        waiting_factor = 1.0 + self._waiting_weight * waiting
        objective = base + kv_price + penalty * waiting_factor * service
        return Prediction(
            ttft, objective, queue_s, queue_s / cost, uncached, slowdown, decodes, kv_wait, kv_price
        )

    def _plan_warmup(
        self,
        cycle: interfaces.CycleState,
        endpoints: list[Endpoint],
        chosen: int,
        preds: dict[str, Prediction],
        match: PrefixMatch,
        tokens: int,
        fallback: int,
    ) -> int:
        """A move off the endpoint holding most of the prompt becomes a pre-warm (module
        docstring of `epp.scheduling.prewarm`): returns the holder's index, or -1 (no move, or
        the holder holds less than `prewarmMinShare` of the prompt more than the chosen one).
        `fallback`: where the request goes if the pre-warm is not sent (`_unplaced_choice`)."""
        uncached = [preds[ep.name].uncached for ep in endpoints]
        keep = min(range(len(endpoints)), key=uncached.__getitem__)
        if keep == chosen or uncached[chosen] - uncached[keep] < self._prewarm_share * tokens:
            return -1
        target = endpoints[chosen]
        block_size = match.block_sizes.get(target.name, match.block_size) or DEFAULT_BLOCK_SIZE
        warm = int(tokens - uncached[keep]) // block_size * block_size
        if warm <= 0:
            return -1
        move_to = None if fallback == chosen else endpoints[fallback]
        cycle[prewarm.KEY] = prewarm.Warmup(target, endpoints[keep].name, warm, move_to)
        decision = cycle[self.name]
        if isinstance(decision, TTFTDecision):
            decision.prewarm = (target.name, warm)
        return keep

    def _unplaced_choice(self, endpoints: list[Endpoint], scores: list[float], chosen: int) -> int:
        """The endpoint this scorer's scores prefer when no rule places the request (`chosen`, the
        least objective, here): request-latency-scorer's latency targets may prefer another.
        `scores`: the objectives' scores, the least objective over each."""
        return chosen

    def _home_limit(self, endpoints: list[Endpoint], objectives: list[float], best: float) -> float:
        """The largest objective a rendezvous home may have: within `homeTolerance` (relative) or
        `homeSlackSeconds` of the minimum."""
        return max(best * (1.0 + self._home_tol), best + self._home_slack)

    # --- effects --------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        last = self._last
        now = clock.now()
        if self._scraped is not None and now >= self._scraped_check:
            self._learn_from_pods(self._scraped, now)
        if last is None or last[0] is not request or not result.targets:
            return
        self._last = None  # booked once; and the request is not kept alive past its decision
        primary = result.targets[0].name
        p = last[1].get(primary)
        if p is None:
            return
        rate = self._rate(primary)
        # Split (P/D): the prefill pod computes the prompt, the decode pod receives its KV; the
        # prefill is booked there (`book_prefill`, by the P/D decider), not here.
        remote = bool(result.stages.get("prefill"))
        # The request's prefill joins the endpoint's fluid queue behind the work already booked,
        # 1/share times: other replicas book the rest of the fleet's work where this one cannot see.
        scale = self._share.book(now)
        if not remote:
            rate.book(now, p.uncached * rate.cost * p.slowdown * scale)
        else:
            rate.incoming += p.uncached
        warmup = prewarm.planned(result)
        if warmup is not None:
            # The pre-warm's prefill queues there as a routed request's would.
            w = last[1].get(warmup.endpoint.name)
            if w is not None:
                target = self._rate(warmup.endpoint.name)
                target.book(now, warmup.tokens * target.cost * w.slowdown * scale)
            self._homes.written(warmup.endpoint.name, now, warmup.tokens)
        self._mean_prefill += 0.05 * (p.uncached - self._mean_prefill)
        if self._popularity is not None and last[2] is not None:
            self._popularity.add(last[2], now)
        self._homes.routed(primary, now, p.uncached)
        if self._scraped is not None:
            usable = not remote and p.kv_wait <= 0.1 * p.ttft  # as response_complete learns
            self._first.routed(primary, now + p.ttft, p.queue_tokens + p.uncached, p.decodes, usable)
        pending = self._pending
        pending[id(request)] = Booked(
            request,
            primary,
            p.ttft,
            p.queue_tokens,
            p.uncached,
            p.slowdown,
            p.decodes,
            p.kv_wait,
            p.kv_price,
            remote,
            p.uncached if remote else 0.0,
        )
        while len(pending) > MAX_PENDING:
            self._landed(pending.popitem(last=False)[1])

    def _landed(self, booked: Booked) -> float:
        """Count off a split request's KV in transit to its decode pod: the tokens, once."""
        coming, booked.incoming = booked.incoming, 0.0
        rate = self._rates.get(booked.endpoint)
        if coming and rate is not None:
            rate.incoming = max(rate.incoming - coming, 0.0)
        return coming

    def response_headers(
        self,
        request: InferenceRequest,
        result: interfaces.SchedulingResult,
        served: str | None,
        headers: Mapping[str, str],
    ) -> Mapping[str, str]:
        booked = self._pending.get(id(request))
        if booked is not None and booked.request is request:
            coming = self._landed(booked)
            rate = self._rates.get(booked.endpoint)
            if coming and rate is not None and headers.get(PREFILL_RESULT_HEADER) == "local":
                # Booked as `pre_request` books a request that prefills where it is picked.
                work = coming * rate.cost * booked.slowdown * self._share.scale
                rate.book(clock.now(), work)
        return {}

    def response_complete(self, request: InferenceRequest, outcome: interfaces.RequestOutcome) -> None:
        booked = self._pending.pop(id(request), None)
        if booked is None or booked.request is not request:
            return
        self._landed(booked)
        ttft = outcome.ttft_s
        served = outcome.endpoint
        if self._scraped is not None and outcome.ok and served is not None and served.name == booked.endpoint:
            self._first.completed(served.name, ttft is not None)  # only the windows read these counts
        if ttft is None or not outcome.ok or served is None or served.name != booked.endpoint:
            return  # a failed or rerouted request says nothing about this endpoint's rate
        self._error.observe(ttft - booked.predicted)
        self._from_responses.inc()
        if outcome.duration_s > ttft:
            self._learn_decode(outcome.duration_s - ttft)
        if booked.remote_prefill:
            return  # its first token came from another pod's prefill and a KV transfer
        if booked.kv_price > 0.0:
            # What the wait for KV blocks turned out to be, as a share of its price.
            seen = max(ttft - (booked.predicted - booked.kv_wait), 0.01 * booked.kv_price) / booked.kv_price
            step = self._clip(math.log(seen / self._kv_scale))
            self._kv_scale = min(max(self._kv_scale * math.exp(self._min_rate * step), 0.01), 10.0)
        if booked.kv_wait > 0.1 * booked.predicted:
            return  # mostly a wait for KV blocks, which the prefill rate does not explain
        uncached = booked.uncached
        if outcome.prompt_tokens is not None and outcome.cached_tokens is not None:
            uncached = float(max(outcome.prompt_tokens - outcome.cached_tokens, 0))
        self.learn(booked.endpoint, ttft, booked.queue_tokens + uncached, booked.decodes)

    def prefill_stage(self, ep: Endpoint, uncached: float, now: float) -> tuple[float, float, float]:
        """A prefill-only stage of `uncached` tokens on `ep` (P/D's prefill pod), as `_predict`
        prices it: (queue_s, overhead_s, prefill_s), no KV pressure or miss penalty."""
        rate = self._rate(ep.name)
        m = ep.metrics
        slowdown = 1.0 + self._k_decode * max(m.running, ep.inflight_requests - m.waiting, 0)
        cost = rate.cost * slowdown
        queue_s = max(rate.backlog(now), self._queue_weight * m.waiting * self._mean_prefill * cost)
        return queue_s, self._overhead * slowdown, uncached * cost

    def book_prefill(self, ep: Endpoint, uncached: float, now: float) -> None:
        """Book a prefill-only stage on `ep` (the P/D decider does, for the prefill pod): its work
        joins the fluid queue as a routed request's does."""
        rate = self._rate(ep.name)
        rate.book(now, uncached * rate.cost * self._share.scale)

    def prefill_tokens_per_second(self, endpoint: str) -> float:
        """The learned prefill rate of `endpoint` (the prior until it has served requests)."""
        return 1.0 / self._rate(endpoint).cost

    def _on_endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        for ep in removed:
            if self._scraped is not None:
                self._scraped.forget(ep.name)
            self._first.forget(ep.name)
            if self._rates.pop(ep.name, None) is not None:
                with contextlib.suppress(KeyError):  # never learned: no series
                    prefill_rate.remove(self.name, ep.name)

    # --- explain --------------------------------------------------------------------------------

    def explain(self, cycle: interfaces.CycleState) -> Mapping[str, Any]:
        """Each endpoint's prediction term by term, in seconds unless named otherwise:
        `predicted_ttft_s` = `overhead_s` + `queue_s` + `prefill_s` + `kv_wait_s`, and the
        objective the choice minimises, `objective_s` = `overhead_s` + `queue_s` + `prefill_s` +
        `kv_price_s` + `miss_penalty_s`. `prefill_s` is `uncached_tokens` at the endpoint's learned
        `prefill_tokens_per_second`, slowed by `decode_slowdown` (1 + decode interference x
        `decodes` running); `queue_tokens` is the queue ahead in prompt tokens. Request-level: the
        `miss_penalty` factor applied (after the popularity scaling), the shared learned
        parameters, and `ttft_home` or `ttft_holder` when the home or the holder rule decided."""
        decision = cycle.get(self.name)
        if not isinstance(decision, TTFTDecision):
            return {}
        # The scraped queue depth each endpoint was priced with (explain leaves the candidates in
        # the cycle); without it the penalty is what is left of the objective.
        waiting = {ep.name: ep.metrics.waiting for ep in cycle.get(framework.CANDIDATES) or ()}
        per_endpoint = explain_endpoints(
            decision, waiting, self._rates, self._prior_cost, self._overhead, self._waiting_weight
        )
        request: dict[str, Any] = {
            **decision.facts(),
            "overhead_seconds": self._overhead,
            "decode_interference": self._k_decode,
            "decode_seconds": self._decode_s,
            "kv_wait_scale": self._kv_scale,
            "traffic_share": self._share.explain(),
        }
        return {"request": request, "endpoints": per_endpoint}
