"""How a request leaves flow control, and the HTTP answer each way out gets (llm-d's mapping).

`Outcome` names are llm-d's (`QueueOutcome`), used as the `outcome` label of the metrics. The
answers distinguish backpressure from unavailability: 429 means the pool has endpoints but they
are busy, 503 that there is nothing to serve with (an empty pool, or epp shutting down). The
reason travels in `x-llm-d-request-dropped-reason`, with llm-d's values, so a client or gateway
retry policy can tell them apart.

    outcome                    status  x-llm-d-request-dropped-reason
    RejectedCapacity           429     rejected-saturated       a queue limit (maxRequests, maxBytes)
    RejectedNoEndpoints        503     rejected-no-endpoints    a queue limit, the pool empty
    EvictedTTL                 429     rejected-ttl-expired     waited defaultRequestTTL, pool has endpoints
    EvictedTTL (pool empty)    503     rejected-no-endpoints    the wait ran out as the pool emptied
    EvictedNoEndpoints         503     rejected-no-endpoints    waited noEndpointRequestTTL, pool empty
    EvictedOther / shutdown    503     rejected-shutting-down   epp stopped with the request queued
    EvictedContextCancelled    -       -                        the client left: nobody to answer
    (in flight) evicted        429     evicted                  a sheddable request cut to free capacity
"""

from __future__ import annotations

import enum

from epp.api import errors

DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
SATURATED = "rejected-saturated"
NO_ENDPOINTS = "rejected-no-endpoints"
TTL_EXPIRED = "rejected-ttl-expired"
SHUTTING_DOWN = "rejected-shutting-down"
EVICTED = "evicted"


class Outcome(enum.Enum):
    DISPATCHED = "Dispatched"
    REJECTED_CAPACITY = "RejectedCapacity"
    REJECTED_NO_ENDPOINTS = "RejectedNoEndpoints"
    REJECTED_OTHER = "RejectedOther"
    EVICTED_TTL = "EvictedTTL"
    EVICTED_NO_ENDPOINTS = "EvictedNoEndpoints"
    EVICTED_CONTEXT_CANCELLED = "EvictedContextCancelled"
    EVICTED_OTHER = "EvictedOther"


def http_error(outcome: Outcome, *, pool_empty: bool, ttl: float = 0.0) -> errors.RequestError:
    """The answer for a request that flow control did not dispatch (`ttl`: the wait it had)."""
    if outcome is Outcome.REJECTED_CAPACITY:
        return _error(errors.NoCapacity, "flow control queue at capacity", SATURATED)
    if outcome is Outcome.REJECTED_NO_ENDPOINTS:
        return _error(
            errors.ServiceUnavailable,
            "no endpoints available and the flow control queue is full",
            NO_ENDPOINTS,
        )
    if outcome is Outcome.EVICTED_NO_ENDPOINTS or (outcome is Outcome.EVICTED_TTL and pool_empty):
        return _error(
            errors.ServiceUnavailable,
            f"request timed out in queue after {ttl:g}s and no endpoints are available",
            NO_ENDPOINTS,
        )
    if outcome is Outcome.EVICTED_TTL:
        return _error(errors.NoCapacity, f"request timed out in queue after {ttl:g}s", TTL_EXPIRED)
    return _error(errors.ServiceUnavailable, "flow controller shutting down", SHUTTING_DOWN)


def evicted_error() -> errors.RequestError:
    """The answer to an in-flight sheddable request cut to free capacity for higher priorities."""
    return _error(errors.NoCapacity, "request evicted by flow control", EVICTED)


def _error(kind: type[errors.RequestError], reason: str, dropped: str) -> errors.RequestError:
    exc = kind(reason)
    exc.headers = {DROPPED_REASON_HEADER: dropped}
    return exc
