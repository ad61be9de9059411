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
from epp.api.routes import Parser, Parsers
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.kvcache.index import BlockIndex
from epp.requestcontrol.director import Director, DirectorSettings
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.tokenize.chat import encode_chat
from epp.tokenize.registry import Tokenizers
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
