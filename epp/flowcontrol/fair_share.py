"""`fair-share-fairness-policy` (epp's own): round-robin turns, and a flow holding more than its
share of the band's requests in flight waits while the pool is past `overShareCeiling` of the
band's ceiling.

Why: with round-robin alone, a tenant bursting 10x keeps the pods at the detector's limit, so a
steady tenant's request dispatches at its turn but joins a pod whose queued prefills and batch
the burst filled (docs/bench/flow-control.md#flow-control: the steady tenants' TTFT p99 1.24x theirs
without the burst, 0.004-0.03 s of it in epp's queue). Holding the over-share flow below the
limit keeps headroom that the flows under their share dispatch into at once.

- A flow's fair share is the band's requests in flight (routed, stream not ended) over its active
  flows (those with a request in flight or queued); a flow is over its share when it holds more
  than `overShareFactor` times that. A lone flow is never over its share: the policy is
  work-conserving for one tenant.
- Below `overShareCeiling` x the band's ceiling every flow takes its turn, as round-robin; from
  there to the ceiling only the flows at or under their share do (in turn), and the band's other
  flows wait (with only those queued, the band holds dispatch as a band at its ceiling does:
  lower bands wait behind it); past the ceiling the band waits, as with any fairness policy.
- Parameters: `overShareCeiling` (0.4, in (0, 1]; 1 is plain round-robin) and `overShareFactor`
  (1.5, >= 1). At 1, tenants of equal rates hold one another back as their counts fluctuate
  around the mean: the steady tenants' TTFT p99 without any burst rose 2-5% in `tenant-steady`;
  at 1.5 it did not move (docs/bench/flow-control.md#fair-share).

In-flight counts come from the controller: `started` when a request is routed, `finished` when
its stream ends (every routed request's context is finished once). A band collected while idle
(`BAND_GC_TIMEOUT`) forgets its counts; a late `finished` never takes a count below 0.
"""

from __future__ import annotations

from epp.flowcontrol.fairness import Cursor, take_turn
from epp.flowcontrol.queues import Band, FlowQueue


class _State(Cursor):
    __slots__ = ("inflight", "total")

    def __init__(self) -> None:
        super().__init__()
        self.inflight: dict[str, int] = {}
        self.total = 0


class FairShare:
    type = "fair-share-fairness-policy"

    def __init__(self, name: str, over_share_ceiling: float = 0.4, over_share_factor: float = 1.5) -> None:
        if not 0 < over_share_ceiling <= 1 or over_share_factor < 1:
            raise ValueError("overShareCeiling must be in (0, 1] and overShareFactor >= 1")
        self.name = name
        self.over_share_ceiling = over_share_ceiling
        self.over_share_factor = over_share_factor

    def new_state(self) -> _State:
        return _State()

    def pick(self, band: Band) -> FlowQueue | None:
        """Round-robin, every flow eligible (the controller calls `pick_gated` when it gates)."""
        return take_turn(band, band.state)

    def pick_gated(self, band: Band, saturation: float, ceiling: float) -> FlowQueue | None:
        """The next flow to dispatch from at `saturation` under the band's `ceiling`; None when
        only flows over their share are queued and the pool is past their limit."""
        state: _State = band.state
        if saturation < ceiling * self.over_share_ceiling:
            return take_turn(band, state)
        share = self._share(band)
        return take_turn(band, state, lambda flow: state.inflight.get(flow, 0) <= share)

    def admits(self, band: Band, flow: str, saturation: float, ceiling: float) -> bool:
        """Whether `flow`'s request may go at once (queues empty, the band under its ceiling)."""
        if saturation < ceiling * self.over_share_ceiling:
            return True
        state: _State = band.state
        return state.inflight.get(flow, 0) <= self._share(band, extra=flow)

    def started(self, band: Band, flow: str) -> None:
        state: _State = band.state
        state.inflight[flow] = state.inflight.get(flow, 0) + 1
        state.total += 1

    def finished(self, band: Band, flow: str) -> None:
        state: _State = band.state
        held = state.inflight.get(flow, 0)
        if held <= 0:
            return
        if held == 1:
            del state.inflight[flow]
        else:
            state.inflight[flow] = held - 1
        state.total -= 1

    def _share(self, band: Band, extra: str = "") -> float:
        state: _State = band.state
        active = state.inflight.keys() | set(band.flow_ids)
        if extra:
            active.add(extra)
        return self.over_share_factor * state.total / len(active) if active else 0.0
