"""Ordering policies: which request of a flow's queue goes next (llm-d's third tier).

Each maps an item to a sort key; the flow's queue is a heap on it, and `global-strict-fairness-policy`
compares heads of different flows by the same key (a band has one ordering policy).

- `fcfs-ordering-policy` (the default): arrival order.
- `edf-ordering-policy`: earliest deadline first, the deadline being arrival + the request's
  queue-wait budget (`defaultRequestTTL`); no budget (0) sorts last; ties by arrival.
- `slo-deadline-ordering-policy`: earliest of arrival + the request's TTFT target
  (`x-llm-d-slo-ttft-ms`, or its older name `x-slo-ttft-ms`: `InferenceRequest.slo_ttft`);
  requests without a target after every request with one; ties by arrival.

Arrival is when flow control received the request (llm-d: when the EPP received it; the two
differ by the time spent reading and parsing the body).
"""

from __future__ import annotations

import math
from typing import Protocol

from epp.flowcontrol.queues import FlowItem

_INF = math.inf


class OrderingPolicy(Protocol):
    type: str
    name: str

    def key(self, item: FlowItem) -> tuple[float, float, int]:
        """The item's place in its queue: lower goes first."""
        ...


class Fcfs:
    type = "fcfs-ordering-policy"

    def __init__(self, name: str) -> None:
        self.name = name

    def key(self, item: FlowItem) -> tuple[float, float, int]:
        return (item.enqueued, 0.0, item.seq)


class Edf:
    type = "edf-ordering-policy"

    def __init__(self, name: str) -> None:
        self.name = name

    def key(self, item: FlowItem) -> tuple[float, float, int]:
        deadline = item.enqueued + item.ttl if item.ttl > 0 else _INF
        return (deadline, item.enqueued, item.seq)


class SloDeadline:
    type = "slo-deadline-ordering-policy"

    def __init__(self, name: str) -> None:
        self.name = name

    def key(self, item: FlowItem) -> tuple[float, float, int]:
        target = item.request.slo_ttft
        deadline = item.enqueued + target if target is not None else _INF
        return (deadline, item.enqueued, item.seq)
