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
holds only when the request was picked as the scorer planned (`planned`). A plan the sender must
hold back (a pre-warm already runs on that endpoint, or its bound in all: `wait`) leaves
the request on the holder (`stay`): moved, it would queue its cold prefill behind the copy being
made there, and on a pod just back from a restart such moves stacked 3-5 cold prompts, their
first tokens 1.5-2.2 s (rolling-restart, fast mode, 120 s); staying took that run's TTFT p99 down
14-28% and its requests' hit rate up 0.7-1.2 points (BENCHMARKS.md#prewarm-wait; live, against
the real routers, 1.16-2.10x the best one's became 0.90-1.15x). A plan the sender will not take
at all (no sender, none allowed, or pre-warms failing at that endpoint: `refuse`) becomes the
move it replaced (`move`): then epp copies prefixes as it does without pre-warms.
"""

from __future__ import annotations

import dataclasses
from typing import Final, Literal, Protocol

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling.interfaces import SchedulingResult

KEY: Final = "#prewarm"  # not a plugin name (those key the cycle too)


@dataclasses.dataclass(frozen=True, slots=True)
class Warmup:
    endpoint: Endpoint  # computes the prefix
    holder: str  # the endpoint the request itself stays on
    tokens: int  # the prompt's first `tokens` tokens: whole blocks of `endpoint`'s size
    # Where the request goes if the pre-warm is refused (`move`): where the scorer would have
    # sent it without the plan. None: `endpoint`, the objective's favourite; latency targets may
    # prefer another (`request-latency-scorer`), the holder itself meaning the request stays.
    move_to: Endpoint | None = None


Verdict = Literal["send", "wait", "refuse"]
"""A `Prewarmer`'s answer to a planned pre-warm: send it; `wait`, within its bounds later (one
runs on that endpoint, or the most allowed in all); `refuse`, not now nor soon (none allowed, an
endpoint it does not know, pre-warms failing there). A string, not an enum: `epp.prewarm`'s
sender answers it without importing the scheduler."""


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


def stay(result: SchedulingResult) -> None:
    """The pre-warm must wait: forget the plan; the request stays on the holder, where it was
    picked (a plan holds only there, and with latency targets only where the holder is predicted
    to meet them as well as any endpoint: request-latency-scorer's tiers come after the plan)."""
    result.cycle.pop(KEY, None)


class Prewarmer(Protocol):
    """What sends a planned pre-warm (the Director holds one): `epp.prewarm.Sender` over HTTP,
    the fast-mode bench into its simulated engines."""

    def verdict(self, endpoint: Endpoint) -> Verdict:
        """Whether a pre-warm to `endpoint` would be sent now; asked before the plugins book
        anything: a plan held back here stays (`stay`), one refused becomes its move (`move`)."""
        ...

    def send(self, endpoint: Endpoint, request: InferenceRequest, tokens: int) -> None:
        """Start computing `request`'s first `tokens` token ids on `endpoint`; returns at once,
        and never raises for the request's sake."""
        ...
