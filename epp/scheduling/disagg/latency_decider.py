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
             + othersWeight * (stall(D) + behind(D))    D's streams stalled; later prefills delayed
    split(P) = ttftWeight * (max(leg(P) + transfer(P, D), queue(D)) + overhead(D))
             + othersWeight * (stall(P) + behind(P))    P's own streams, when it decodes too
    leg(P)   = queue(P) + overhead(P) + prefill(P)      P's learned rate and fluid queue
    transfer(P, D) = kvBytesPerToken * uncached(D) / bandwidth(P, D)
    stall(X) = stallWeight * running(X) * the prefill's compute at X's rate
    behind(X) = prefill(X) * lam(X) * (queue(X) + prefill(X)) / (1 - min(rho(X), maxUtilization))

`behind` is what the prefill costs the requests that arrive at that pod while its prefill queue
is busy (M/G/1: `lam` arrivals a second, `rho` the share of the pod's time prefills took, both
from this decider's own bookings, decaying over `loadWindowSeconds`). Without it a pod near its
prefill capacity looks as cheap as an idle one to each request alone, and the decider piles
prefills onto whichever pod its queue estimate flatters (`epp bench pd`, pd-long-prompt at
`--load 4`: always-split waits 40 s for the first token at p50; with `behind` the decider keeps
47% of the prefills on the decode pods and waits 8 s).

(`ttftWeight`, `othersWeight`: this plugin's) and splits when
`split(P) + marginSeconds < local(D) x (1 - marginRatio)` and the prompt has `minPromptTokens`.
`D`'s own decode is the same either way and is left out of both.
`uncached(D)` is what D does not hold: only those blocks move (vLLM's NixlConnector pulls the
blocks the decode pod lacks).

Before the decode profile runs, the decider tells its latency scorer how likely a split is
(`expected_remote`: its split share over the last ~20 routed requests it could split, once it
splits most of them, and the KV's transfer seconds per token at the pairs' mean learned rate).
The scorer then prices each decode pod for that share of the prefill running elsewhere: the
transfer in place of its own prefill, and no stall of its streams for it. Priced as a local
prefill, the decode pods that held the prompt, or had the fewest streams to stall, drew most
requests though the prefill ran on a prefill pod (`epp bench pd`, pd-mixed at 4 times with 5%
prefill deaths: the busiest of 4 decode pods took 41-43% of the requests, and the prefills the
sidecar fell back to there stalled its streams: E2E p50 1.03x llm-d's over 40 seeds).

`bandwidth(P, D)` starts at `bandwidthBytesPerSecond` and is learned per pod pair from the TTFTs of
the requests split over that pair: the part of a TTFT the predicted prefill leg and D's step do
not explain is the transfer, per byte moved (a log-space moving average, weight
`bandwidthLearningRate`, within 1/1000 to 10 times the prior).

Effects: on a split, the prefill is booked on P's fluid queue in the latency scorer (the decode
pod's booking then holds no prefill), and the request's pair and bytes are kept for the learning.
The learning (`response_complete`): the prefill leg's duration, from `x-epp-prefill-seconds`
(`epp sidecar`) or the time to the decode pod's streamed response headers (any sidecar sends the
decode leg only once the prefill pod answered), teaches the latency scorer P's prefill rate; the
rest of the TTFT, less D's first step, is the transfer.
Explain: per prefill candidate `leg_s`, `queue_s`, `prefill_s`, `uncached_tokens`,
`transfer_s`, `transfer_bytes`, `bandwidth_bytes_per_s`, `stall_others_s`, `behind_others_s`,
`split_s`; per request `local_s`, `local_ttft_s`, `local_stall_s`, `local_behind_s`,
`best_split_s`, `split`, `decode_pod`.

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
  scorer's own `ttftWeight`, 4 in epp's default, ranks the decode pods). In seconds of E2E a
  stall counts once per stream it hits; 2 weighs the decode pods' long streams above the first
  tokens, for the tail: in `epp bench pd` (pd-mixed, seeds 1-5) at 6 times its rate the E2E p99
  is 1.000x llm-d's always-split with 2 and 1.04x with 1 (which has a quarter lower TTFT p99 and
  12% more goodput, and at 4 times its rate meets the four targets, where 2 misses output tok/s
  by 0.03%).
- `stallWeight` (1): scales `stall`.
- `loadWindowSeconds` (10), `maxUtilization` (0.95, (0, 1)): `behind`'s window and cap on `rho`.
- `minPromptTokens` (0): shorter prompts never split. On `prefill-decode` pools a short prompt's
  leg waits behind the prefill pod's own long prefills, which its fluid queue does not show
  (`epp bench pd`, pd-mixed at `--load 6`: 0.26 s predicted, 0.70 s seen): there it pays to
  split only long prompts (`epp bench pd` runs `minPromptTokens: 2048` on them).
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
from epp.scheduling.plugins.predicted_ttft_scorer import PredictedTTFTScorer
from epp.scheduling.plugins.predicted_ttft_terms import RemotePrefill, TTFTDecision
from epp.sidecar.protocol import PREFILL_RESULT_HEADER, PREFILL_SECONDS_HEADER

MAX_PENDING: Final = 65536
SPLIT_SHARE_WEIGHT: Final = 0.05  # each decision's weight in the split share (~20 requests' memory)
MOSTLY_SPLIT: Final = 0.5  # the split share from which the decode pods are priced for it


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
    behind_s: float  # the delay this prefill adds to the prefills that will queue behind it there
    split_s: float
    queue_tokens: float  # the queue, in prompt tokens at the pod's learned rate (for the learning)
    decodes: int


@dataclasses.dataclass(slots=True)
class _Pricing:
    request: InferenceRequest
    decode: Endpoint | None
    legs: dict[str, _Leg]
    first_s: float = 0.0  # the decode pod's first step once the KV is in
    local_ttft_s: float = 0.0
    local_prefill_s: float = 0.0  # the prefill's own time on the decode pod (booked if kept)
    local_stall_s: float = 0.0
    local_behind_s: float = 0.0
    local_s: float = 0.0
    best_split_s: float = math.inf
    split: bool = False
    eligible: bool = False  # past minPromptTokens, decided: counted in the split share when routed
    reason: str = ""


@dataclasses.dataclass(slots=True)
class _Load:
    """Prefills booked on one pod: their count and seconds, decaying over the window."""

    count: float = 0.0
    seconds: float = 0.0
    at: float = 0.0


class PrefillLoads:
    """Per pod, the rate of prefills sent there (`lam`, per second) and the share of its time they
    take (`rho`), from this decider's own bookings, each an exponentially decaying sum over
    `window` seconds; and from them the price of queueing there.

    A prefill of `s` seconds joining a pod whose prefill queue holds `V` seconds delays each
    prefill that arrives while that queue is busy by `s`: about `lam x (V + s)` of them, and the
    busy period stretches by `1 / (1 - rho)` as work arrives during it (M/G/1). So it costs the
    others `s x lam x (V + s) / (1 - rho)` (`behind`), with `rho` capped at `max_rho`: near a
    pod's capacity each prefill sent there costs everyone after it, which a split's own TTFT
    does not show.
    """

    __slots__ = ("_loads", "_max_rho", "_window")

    def __init__(self, window: float, max_rho: float) -> None:
        self._window = window
        self._max_rho = max_rho
        self._loads: dict[str, _Load] = {}

    def _decayed(self, name: str, now: float) -> _Load | None:
        load = self._loads.get(name)
        if load is not None and now > load.at:
            f = math.exp(-(now - load.at) / self._window)
            load.count *= f
            load.seconds *= f
            load.at = now
        return load

    def add(self, name: str, seconds: float, now: float) -> None:
        load = self._decayed(name, now)
        if load is None:
            if len(self._loads) >= MAX_PENDING:  # pod names come from the pool: bounded anyway
                self._loads.clear()
            load = self._loads[name] = _Load(at=now)
        load.count += 1.0
        load.seconds += seconds

    def rates(self, name: str, now: float) -> tuple[float, float]:
        """(prefills a second, share of the pod's time) sent to `name` lately."""
        load = self._decayed(name, now)
        if load is None:
            return 0.0, 0.0
        return load.count / self._window, load.seconds / self._window

    def behind(self, name: str, seconds: float, queue_s: float, now: float) -> float:
        lam, rho = self.rates(name, now)
        return seconds * lam * (queue_s + seconds) / (1.0 - min(rho, self._max_rho))

    def forget(self, name: str) -> None:
        self._loads.pop(name, None)


@dataclasses.dataclass(slots=True)
class _Pending:
    """A split request's prices, kept until its response completes (the learning reads them)."""

    request: InferenceRequest
    pair: tuple[str, str]  # (prefill pod, decode pod)
    bytes: float
    queue_tokens: float  # the prefill pod's queue at pick time, in prompt tokens
    uncached: float  # the prompt tokens the prefill pod computes
    decodes: int  # the prefill pod's running requests at pick time
    transfer_s: float  # the predicted transfer
    first_s: float  # the decode pod's first step once the KV is in: its overhead at its batch


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
        stallWeight: Annotated[float, msgspec.Meta(ge=0.0, le=1e6)] = 1.0
        minPromptTokens: Annotated[int, msgspec.Meta(ge=0)] = 0
        loadWindowSeconds: Annotated[float, msgspec.Meta(gt=0.0, le=3600.0)] = 10.0
        maxUtilization: Annotated[float, msgspec.Meta(gt=0.0, lt=1.0)] = 0.95

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
        self._stall_w = params.stallWeight
        self._prefix = ""  # the prefill profile's prefix scorer (P's cached tokens)
        self._bandwidth: dict[tuple[str, str], float] = {}
        self._inv_bw = 0.0  # the sum of 1 / bandwidth over the learned pairs
        # The share of the requests this decider could split (minPromptTokens) that it did,
        # lately: what the decode profile's latency scorer is told to expect (`expected_remote`).
        self._split_share = 0.0
        self._samples: dict[tuple[str, str], int] = collections.Counter()
        self._last: _Pricing | None = None
        self._pending: collections.OrderedDict[int, _Pending] = collections.OrderedDict()
        self._loads = PrefillLoads(params.loadWindowSeconds, params.maxUtilization)
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
        k = latency.decode_interference
        for ep in endpoints:
            uncached = float(tokens) - _held(match, ep, tokens)
            queue_s, overhead_s, prefill_s = latency.prefill_stage(ep, uncached, now)
            m = ep.metrics
            decodes = max(m.running, ep.inflight_requests - m.waiting, 0)
            per_token = (1.0 + k * decodes) / latency.prefill_tokens_per_second(ep.name)
            bw = self._bandwidth.get((ep.name, decode.name), self._prior_bw)
            nbytes = moved * self._kv_bytes if ep is not decode else 0.0
            transfer = nbytes / bw
            leg = queue_s + overhead_s + prefill_s
            # A prefill pod that also decodes (role prefill-decode) stalls its own streams: each
            # step the prefill shares is longer by the prefill's own compute.
            own = prefill_s / (1.0 + k * decodes)
            stall = self._stall_w * max(m.running - m.waiting, 0) * own
            behind = self._loads.behind(ep.name, prefill_s, queue_s, now)
            split = self._ttft_w * (max(leg + transfer, d_queue) + d_overhead) + self._others_w * (
                stall + behind
            )
            legs[ep.name] = _Leg(
                queue_s, overhead_s, prefill_s, uncached, transfer, nbytes, bw, stall, behind, split,
                queue_s / per_token, decodes,
            )  # fmt: skip
            costs.append(split)
        self._last = _Pricing(request, decode, legs, d_overhead)
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
        pricing, latency = self._last, self._latency
        if decode is None or prefill is None or pricing is None or pricing.request is not request:
            return False
        if pricing.decode is not decode:
            pricing.reason = "the prefill pods were not priced for this decode pod"
            return False
        decided = cycle.get(latency.name) if latency is not None else None
        local = decided.terms.get(decode.name) if isinstance(decided, TTFTDecision) else None
        if local is None or latency is None:
            pricing.reason = "the decode pod was not priced"
            return False
        extras = decided.extras(decode.name) if isinstance(decided, TTFTDecision) else {}
        pricing.local_ttft_s = local.ttft
        own = local.uncached / latency.prefill_tokens_per_second(decode.name)
        pricing.local_prefill_s = own * local.slowdown
        # The latency scorer's stall prices the prefill at its slowed rate (its own TTFT); the
        # streams it stalls lose the step time the prefill adds: its compute alone.
        running = max(extras.get("batch", float(decode.metrics.running)) - decode.metrics.waiting, 0.0)
        pricing.local_stall_s = self._stall_w * running * own
        pricing.local_behind_s = self._loads.behind(
            decode.name, pricing.local_prefill_s, local.queue_s, clock.now()
        )
        pricing.local_s = self._ttft_w * local.ttft + self._others_w * (
            pricing.local_stall_s + pricing.local_behind_s
        )
        leg = pricing.legs.get(prefill.targets[0].name)
        if leg is None:
            pricing.reason = "the prefill pick was not priced"
            return False
        pricing.best_split_s = leg.split_s
        if deciders.prompt_tokens(request) < self._min_prompt:
            pricing.reason = f"prompt under minPromptTokens {self._min_prompt}"
            return False
        pricing.eligible = True
        if prefill.targets[0] is decode:
            pricing.reason = "the best prefill pod is the decode pod"
        elif leg.split_s + self._margin < pricing.local_s * (1.0 - self._ratio):
            pricing.split = True
            pricing.reason = f"saves {pricing.local_s - leg.split_s:.4f} s"
        else:
            pricing.reason = f"local is cheaper by {leg.split_s - pricing.local_s:.4f} s"
        return pricing.split

    def expected_remote(self, request: InferenceRequest) -> RemotePrefill | None:
        """How likely `request` is to be split, told to the decode profile before it picks the
        decode pod: this decider's recent split share for prompts it may split, and the KV's
        transfer seconds per token at the pairs' mean learned rate. None for a prompt under
        `minPromptTokens`, or while the decider keeps most such prompts local (`MOSTLY_SPLIT`):
        then a split is the exception it makes where a local prefill is dear, and pricing every
        decode pod for a share of one would misprice the pods that keep theirs (`epp bench pd`,
        every pod prefill-decode, pd-long-prompt at 4 times, 15% split, without the scrape pace:
        TTFT p99 1.26x aggregated's priced so, 1.12x without)."""
        if self._split_share < MOSTLY_SPLIT or deciders.prompt_tokens(request) < self._min_prompt:
            return None
        learned = len(self._bandwidth)
        per_byte = self._inv_bw / learned if learned else 1.0 / self._prior_bw
        return RemotePrefill(self._split_share, self._kv_bytes * per_byte)

    # --- effects -----------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        pricing = self._last
        self._last = None
        if pricing is None or pricing.request is not request or self._latency is None:
            return
        now = clock.now()
        prefill = result.stages.get("prefill")
        if pricing.decode is None:
            return
        if pricing.eligible:  # routed, not explained: /debug/score leaves the share alone
            self._split_share += SPLIT_SHARE_WEIGHT * (float(bool(prefill)) - self._split_share)
        if not prefill:
            self._loads.add(pricing.decode.name, pricing.local_prefill_s, now)
            return
        # A split request's first step waits behind the decode pod's prefills too: it counts
        # among the arrivals there, with no prefill of its own.
        self._loads.add(pricing.decode.name, 0.0, now)
        pod = prefill[0]
        leg = pricing.legs.get(pod.name)
        if leg is None:
            return
        self._latency.book_prefill(pod, leg.uncached, now)
        self._loads.add(pod.name, leg.prefill_s, now)
        pending = self._pending
        pending[id(request)] = _Pending(
            request,
            (pod.name, pricing.decode.name),
            leg.transfer_bytes,
            leg.queue_tokens,
            leg.uncached,
            leg.decodes,
            leg.transfer_s,
            pricing.first_s,
        )
        while len(pending) > MAX_PENDING:
            pending.popitem(last=False)

    def response_complete(self, request: InferenceRequest, outcome: interfaces.RequestOutcome) -> None:
        """Learn the prefill pod's rate and the pair's transfer from what the split request did.

        The prefill leg's own duration, where it is known: `x-epp-prefill-seconds` (`epp sidecar`
        measures it), else the time to the decode pod's response headers when the answer streams
        (a sidecar, llm-d's or epp's, relays the decode leg's headers only once the prefill pod
        has answered, and vLLM sends a stream's headers before its first token). The prefill pod's
        rate learns from it as the latency scorer learns a pod from a TTFT, and the rest of the
        TTFT, less the decode pod's first step, is the transfer. Without it (a whole JSON answer
        through llm-d's sidecar) the leg is the TTFT less the predicted transfer and first step,
        and the bandwidth is not learned: one TTFT cannot tell the two apart. A local fallback
        (`x-epp-prefill: local`) or a failed request teaches nothing."""
        booked = self._pending.pop(id(request), None)
        latency = self._latency
        if booked is None or booked.request is not request or latency is None:
            return
        headers = outcome.headers
        if headers.get(PREFILL_RESULT_HEADER) == "local" or not 200 <= outcome.status < 300:
            return
        leg = _seconds(headers.get(PREFILL_SECONDS_HEADER))
        if leg is None and outcome.headers_s is not None and _streamed(headers):
            leg = outcome.headers_s
        ttft = outcome.ttft_s if outcome.ok else None
        prefill, _ = booked.pair
        if leg is None:
            if ttft is None:
                return
            leg = ttft - booked.transfer_s - booked.first_s
            if leg <= 0.0:
                return
            latency.learn(prefill, leg, booked.queue_tokens + booked.uncached, booked.decodes)
            return
        latency.learn(prefill, leg, booked.queue_tokens + booked.uncached, booked.decodes)
        if ttft is None or booked.bytes <= 0.0:
            return
        residual = ttft - leg - booked.first_s
        if residual <= 0.0:
            return  # the decode pod's step hid the transfer: nothing to say about the link
        seen = booked.bytes / residual
        known = self._bandwidth.get(booked.pair)
        old = self._prior_bw if known is None else known
        new = math.exp(math.log(old) + self._learn_w * (math.log(seen) - math.log(old)))
        new = min(max(new, self._prior_bw / 1000.0), self._prior_bw * 10.0)
        self._bandwidth[booked.pair] = new
        self._inv_bw += 1.0 / new - (0.0 if known is None else 1.0 / known)
        self._samples[booked.pair] += 1

    def bandwidth(self, prefill: str, decode: str) -> float:
        """The learned transfer rate of a pod pair, bytes per second (the prior until learned)."""
        return self._bandwidth.get((prefill, decode), self._prior_bw)

    def _on_endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        if removed:
            gone = {ep.name for ep in removed}
            for name in gone:
                self._loads.forget(name)
            for pair in [p for p in self._bandwidth if gone.intersection(p)]:
                self._inv_bw -= 1.0 / self._bandwidth.pop(pair)
                self._samples.pop(pair, None)
            if not self._bandwidth:
                self._inv_bw = 0.0  # no rounding left behind

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
                "behind_others_s": leg.behind_s,
                "split_s": leg.split_s,
            }
            for name, leg in pricing.legs.items()
        }
        request = {
            "decode_pod": pricing.decode.name,
            "local_s": pricing.local_s,
            "local_ttft_s": pricing.local_ttft_s,
            "local_stall_s": pricing.local_stall_s,
            "local_behind_s": pricing.local_behind_s,
            "best_split_s": pricing.best_split_s if math.isfinite(pricing.best_split_s) else -1.0,
            "split": pricing.split,
            "reason": pricing.reason,
            "kv_bytes_per_token": self._kv_bytes,
        }
        return {"request": request, "endpoints": endpoints}


def _seconds(value: str | None) -> float | None:
    """A duration header's seconds, or None when absent or not a finite number >= 0."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0.0 else None


def _streamed(headers: Mapping[str, str]) -> bool:
    return "text/event-stream" in headers.get("content-type", "").lower()


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
