"""`program-aware-fairness`: flows are programs (agents, workflows, tenants); the one that has
received the least service goes next (llm-d's Least Attained Service strategy).

A program is a fairness ID (`x-llm-d-inference-fairness-id`). Its attained service is the
weighted tokens of its completed requests, prompt tokens x1 and completion tokens x2 (decode
costs more), decaying with a half-life of `lasHalfLifeSeconds` so that a program back from idle
competes on near-equal terms. Each pick scores the band's non-empty flows:

    score = lasWeightService * (1 - norm(service)) + lasWeightHeadWait * norm(head wait)

with each term min-max normalised over the flows (0.5 when all are equal), and takes the highest
(ties: the first fairness ID in order). A program with no completion for `evictionTtlSeconds` and
nothing in flight is forgotten (checked every `evictionSweepSeconds`), so client-chosen IDs do
not accumulate.

Tokens come from the response's usage where epp reads it; for a response epp does not read (off
the response sample: `--response-sample-ratio`) the prompt's estimated tokens count, and its
completion tokens are not known. The jains index, average wait and attained service per program
are exported under llm-d's names (`llm_d_epp_program_aware_*`).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec

from epp import clock
from epp.api.requests import InferenceRequest
from epp.flowcontrol.queues import Band, FlowQueue
from epp.scheduling.interfaces import RequestOutcome

_INPUT_WEIGHT = 1.0
_OUTPUT_WEIGHT = 2.0


class Params(msgspec.Struct, forbid_unknown_fields=True):
    strategy: Literal["las"] = "las"
    lasWeightService: Annotated[float, msgspec.Meta(ge=0)] = 0.8
    lasWeightHeadWait: Annotated[float, msgspec.Meta(ge=0)] = 0.2
    lasHalfLifeSeconds: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    evictionTtlSeconds: Annotated[float, msgspec.Meta(ge=0)] = 3600.0
    evictionSweepSeconds: Annotated[float, msgspec.Meta(gt=0)] = 300.0


class Program:
    """What is known of one program."""

    __slots__ = ("anchor", "dispatched", "in_flight", "last_completion", "service", "wait_count", "wait_ms")

    def __init__(self, now: float) -> None:
        self.service = 0.0  # attained service (weighted tokens), decayed up to `anchor`
        self.anchor = now
        self.wait_ms = 0.0  # running mean of its requests' queue waits
        self.wait_count = 0
        self.dispatched = 0
        self.in_flight = 0
        self.last_completion = now  # seeded: a program that never completes is still forgotten


class ProgramAware:
    type = "program-aware-fairness"

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params
        self.programs: dict[str, Program] = {}
        self._swept = clock.now()

    def new_state(self) -> None:
        return None

    def _program(self, program_id: str, now: float) -> Program:
        program = self.programs.get(program_id)
        if program is None:
            program = self.programs[program_id] = Program(now)
        return program

    def service(self, program: Program, now: float) -> float:
        """The program's attained service, decayed to `now`."""
        half_life = self.params.lasHalfLifeSeconds
        elapsed = now - program.anchor
        if elapsed > 0:
            if half_life > 0:
                program.service *= math.exp2(-elapsed / half_life)
            program.anchor = now
        return program.service

    def pick(self, band: Band) -> FlowQueue | None:
        now = clock.now()
        self._maybe_sweep(now)
        entries: list[tuple[FlowQueue, float, float]] = []
        for flow_id in band.flow_ids:
            queue = band.flows[flow_id]
            head = queue.head()
            if head is None:
                continue
            program = self._program(flow_id, now)
            entries.append((queue, self.service(program, now), (now - head.enqueued) * 1000.0))
        if not entries:
            return None
        services = [e[1] for e in entries]
        waits = [e[2] for e in entries]
        s_lo, s_hi, w_lo, w_hi = min(services), max(services), min(waits), max(waits)
        ws, ww = self.params.lasWeightService, self.params.lasWeightHeadWait
        best, best_score = entries[0][0], -math.inf
        for queue, service, wait in entries:
            score = ws * (1.0 - _normalize(service, s_lo, s_hi)) + ww * _normalize(wait, w_lo, w_hi)
            if score > best_score:
                best, best_score = queue, score
        return best

    def dispatched(self, flow: str, wait: float, now: float) -> None:
        """A request of `flow` left flow control for scheduling after `wait` seconds."""
        program = self._program(flow, now)
        program.in_flight += 1
        program.dispatched += 1
        program.wait_count += 1
        program.wait_ms += (wait * 1000.0 - program.wait_ms) / program.wait_count

    def completed(self, flow: str, request: InferenceRequest, outcome: RequestOutcome) -> None:
        """A dispatched request's stream ended: its tokens count toward its program's service."""
        now = clock.now()
        program = self._program(flow, now)
        program.in_flight = max(0, program.in_flight - 1)
        program.last_completion = now
        prompt = (
            outcome.prompt_tokens if outcome.prompt_tokens is not None else request.prompt_tokens_estimate
        )
        cost = _INPUT_WEIGHT * prompt + _OUTPUT_WEIGHT * (outcome.completion_tokens or 0)
        self.service(program, now)
        program.service += cost

    def jains_index(self) -> float:
        """Jain's fairness index over the programs' average queue waits (1.0: all equal)."""
        waits = [p.wait_ms for p in self.programs.values() if p.wait_count]
        total = sum(waits)
        squares = sum(w * w for w in waits)
        if len(waits) <= 1 or squares == 0:
            return 1.0
        return total * total / (len(waits) * squares)

    def _maybe_sweep(self, now: float) -> None:
        params = self.params
        if now - self._swept < params.evictionSweepSeconds:
            return
        self._swept = now
        ttl = params.evictionTtlSeconds
        if ttl <= 0:
            return
        for program_id in [
            pid for pid, p in self.programs.items() if p.in_flight == 0 and now - p.last_completion > ttl
        ]:
            del self.programs[program_id]


def _normalize(value: float, lo: float, hi: float) -> float:
    return 0.5 if hi == lo else (value - lo) / (hi - lo)
