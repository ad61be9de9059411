"""The Director with a planned pre-warm (epp.scheduling.prewarm): sent when the prewarmer takes
it, the request staying on the holder; held back (`wait`), the request stays there too; refused,
or without a prewarmer, the move it replaced, to the one endpoint the objective chose. The
gateway's destination is then that endpoint alone: GIE's standard Envoy config (ORIGINAL_DST on
x-gateway-destination-endpoint) takes a single ip:port, and answered a two-endpoint list with
503 (no_healthy_upstream) in a live run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.kvcache.index import BlockIndex
from epp.requestcontrol.director import Director
from epp.scheduling import config as sched_config
from epp.scheduling import prewarm
from epp.scheduling.interfaces import Handle, SchedulingResult
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import load_shipped

BODY = msgspec.json.encode({"model": "m", "prompt": "a prompt of a few words " * 20, "max_tokens": 4})


class Prewarmer:
    """Answers every pre-warm alike, and keeps what it was asked to send."""

    def __init__(self, verdict: prewarm.Verdict) -> None:
        self.answer: prewarm.Verdict = verdict
        self.sent: list[tuple[str, int]] = []

    def verdict(self, endpoint: Endpoint) -> prewarm.Verdict:
        return self.answer

    def send(self, endpoint: Endpoint, request: InferenceRequest, tokens: int) -> None:
        self.sent.append((endpoint.name, tokens))


class Planning:
    """epp's default scheduler, whose pick is planned to stay there while the other pod is
    pre-warmed (what request-latency-scorer plans for a request it would move off its holder)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def schedule(self, request: InferenceRequest, candidates: list[Endpoint], **kw: Any) -> SchedulingResult:
        result: SchedulingResult = self._inner.schedule(request, candidates, **kw)
        holder = result.targets[0]
        chosen = next(ep for ep in candidates if ep is not holder)
        result.cycle[prewarm.KEY] = prewarm.Warmup(chosen, holder.name, 64)
        return result


@pytest.fixture
async def tokenizers() -> AsyncIterator[Tokenizers]:
    toks = Tokenizers(default=load_shipped(), workers=1)
    yield toks
    toks.close()


def director(tokenizers: Tokenizers, prewarmer: Prewarmer | None) -> Director:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(2)])
    cfg = sched_config.load_config(None, Handle(datastore=ds, kv_index=BlockIndex()))
    return Director(
        datastore=ds,
        scheduler=Planning(cfg.scheduler),
        pre_request=cfg.pre_request,
        response_complete=cfg.response_complete,
        tokenizer=tokenizers,
        prewarmer=prewarmer,
    )


async def holder_and_pick(tokenizers: Tokenizers, warmer: Prewarmer | None) -> tuple[str, str]:
    """The endpoint the scheduler picked (the plan's holder) and the one the request went to."""
    d = director(tokenizers, warmer)
    picks: list[str] = []
    schedule = d.scheduler.schedule

    def spy(request: InferenceRequest, candidates: list[Endpoint], **kw: Any) -> SchedulingResult:
        result: SchedulingResult = schedule(request, candidates, **kw)
        picks.append(result.targets[0].name)
        return result

    d.scheduler.schedule = spy  # type: ignore[method-assign]
    ctx = await d.route(path="/v1/completions", headers={}, body=BODY, subset=None)
    assert ctx.destination == ctx.booked.hostport and "," not in ctx.destination  # one endpoint
    d.finish(ctx, complete=True)
    return picks[0], ctx.booked.name


async def test_a_prewarm_taken_keeps_the_request_on_the_holder(tokenizers: Tokenizers) -> None:
    warmer = Prewarmer("send")
    holder, went = await holder_and_pick(tokenizers, warmer)
    assert went == holder
    (other,) = {"pod-0", "pod-1"} - {holder}
    assert warmer.sent == [(other, 64)]


async def test_a_prewarm_held_back_keeps_the_request_on_the_holder(tokenizers: Tokenizers) -> None:
    warmer = Prewarmer("wait")
    holder, went = await holder_and_pick(tokenizers, warmer)
    assert went == holder and warmer.sent == []


@pytest.mark.parametrize("sender", [True, False])
async def test_a_prewarm_refused_is_the_move_to_one_endpoint(tokenizers: Tokenizers, sender: bool) -> None:
    warmer = Prewarmer("refuse") if sender else None
    holder, went = await holder_and_pick(tokenizers, warmer)
    assert went != holder  # the one the objective chose
    assert warmer is None or warmer.sent == []
