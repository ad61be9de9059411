"""A virtual clock and timer, a settable saturation detector, and requests, for flow-control tests."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Sequence
from typing import Any

from epp.api.requests import Api, InferenceRequest
from epp.datastore.endpoints import Endpoint, EndpointSpec
from epp.flowcontrol import config as fc_config
from epp.flowcontrol.controller import FlowController


class Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualTimer:
    """`epp.clock` and the controller's timer on one virtual clock the test advances."""

    def __init__(self) -> None:
        self.now = 100.0
        self._heap: list[tuple[float, int, Handle, Callable[[], None]]] = []
        self._seq = 0

    def call_at(self, when: float, callback: Callable[[], None]) -> Handle:
        handle = Handle()
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, handle, callback))
        return handle

    async def advance(self, seconds: float) -> None:
        """Run every timer due within `seconds`, in order, letting woken tasks run after each."""
        await settle()  # tasks created just before start now, not at the end
        end = self.now + seconds
        while self._heap and self._heap[0][0] <= end:
            when, _, handle, callback = heapq.heappop(self._heap)
            self.now = max(self.now, when)
            if not handle.cancelled:
                callback()
                await settle()
        self.now = end
        await settle()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class Detector:
    """A saturation detector whose reading the test sets."""

    type = "test-detector"
    name = "test-detector"

    def __init__(self, value: float = 0.0) -> None:
        self.value = value
        self.stale = 0

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return self.value if endpoints else 1.0

    def stale_count(self, endpoints: Sequence[Endpoint]) -> int:
        return self.stale


def endpoint(i: int = 0, role: str | None = None) -> Endpoint:
    labels = {"llm-d.ai/role": role} if role is not None else {}
    spec = EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i}", port=8000, labels=labels)
    return Endpoint(spec=spec, hostport=spec.hostport)


def request(
    priority: int = 0, flow: str | None = None, slo_ttft: float | None = None, rid: str = "r"
) -> InferenceRequest:
    headers = {"x-llm-d-inference-fairness-id": flow} if flow else {}
    return InferenceRequest(
        request_id=rid,
        api=Api.COMPLETIONS,
        path="/v1/completions",
        headers=headers,
        priority=priority,
        slo_ttft=slo_ttft,
    )


def controller(
    timer: VirtualTimer,
    detector: Detector,
    pool: list[Endpoint] | None = None,
    config: fc_config.FlowControlConfig | None = None,
    **changes: Any,
) -> tuple[FlowController, list[Endpoint]]:
    pool = [endpoint()] if pool is None else pool
    cfg = config or fc_config.FlowControlConfig.defaults()
    for key, value in changes.items():
        setattr(cfg, key, value)
    return FlowController(cfg, detector, lambda: list(pool), timer=timer), pool
