"""The Director on the routes beyond chat and completions: the configured parsers decide the route,
Anthropic and Responses bodies are rendered as vLLM renders them, routes that run no engine get
no ids scored (and no booking), and refusals come in the shape vLLM answers the route in."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from epp.api import errors
from epp.api.context_length import ContextLimits
from epp.api.routes import Parser, Parsers
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.kvcache.index import BlockIndex
from epp.requestcontrol.director import Director, DirectorSettings
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.sim.engine import SimConfig
from epp.sim.server import bound_address, sim_state, start_sim_server
from epp.tokenize.chat import encode_chat
from epp.tokenize.registry import Tokenizers
from epp.tokenize.render import Renderer, RenderSpec
from epp.tokenize.tokenizer import load_shipped

MSG = {"model": "m", "max_tokens": 8, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
async def tokenizers() -> AsyncIterator[Tokenizers]:
    toks = Tokenizers(default=load_shipped(), workers=1)
    yield toks
    toks.close()


def director(tokenizers: Tokenizers, parsers: Parsers | None = None) -> Director:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(2)])
    handle = Handle(datastore=ds, kv_index=BlockIndex())
    cfg = sched_config.load_config(None, handle)  # the precise default: it scores token ids
    settings = DirectorSettings(parsers=parsers) if parsers is not None else DirectorSettings()
    return Director(
        datastore=ds,
        scheduler=cfg.scheduler,
        pre_request=cfg.pre_request,
        response_complete=cfg.response_complete,
        tokenizer=tokenizers,
        settings=settings,
    )


def _bytes(body: Any) -> bytes:
    return body if isinstance(body, bytes) else msgspec.json.encode(body)


async def test_messages_are_rendered_as_the_chat_vllm_builds(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    request, scored = await d.tokenize(path="/v1/messages", headers={}, body=_bytes(MSG))
    chat = {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    }
    assert request.token_ids == encode_chat(load_shipped(), chat) and scored
    ctx = await d.route(path="/v1/messages", headers={}, body=_bytes(MSG), subset=None)
    assert ctx.request.token_ids == request.token_ids
    assert ctx.request.prompt_tokens_estimate == len(request.token_ids or ())
    d.finish(ctx, complete=True)


async def test_responses_add_the_special_tokens(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    request, _ = await d.tokenize(
        path="/v1/responses", headers={}, body=_bytes({"model": "m", "input": "Hi"})
    )
    assert request.token_ids is not None and request.token_ids[:2] == [1, 1]  # vLLM's double BOS


async def test_routes_without_an_engine_are_not_scored(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    for path, body in (
        ("/v1/chat/completions/render", {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
        ("/v1/messages/count_tokens", {k: v for k, v in MSG.items() if k != "max_tokens"}),
    ):
        # computed (to refuse what vLLM refuses) but never scored
        request, scored = await d.tokenize(path=path, headers={}, body=_bytes(body))
        assert request.token_ids and not scored
        ctx = await d.route(path=path, headers={}, body=_bytes(body), subset=None)
        assert ctx.request.token_ids is None and ctx.request.prompt_tokens_estimate == 0
        d.finish(ctx, complete=True)


async def test_unknown_paths_pass_through_unparsed(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    ctx = await d.route(path="/v2/experimental", headers={}, body=b"\x00 not json", subset=None)
    assert ctx.body == b"\x00 not json" and ctx.request.token_ids is None
    d.finish(ctx, complete=True)


async def test_configured_parsers_decide(tokenizers: Tokenizers) -> None:
    d = director(tokenizers, Parsers([Parser("oa", "openai-parser")]))
    with pytest.raises(errors.BadRequest, match="no parser registered"):
        await d.route(path="/v1/messages", headers={}, body=_bytes(MSG), subset=None)


async def test_error_shapes_follow_vllm(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    # the request model's refusal: OpenAI's shape, as FastAPI's handler answers every route
    with pytest.raises(errors.BadRequest) as info:
        await d.route(path="/v1/messages", headers={}, body=_bytes({**MSG, "max_tokens": 0}), subset=None)
    assert "error" in json.loads(info.value.body()) and not info.value.anthropic
    # later refusals on /v1/messages: Anthropic's shape
    for body in ({**MSG, "system": None, "messages": []}, {**MSG, "cache_salt": "a/b"}):
        with pytest.raises(errors.BadRequest) as info:
            await d.route(path="/v1/messages", headers={}, body=_bytes(body), subset=None)
        assert json.loads(info.value.body())["type"] == "error"
    # the render route answers in OpenAI's shape throughout
    with pytest.raises(errors.BadRequest) as info:
        await d.route(
            path="/v1/messages/render",
            headers={},
            body=_bytes({**MSG, "messages": [], "system": None}),
            subset=None,
        )
    assert not info.value.anthropic


async def test_generate_ids_are_the_prompt(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    body = {"model": "m", "token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 4}}
    request, scored = await d.tokenize(path="/inference/v1/generate", headers={}, body=_bytes(body))
    assert request.token_ids == [5, 6, 7] and scored


# --- whose tokenizer: the stand-in, the model's own, the pods' /render ---------------------------

CHINESE = ("分布式系统中的请求路由需要考虑缓存命中率与负载均衡之间的权衡。" * 14)[:408]  # the length


def _limited(
    tokenizers: Tokenizers, *, renderer: Renderer | None = None, pods: list[str] | None = None
) -> Director:
    ds = Datastore()
    specs = [
        EndpointSpec(name=p, address=p.split(":")[0], port=int(p.split(":")[1]))
        for p in pods or ["10.0.0.1:8000"]
    ]
    ds.sync("t", specs)
    for ep in ds.endpoints():
        ds.set_model_limits(ep, {"m": 1024})  # what the pods list on /v1/models
    handle = Handle(datastore=ds, kv_index=BlockIndex())
    cfg = sched_config.load_config(None, handle)
    return Director(
        datastore=ds,
        scheduler=cfg.scheduler,
        tokenizer=tokenizers,
        context_limits=ContextLimits(from_pods=ds.max_model_len),
        renderer=renderer,
    )


async def test_a_stand_in_tokenizer_never_enforces_the_context_length() -> None:
    body = _bytes({"model": "m", "messages": [{"role": "user", "content": CHINESE[:408]}], "max_tokens": 1})
    stand_in = Tokenizers(workers=1)
    stand_in.use_shipped_default()  # nothing named: epp-tiny stands in
    try:
        request, _ = await _limited(stand_in).tokenize(path="/v1/chat/completions", headers={}, body=body)
        assert request.token_ids is not None and len(request.token_ids) > 1024  # epp-tiny's count
    finally:
        stand_in.close()
    named = Tokenizers(default=load_shipped(), workers=1)  # the same files, named as the model's
    try:
        with pytest.raises(errors.BadRequest, match="maximum context length is 1024"):
            await _limited(named).tokenize(path="/v1/chat/completions", headers={}, body=body)
    finally:
        named.close()


async def test_models_without_a_local_tokenizer_are_rendered_by_the_pods() -> None:
    sim = await start_sim_server("127.0.0.1", 0, config=SimConfig(time_scale=0.001))
    pod = bound_address(sim)
    renderer = Renderer({"": RenderSpec()}, lambda: [pod])
    stand_in = Tokenizers(workers=1)
    stand_in.use_shipped_default()
    chat = {"model": "m", "messages": [{"role": "user", "content": CHINESE[:40]}]}
    try:
        d = _limited(stand_in, renderer=renderer, pods=[pod])
        ctx = await d.route(path="/v1/chat/completions", headers={}, body=_bytes(chat), subset=None)
        assert ctx.request.token_ids == await sim_state(sim).prompt_token_ids(
            ctx.request, body=chat, add_special_tokens=False
        )
        d.finish(ctx, complete=True)
        assert renderer.outcomes["rendered"] == 1
        await sim.cleanup()  # the pod is gone: routed without ids, on load
        ctx = await d.route(
            path="/v1/chat/completions", headers={}, body=_bytes({**chat, "n": 2}), subset=None
        )
        assert ctx.request.token_ids is None and renderer.outcomes["error"] == 1
        d.finish(ctx, complete=True)
    finally:
        await renderer.close()
        stand_in.close()
        await sim.cleanup()
