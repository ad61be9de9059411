"""predicted-ttft-scorer's records, metrics and explain terms: each endpoint's prediction for the
request being scored (`Prediction`), the decision explain reads (`TTFTDecision`), a routed
request's prediction kept until its response (`Booked`), an endpoint's learned rate and fluid
queue (`Rate`), explain's terms per endpoint (`explain_endpoints`), and the endpoints where a
prompt no endpoint holds would queue (`unqueued`: the scorer's home rule, and explain's account of
it).

`request-latency-scorer` and the P/D latency decider read them too; the model that fills them is
in `predicted_ttft_scorer`. `RemotePrefill` is what the P/D runner tells the decode profile's
latency scorer of the prefill that is expected to run elsewhere.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Annotated, Any, Final

import msgspec
from prometheus_client import Counter, Gauge, Histogram

from epp.api.requests import InferenceRequest
from epp.observability import metrics

ERROR_BUCKETS = (
    *(-b for b in (30.0, 10.0, 5.0, 2.5, 1.0, 0.5, 0.25, 0.1, 0.05, 0.025, 0.01)),
    0.0,
    *(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

prediction_error = Histogram(
    "epp_predicted_ttft_error_seconds",
    "Actual minus predicted time to first token of requests routed by predicted-ttft-scorer.",
    ["plugin"],
    buckets=ERROR_BUCKETS,
    registry=metrics.REGISTRY,
)
observations = Counter(
    "epp_latency_observations_total",
    "Observations the latency scorers learned from: a response read through epp (`response`), or "
    "a pod's growth of vLLM's per-request latency histograms between two scrapes (`metrics`).",
    ["plugin", "source"],
    registry=metrics.REGISTRY,
)
prefill_rate = Gauge(
    "epp_predicted_ttft_prefill_tokens_per_second",
    "Prefill rate per endpoint as learned by predicted-ttft-scorer from observed TTFTs.",
    ["plugin", "endpoint"],
    registry=metrics.REGISTRY,
)

NonNegative = Annotated[float, msgspec.Meta(ge=0.0)]
# msgspec's bounds let infinity through; these parameters multiply times, so it is refused.
FINITE = (
    "overheadSeconds",
    "queueDepthWeight",
    "decodeInterference",
    "kvPressureWeight",
    "missPenalty",
    "missPenaltyPerWaiting",
)


@dataclasses.dataclass(slots=True)
class Rate:
    """One endpoint's learned prefill cost and fluid queue."""

    cost: float  # seconds per uncached prompt token at no decode load
    seen: float  # observations so far (the prior's weight is added when learning)
    busy_until: float = 0.0  # clock.now() at which the prefill work booked so far is drained
    incoming: float = 0.0  # KV tokens of split requests booked here, still on their way (P/D)

    def book(self, now: float, work: float) -> None:
        """Queue `work` seconds of prefill behind the work booked so far."""
        self.busy_until = (self.busy_until if self.busy_until > now else now) + work

    def backlog(self, now: float) -> float:
        """Seconds of booked prefill left at `now`: max(0, busy_until - now)."""
        left = self.busy_until - now
        return left if left > 0.0 else 0.0


REMOTE_PREFILL_KEY: Final = "epp.disagg/remote-prefill"
"""Cycle-state key of a `RemotePrefill`, set by the P/D runner (decode first) before the decode
profile runs."""


@dataclasses.dataclass(frozen=True, slots=True)
class RemotePrefill:
    """How likely the request being scored is to be prefilled on another pod, and what its KV
    then costs to move per uncached token: the decode pod pays `share` of its own prefill (the
    first-token work and the stall of its streams) and `share` of the transfer instead."""

    share: float  # in [0, 1]: the decider's recent split share for requests like this one
    seconds_per_token: float  # KV bytes per token over the pod pairs' bandwidth


@dataclasses.dataclass(slots=True)
class Prediction:
    """One endpoint's prediction for the request being scored."""

    ttft: float
    objective: float  # ttft plus the miss penalty: what the choice minimises
    queue_s: float
    queue_tokens: float
    uncached: float
    slowdown: float  # 1 + k * decodes
    decodes: int
    kv_wait: float  # the predicted wait for KV blocks: the price below, times the learned scale
    kv_price: float  # the KV-pressure term of the objective


def unqueued(row: list[Prediction], share: float, slack: float) -> list[float]:
    """The objectives of `row` (one prediction per endpoint), with infinity for each endpoint where
    a prompt would wait (its queue and KV wait there) more than `share` of its own first-token work
    there and more than `slack` seconds beyond the least wait of any endpoint: such an endpoint is
    no home for a prompt no endpoint holds (`homeWaitShare`, `homeSlackSeconds`)."""
    waits = [p.queue_s + p.kv_wait for p in row]
    least = min(waits)
    return [
        p.objective if w <= share * (p.ttft - w) or w <= least + slack else math.inf
        for p, w in zip(row, waits, strict=True)
    ]


@dataclasses.dataclass(slots=True)
class Booked:
    """A routed request's prediction, kept until its response completes."""

    request: InferenceRequest
    endpoint: str
    predicted: float
    queue_tokens: float
    uncached: float
    slowdown: float
    decodes: int
    kv_wait: float
    kv_price: float
    remote_prefill: bool = False  # another pod prefilled it (P/D): its TTFT is not this pod's rate
    incoming: float = 0.0  # its KV tokens counted in the endpoint's `Rate.incoming` until they land


EXTRA_FIELDS: Final = (
    "ttft_objective_s",
    "admission_wait_s",
    "e2e_s",
    "decode_s",
    "step_s",
    "pod_step_factor",
    "output_tokens",
    "batch",
    "context_tokens",
    "slowdown_others_s",
    "prefill_stall_others_s",
)
"""The names of request-latency-scorer's decode terms, in the order of `TTFTDecision.extra_rows`."""


@dataclasses.dataclass(slots=True)
class TTFTDecision:
    """What the scorer predicted for one request (explain reads it from the cycle state).

    Per endpoint it keeps the objects the scoring made anyway; the dicts explain shows are built
    only when asked (`predictions`, `extras`): for every request and endpoint they cost ~0.4 us
    more than a tuple, ~5% of an endpoint's scoring (docs/bench/fleet-cost.md#per-request-pods)."""

    home: str = ""
    # The home rule's (share, slack) that ruled out endpoints where a prompt no endpoint holds
    # would queue (`unqueued`), if it ran: explain derives them (`queued`).
    home_wait: tuple[float, float] | None = None
    # The endpoint the holder rule kept the request on (`holderTolerance`), if it decided.
    holder: str = ""
    # The pre-warm planned instead of a move (`prewarm`): (endpoint, prompt tokens), if any.
    prewarm: tuple[str, int] | None = None
    # For explain: each endpoint's whole prediction, and the miss penalty factor it was priced at.
    terms: dict[str, Prediction] = dataclasses.field(default_factory=dict)
    penalty: float = 0.0
    # Endpoints far below their share of the recent requests, priced with no miss penalty.
    warming: frozenset[str] = frozenset()
    # request-latency-scorer's decode terms per endpoint: values in the order of EXTRA_FIELDS.
    extra_rows: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    # request-latency-scorer under P/D: the remote prefill its objective expected, if any.
    remote: RemotePrefill | None = None

    @property
    def queued(self) -> tuple[str, ...]:
        """The endpoints the home rule ruled out: a prompt no endpoint holds would queue there."""
        if self.home_wait is None:
            return ()
        row = list(self.terms.values())
        homed = unqueued(row, *self.home_wait)
        return tuple(n for n, h, p in zip(self.terms, homed, row, strict=True) if h > p.objective)

    @property
    def predictions(self) -> dict[str, tuple[float, float, float, float]]:
        """endpoint -> (predicted ttft, objective, queue, uncached tokens)."""
        return {n: (p.ttft, p.objective, p.queue_s, p.uncached) for n, p in self.terms.items()}

    def facts(self) -> dict[str, Any]:
        """Explain's facts of the decision: the miss penalty factor applied, which rule placed the
        request (`ttft_home`, `ttft_holder`) if one did, the endpoints no home for it because it
        would queue there (`ttft_home_queued`), and the endpoints warming up."""
        facts: dict[str, Any] = {"miss_penalty": self.penalty}
        if self.home:
            facts["ttft_home"] = self.home
        queued = self.queued  # derived from the terms on each read: read once
        if queued:
            facts["ttft_home_queued"] = list(queued)
        if self.holder:
            facts["ttft_holder"] = self.holder
        if self.prewarm is not None:
            facts["prewarm"] = {"endpoint": self.prewarm[0], "tokens": self.prewarm[1]}
        if self.warming:
            facts["warming_up"] = sorted(self.warming)
        return facts

    def extras(self, endpoint: str) -> dict[str, float]:
        """request-latency-scorer's decode terms for `endpoint` by name (empty if none)."""
        row = self.extra_rows.get(endpoint)
        return dict(zip(EXTRA_FIELDS, row, strict=True)) if row is not None else {}


def explain_endpoints(
    decision: TTFTDecision,
    waiting: Mapping[str, int],
    rates: Mapping[str, Rate],
    prior_cost: float,
    overhead_s: float,
    waiting_weight: float,
) -> dict[str, dict[str, Any]]:
    """predicted-ttft-scorer's explain per endpoint: each term of its prediction (seconds unless
    named otherwise). `waiting`: the scraped queue depth each endpoint was priced with; without it
    the miss penalty is what is left of the objective."""
    out: dict[str, dict[str, Any]] = {}
    for name, p in decision.terms.items():
        rate = rates.get(name)
        cost = rate.cost if rate is not None else prior_cost
        overhead = overhead_s * p.slowdown
        prefill = p.uncached * cost * p.slowdown
        w = waiting.get(name)
        if name in decision.warming:
            miss = 0.0
        elif w is not None:
            miss = decision.penalty * (1.0 + waiting_weight * w) * prefill
        else:
            miss = max(p.objective - overhead - p.queue_s - prefill - p.kv_price, 0.0)
        out[name] = {
            "predicted_ttft_s": p.ttft,
            "objective_s": p.objective,
            "overhead_s": overhead,
            "queue_s": p.queue_s,
            "queue_tokens": p.queue_tokens,
            "uncached_tokens": round(p.uncached),
            "prefill_tokens_per_second": 1.0 / cost,
            "prefill_s": prefill,
            "decodes": p.decodes,
            "decode_slowdown": p.slowdown,
            "kv_wait_s": p.kv_wait,
            "kv_price_s": p.kv_price,
            "incoming_kv_tokens": round(rate.incoming) if rate is not None else 0,
            "miss_penalty_s": miss,
        }
    return out
