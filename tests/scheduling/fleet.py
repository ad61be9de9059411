"""The fleet the latency-pricing scorers' tests route over: a virtual clock, prompts and their KV
blocks fed into an index, and a `Stack` of precise-prefix-cache-scorer (weight 0, it only fills
the cycle state) plus one pricing scorer, routed the way the Director does.

Import the `clock` fixture as `from .fleet import clock as clock` (the re-export form, so that
pytest finds it in the test module)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from epp import clock as epp_clock
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.kvcache.events import BlockStored, EventBatch
from epp.kvcache.index import BlockIndex
from epp.scheduling import config, interfaces, registry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Iterator[Clock]:
    c = Clock()
    with epp_clock.use(c):
        yield c


def toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def feed(index: BlockIndex, pod: str, tokens: list[int], *, base: int = 1000) -> None:
    """`pod` holds the full 16-token blocks of `tokens`, as a vLLM BlockStored event says."""
    n = len(tokens) // 16
    ev = BlockStored(
        block_hashes=[base + i for i in range(n)],
        parent_block_hash=None,
        token_ids=tokens[: n * 16],
        block_size=16,
        lora_id=None,
        medium="gpu",
        lora_name=None,
        extra_keys=None,
    )
    index.apply(pod, EventBatch(0.0, [ev], 0), model="m")


def result(primary: Endpoint) -> interfaces.SchedulingResult:
    return interfaces.SchedulingResult("default", {"default": interfaces.ProfileResult("default", [primary])})


def specs(n: int) -> list[EndpointSpec]:
    """`n` endpoints 10.0.0.1:8000, 10.0.0.2:8000, ..."""
    return [EndpointSpec(name=f"10.0.0.{i + 1}:8000", address=f"10.0.0.{i + 1}", port=8000) for i in range(n)]


def configured(
    path: str | os.PathLike[str], cached: list[int], holder: str = "10.0.0.2:8000"
) -> tuple[config.SchedulerConfig, list[Endpoint]]:
    """The policy of the config file `path` and three endpoints (`specs(3)`) to schedule over,
    `holder` caching the blocks of `cached` in the policy's KV index."""
    index = BlockIndex()
    feed(index, holder, cached)
    cfg = config.load_config_file(path, interfaces.Handle(datastore=Datastore(), kv_index=index))
    return cfg, [Endpoint(spec=s, hostport=s.hostport) for s in specs(3)]


class Stack:
    """precise-prefix-cache-scorer and the scorer `kind` (named `name`) over one index, as the
    default configurations pair them."""

    def __init__(self, kind: str, name: str, **params: Any) -> None:
        self.index = BlockIndex()
        self.handle = interfaces.Handle(datastore=Datastore(), kv_index=self.index)
        self.precise: Any = registry.default.build(
            "precise-prefix-cache-scorer", "precise-prefix-cache-scorer", {}, self.handle
        )
        self.scorer: Any = registry.default.build(kind, name, params, self.handle)

    def score(self, req: InferenceRequest, eps: list[Endpoint]) -> tuple[list[float], interfaces.CycleState]:
        cycle: interfaces.CycleState = {}
        self.precise.score(cycle, req, eps)
        return self.scorer.score(cycle, req, eps), cycle

    def route(self, req: InferenceRequest, eps: list[Endpoint]) -> Endpoint:
        """Score, pick the best (ties at random) and run both pre-request hooks, as the Director."""
        scores, _ = self.score(req, eps)
        best = max(scores)
        pick = random.choice([ep for ep, s in zip(eps, scores, strict=True) if s == best])
        primary = result(pick)
        self.precise.pre_request(req, primary)
        self.scorer.pre_request(req, primary)
        return pick
