"""Prefix pre-warms: a request stays on the pod holding its prefix, and the pod it would have
moved to computes that prefix ahead of the requests that will hit it there.

When the objective (predicted-ttft-scorer's, request-latency-scorer's) prefers an endpoint that
does not hold a prompt the holder has most of, moving the request buys a second copy of the prefix
(the holders' load is spread from then on) at the price of a cold prefill in that request's first
token: each such move is a miss at the first-token tail. With `prewarm` on, the scorer keeps the
request on the holder and plans a `Warmup` instead: the Director sends the chosen endpoint the
prompt's first `tokens` tokens as a one-token completion (`epp.prewarm`), which no client waits
for. The plugins book it as they book a routed request's prefill (the fluid queue, speculative
index entries), so the prompt's next requests find the new copy.

The plan travels in the scheduling cycle's state (`SchedulingResult.cycle`, under `KEY`), and
holds only when the request was picked as the scorer planned (`planned`). A plan the Director
cannot send (no sender, or past its bounds) becomes the move it replaced (`move`).
"""

from __future__ import annotations

import dataclasses
from typing import Final, Protocol

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling.interfaces import SchedulingResult

KEY: Final = "#prewarm"  # not a plugin name (those key the cycle too)


@dataclasses.dataclass(frozen=True, slots=True)
class Warmup:
    endpoint: Endpoint  # computes the prefix
    holder: str  # the endpoint the request itself stays on
    tokens: int  # the prompt's first `tokens` tokens: whole blocks of `endpoint`'s size
    # Where the request goes if the pre-warm is not sent (`move`): where the scorer would have
    # sent it without the plan. `endpoint`, the objective's favourite, unless latency targets
    # prefer another (`request-latency-scorer`); the holder itself means the request stays.
    move_to: Endpoint | None = None


def planned(result: SchedulingResult) -> Warmup | None:
    """The pre-warm the scorer planned for this request, if the request went where it planned
    (another picker or a later profile may have decided otherwise) and runs on one pod."""
    warmup = result.cycle.get(KEY)
    if not isinstance(warmup, Warmup) or result.stages:
        return None
    targets = result.targets
    if not targets or targets[0].name != warmup.holder:
        return None
    return warmup


def move(result: SchedulingResult, warmup: Warmup) -> None:
    """Nothing will send the pre-warm: forget the plan (before the plugins book it) and send the
    request where the scorer would have without pre-warms (`Warmup.move_to`). As many targets as
    the picker gave: one by default, the only form GIE's standard Envoy config (ORIGINAL_DST on
    the destination header) takes; with fallbacks configured, the holder becomes the first of
    them."""
    result.cycle.pop(KEY, None)
    profile = result.profiles[result.primary]
    targets = profile.targets
    to = warmup.move_to or warmup.endpoint
    profile.targets = [to, *(ep for ep in targets if ep is not to)][: len(targets)]


class Prewarmer(Protocol):
    """What sends a planned pre-warm (the Director holds one): `epp.prewarm.Sender` over HTTP,
    the fast-mode bench into its simulated engines."""

    def accepts(self, endpoint: Endpoint) -> bool:
        """Whether a pre-warm to `endpoint` would be sent now (within the sender's bounds); asked
        before the plugins book anything: a plan refused here becomes its move (`move`)."""
        ...

    def send(self, endpoint: Endpoint, request: InferenceRequest, tokens: int) -> None:
        """Start computing `request`'s first `tokens` token ids on `endpoint`; returns at once,
        and never raises for the request's sake."""
        ...
