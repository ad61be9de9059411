"""Fast mode's pre-warms (epp.scheduling.prewarm): the one-token completion of a prompt's first
blocks that `epp.prewarm.sender` posts to a pod goes into the simulated pod's engine instead, at
the moment of the routing. No client waits for it: its first token and its end are dropped
(`is_prewarm`), and it shows in no request's figures, only in the pods' work and KV events. The
bounds are the sender's: one at a time per pod, `max_inflight` in all (past them a plan waits:
its request stays on the holder); a pod it does not know, or `max_inflight` 0, refuses (the
request moves). Each one sent is kept (`sent_log`: which pod, how many tokens, when, for which
prefix group), so the run can count the requests that found the warmed copy
(`epp.bench.report`: `prewarms_used`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from epp import clock
from epp.api.requests import InferenceRequest
from epp.bench.records import PrewarmRecord
from epp.datastore.endpoints import Endpoint
from epp.scheduling.prewarm import Verdict
from epp.sim import core

PREFIX = "prewarm-"


def is_prewarm(request_id: str) -> bool:
    return request_id.startswith(PREFIX)


class EnginePrewarmer:
    """Implements the Director's `Prewarmer` over the fast run's engines."""

    def __init__(
        self,
        engines: Sequence[core.Engine],
        pod_of: dict[str, int],
        wake: Callable[[int], None],
        *,
        max_inflight: int = 16,
        group_of: Callable[[str], str | None] = lambda request_id: None,
        start: float = 0.0,
    ) -> None:
        """`group_of`: the prefix group of a request being routed, by its id; `start`: the run's
        start in virtual time, which the log's times count from."""
        self._engines = engines
        self._group_of = group_of
        self._start = start
        self._pod_of = pod_of
        self._wake = wake
        self._max = max_inflight
        self._running: dict[str, int] = {}  # request id -> pod
        self.sent = 0
        self.held_back = 0  # plans answered `wait`: their requests stayed on their holders
        self.sent_log: list[PrewarmRecord] = []

    def verdict(self, endpoint: Endpoint) -> Verdict:
        pod = self._pod_of.get(endpoint.name)
        if pod is None or self._max <= 0:
            return "refuse"
        if len(self._running) >= self._max or pod in self._running.values():
            self.held_back += 1
            return "wait"
        return "send"

    def send(self, endpoint: Endpoint, request: InferenceRequest, tokens: int) -> None:
        ids = request.token_ids
        pod = self._pod_of.get(endpoint.name)
        if not ids or tokens <= 0 or pod is None:
            return
        self.sent += 1
        rid = f"{PREFIX}{self.sent}"
        try:
            self._engines[pod].add_request(core.EngineRequest(rid, ids[:tokens], 1), clock.now())
        except core.RequestRejected:
            return
        self._running[rid] = pod
        group = self._group_of(request.request_id) or ""
        self.sent_log.append(PrewarmRecord(clock.now() - self._start, pod, tokens, group))
        self._wake(pod)

    def finished(self, request_id: str) -> None:
        self._running.pop(request_id, None)
