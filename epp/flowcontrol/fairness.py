"""Fairness policies: which flow of a band dispatches next (llm-d's second tier).

- `global-strict-fairness-policy` (the default): flows are ignored; the band's best head by its
  ordering policy goes (with `fcfs`, the band is one FIFO queue).
- `round-robin-fairness-policy`: flows in turn, by fairness ID, each non-empty flow one request
  per turn. The cursor is the last flow served; the next is the first ID after it, so a flow that
  empties and comes back keeps its place in the rotation.
- `program-aware-fairness` (`program_aware.py`): least attained service per program.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, Protocol

from epp.flowcontrol.queues import Band, FlowQueue


class FairnessPolicy(Protocol):
    type: str
    name: str

    def new_state(self) -> Any:
        """The mutable state this policy keeps per band (the policy itself is shared by bands)."""
        ...

    def pick(self, band: Band) -> FlowQueue | None:
        """The flow to dispatch from next; None when the band has nothing queued."""
        ...


class GlobalStrict:
    type = "global-strict-fairness-policy"

    def __init__(self, name: str) -> None:
        self.name = name

    def new_state(self) -> None:
        return None

    def pick(self, band: Band) -> FlowQueue | None:
        best: FlowQueue | None = None
        best_key: tuple[float, float, int] | None = None
        for queue in band.flows.values():
            head = queue.head()
            if head is not None and (best_key is None or head.key < best_key):
                best, best_key = queue, head.key
        return best


class Cursor:
    """A band's round-robin position: the last flow served."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: str | None = None


def take_turn(band: Band, cursor: Cursor, eligible: Callable[[str], bool] | None = None) -> FlowQueue | None:
    """The first flow after the cursor's (in ID order, wrapping) that is `eligible` (any, when
    None), and the cursor moved to it; None when there is none."""
    ids = band.flow_ids
    if not ids:
        return None
    start = 0 if cursor.last is None else bisect.bisect_right(ids, cursor.last) % len(ids)
    for k in range(len(ids)):
        flow = ids[(start + k) % len(ids)]
        if eligible is None or eligible(flow):
            cursor.last = flow
            return band.flows[flow]
    return None


class RoundRobin:
    type = "round-robin-fairness-policy"

    def __init__(self, name: str) -> None:
        self.name = name

    def new_state(self) -> Cursor:
        return Cursor()

    def pick(self, band: Band) -> FlowQueue | None:
        return take_turn(band, band.state)
