"""predicted-ttft-scorer's records and metrics: each endpoint's prediction for the request being
scored (`Prediction`), the decision explain reads (`TTFTDecision`), a routed request's prediction
kept until its response (`Booked`), an endpoint's learned rate and fluid queue (`Rate`).

`request-latency-scorer` and the P/D latency decider read them too; the model that fills them is
in `predicted_ttft_scorer`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

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


@dataclasses.dataclass(slots=True)
class TTFTDecision:
    """What the scorer predicted for one request (explain reads it from the cycle state)."""

    # endpoint -> (predicted ttft, objective, queue, uncached tokens)
    predictions: dict[str, tuple[float, float, float, float]]
    home: str = ""
    # For explain: each endpoint's whole prediction, and the miss penalty factor it was priced at.
    terms: dict[str, Prediction] = dataclasses.field(default_factory=dict)
    penalty: float = 0.0
    # Endpoints far below their share of the recent requests, priced with no miss penalty.
    warming: frozenset[str] = frozenset()
    # request-latency-scorer's decode terms per endpoint (explain).
    extras: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
