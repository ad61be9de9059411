"""The simulated vLLM's routes beyond OpenAI's: what vLLM 0.32 serves besides them, so that epp's
parsers, its render-from-the-pods token producer and the e2e tests meet the same surface as with
a real vLLM.

- `POST /v1/{chat/completions,completions,messages,responses}/render`: vLLM's render routes
  (vLLM serves them with `--enable-scale-out`; the simulator always does): the request rendered
  and tokenized as its route renders it - the ids /tokenize gives and the engine would run -
  answered as vLLM's `GenerateRequest` (`{"request_id", "token_ids", "sampling_params", ...}`; a
  list of them, one per prompt, for completions), or refused (400) as the route refuses it;
- `POST /v1/messages/count_tokens`: `{"input_tokens": n}`;
- `GET /version`: `{"version": VLLM_VERSION}`;
- the answers of `/v1/messages` (Anthropic's message and its SSE events, usage with the cached
  tokens as `cache_read_input_tokens`) and `/inference/v1/generate` (the generated ids, with the
  prompt's when `return_token_ids` is set), which `epp.sim.server` serves through the engine.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from epp.api import context_length
from epp.api.errors import BadRequest
from epp.api.requests import Api, InferenceRequest
from epp.sim.httpfront import json_response
from epp.tokenize.anthropic_request import RequestModelError
from epp.tokenize.chat import ChatTemplateError
from epp.tokenize.tokenizer import Tokenizer

if TYPE_CHECKING:
    from epp.sim.engine import SimConfig, SimRequest, SimState

VLLM_VERSION = "0.32.0"  # the vLLM whose API the simulator answers
RENDER_ROUTES = (
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/messages/render",
    "/v1/responses/render",
)
ID_PREFIX = {"messages": "msg_", "generate": "generate-tokens-"}


@dataclasses.dataclass(frozen=True)
class Hooks:
    """What the server lends these routes: its state key, parser, context rules and error answer."""

    state: web.AppKey[SimState]
    parse: Callable[[str, bytes, SimConfig], tuple[dict[str, Any], InferenceRequest]]
    within_context: Callable[[SimState, InferenceRequest, list[int]], Awaitable[list[int]]]
    error: Callable[..., web.Response]
    unknown_model: Callable[[SimConfig, str], web.Response | None]


def add_routes(app: web.Application, hooks: Hooks, *, scale_out: bool) -> None:
    """Serve these routes on `app`; `scale_out`: vLLM's --enable-scale-out (without it the render
    routes and /inference/v1/generate answer 403, as vLLM's)."""
    for path in RENDER_ROUTES:
        app.router.add_post(path, _render(hooks) if scale_out else _scale_out_disabled)
    if not scale_out:
        app.router.add_post("/inference/v1/generate", _scale_out_disabled)
    app.router.add_post("/v1/messages/count_tokens", _count_tokens(hooks))
    app.router.add_post("/tokenize", _tokenize(hooks))
    app.router.add_post("/detokenize", _detokenize(hooks))
    app.router.add_get("/version", _version)
    app.router.add_get("/load", _load(hooks))
    app.router.add_get("/kv_event_sources", _kv_event_sources(hooks))
    # SageMaker's health probe, which vLLM serves beside /health (GET and POST).
    app.router.add_route("GET", "/ping", _ping)
    app.router.add_route("POST", "/ping", _ping)


async def _version(request: web.Request) -> web.Response:
    return json_response({"version": VLLM_VERSION})


async def _scale_out_disabled(request: web.Request) -> web.Response:
    message = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
    error = {"message": message, "type": "PermissionDeniedError", "param": None, "code": 403}
    return json_response({"error": error}, 403)


async def _ping(request: web.Request) -> web.Response:
    return web.Response(status=200)


def _load(hooks: Hooks) -> Callable[[web.Request], Awaitable[web.Response]]:
    """vLLM's GET /load: `{"server_load": n}`, the requests in flight on its inference routes with
    `--enable-server-load-tracking`, else always 0 (vLLM counts nothing without the flag)."""

    async def handler(request: web.Request) -> web.Response:
        state = request.app[hooks.state]
        load = state.in_flight if state.config.server_load_tracking else 0
        return json_response({"server_load": load})

    return handler


def _kv_event_sources(hooks: Hooks) -> Callable[[web.Request], Awaitable[web.Response]]:
    """vLLM's GET /kv_event_sources: the KV-event publisher's config per data-parallel rank (the
    one rank "0"), endpoints as configured (a bound `tcp://*:0` resolved to its port); `{}`
    without events, as a vLLM whose engine publishes none."""

    async def handler(request: web.Request) -> web.Response:
        state = request.app[hooks.state]
        if state.publisher is None:
            return json_response({})
        source = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": state.kv_endpoint,
            "replay_endpoint": state.kv_replay_endpoint,
            # vLLM's defaults, which the simulator's publisher keeps (its queue is unbounded).
            "buffer_steps": 10_000,
            "hwm": 100_000,
            "max_queue_size": 100_000,
            "topic": state.publisher.topic,
        }
        return json_response({"0": source})

    return handler


def _json_object(raw: bytes) -> dict[str, Any]:
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    return body


def _tokenize(hooks: Hooks) -> Callable[[web.Request], Awaitable[web.Response]]:
    """vLLM's POST /tokenize: {"model", "prompt"} or {"model", "messages"}, rendered as the
    inference routes render them (add_special_tokens defaults to true, as they tokenize), with
    each token's string when `return_token_strs` is true."""

    async def handler(request: web.Request) -> web.Response:
        state = request.app[hooks.state]
        try:
            body = _json_object(await request.read())
            special = body.get("add_special_tokens", True)
            if not isinstance(special, bool):
                raise ValueError("'add_special_tokens' must be a boolean")
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            _, parsed = hooks.parse(path, json.dumps(body).encode(), state.config)
        except ValueError as exc:  # the server's _BadRequest is a ValueError
            return hooks.error(400, str(exc))
        unknown = hooks.unknown_model(state.config, parsed.model)
        if unknown is not None:
            return unknown
        try:
            ids = await state.prompt_token_ids(parsed, body=body, add_special_tokens=special)
        except ChatTemplateError as exc:
            return hooks.error(400, str(exc))
        strs = None
        if body.get("return_token_strs") is True:
            backend = _tokenizer(state, parsed.model).backend
            strs = [backend.id_to_token(i) for i in ids]
        limit = state.profile.max_model_len
        return json_response({"count": len(ids), "max_model_len": limit, "tokens": ids, "token_strs": strs})

    return handler


def _tokenizer(state: SimState, model: str) -> Tokenizer:
    found = state.tokenizers.for_model(model)
    assert found is not None  # a default tokenizer serves every model
    return found


def _detokenize(hooks: Hooks) -> Callable[[web.Request], Awaitable[web.Response]]:
    """vLLM's POST /detokenize: `{"model", "tokens"}` -> `{"prompt": text}`, special tokens kept
    and ids outside the vocabulary skipped, as vLLM decodes them."""

    async def handler(request: web.Request) -> web.Response:
        state = request.app[hooks.state]
        try:
            body = _json_object(await request.read())
        except ValueError as exc:
            return hooks.error(400, str(exc))
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
        ):
            return hooks.error(400, "'tokens' must be a list of token ids >= 0", param="body.tokens")
        named = body.get("model")
        model = named if isinstance(named, str) and named else state.config.served_model
        unknown = hooks.unknown_model(state.config, model)
        if unknown is not None:
            return unknown
        text = _tokenizer(state, model).backend.decode(tokens, skip_special_tokens=False)
        return json_response({"prompt": text})

    return handler


async def _prompts(
    hooks: Hooks, state: SimState, path: str, raw: bytes
) -> tuple[dict[str, Any], InferenceRequest, list[list[int]]]:
    """The request parsed and every prompt's ids as its route renders them (context rules
    applied). Raises what the server's parse raises, BadRequest and ChatTemplateError."""
    body, parsed = hooks.parse(path, raw, state.config)
    if parsed.api is Api.COMPLETIONS and (len(parsed.prompt_texts) > 1 or len(parsed.prompt_token_ids) > 1):
        prompts = []
        for i in range(max(len(parsed.prompt_texts), len(parsed.prompt_token_ids))):
            one = dataclasses.replace(
                parsed,
                prompt_texts=parsed.prompt_texts[i : i + 1],
                prompt_token_ids=parsed.prompt_token_ids[i : i + 1],
                token_ids=parsed.prompt_token_ids[i] if parsed.prompt_token_ids else None,
            )
            prompts.append(await _ids(hooks, state, one, body))
        return body, parsed, prompts
    return body, parsed, [await _ids(hooks, state, parsed, body)]


async def _ids(hooks: Hooks, state: SimState, parsed: InferenceRequest, body: Mapping[str, Any]) -> list[int]:
    ids = await state.prompt_token_ids(parsed, body=body, add_special_tokens=parsed.add_special_tokens)
    if context_length.applies(parsed):
        ids = await hooks.within_context(state, parsed, ids)
    if not ids:
        raise BadRequest("No token_ids rendered")
    return ids


def _render(hooks: Hooks) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        state = request.app[hooks.state]
        state.stats.render_requests += 1
        try:
            body, parsed, prompts = await _prompts(hooks, state, request.path, await request.read())
        except (BadRequest, ChatTemplateError, ValueError) as exc:
            state.stats.errors += 1
            return hooks.error(400, getattr(exc, "reason", str(exc)))
        named = body.get("model")
        model = named if isinstance(named, str) else state.config.served_model
        prefix = {Api.CHAT: "chatcmpl-", Api.COMPLETIONS: "cmpl-", Api.MESSAGES: "chatcmpl-"}.get(
            parsed.api, "resp_"
        )
        answers = [
            _generate_request(f"{prefix}{uuid.uuid4().hex[:16]}", ids, model, parsed) for ids in prompts
        ]
        if parsed.api is Api.COMPLETIONS:
            return json_response(answers)
        return json_response(answers[0])

    return handler


def _generate_request(
    request_id: str, ids: list[int], model: str, parsed: InferenceRequest
) -> dict[str, Any]:
    """vLLM's GenerateRequest as its render routes answer it (the fields a router reads)."""
    return {
        "request_id": request_id,
        "token_ids": ids,
        "token_offsets": None,
        "features": None,
        "sampling_params": {"max_tokens": parsed.max_output_tokens},
        "model": model,
        "stream": parsed.stream,
        "cache_salt": parsed.cache_salt,
        "priority": 0,
    }


def _count_tokens(hooks: Hooks) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        state = request.app[hooks.state]
        try:
            _, _, prompts = await _prompts(hooks, state, request.path, await request.read())
        except RequestModelError as exc:  # the request model's: OpenAI's shape on every route
            return hooks.error(400, str(exc))
        except BadRequest as exc:  # the context rules
            return hooks.error(400, exc.reason, anthropic=not exc.validation)
        except ChatTemplateError as exc:
            return hooks.error(400, str(exc), anthropic=True)
        except ValueError as exc:  # the body as parsed, before anything renders it
            return hooks.error(400, str(exc))
        n = len(prompts[0])
        return json_response({"input_tokens": n, "context_management": {"original_input_tokens": n}})

    return handler


# --- answers of /v1/messages and /inference/v1/generate --------------------------------------------


def complete_body(req: SimRequest, text: str) -> dict[str, Any]:
    if req.api == "messages":
        return {
            "id": f"msg_{req.id}",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "model": req.model,
            "stop_reason": "max_tokens",
            "usage": req.usage(),
        }
    body: dict[str, Any] = {
        "request_id": f"generate-tokens-{req.id}",
        "model": req.model,
        "created": req.created,
        "choices": [{"index": 0, "token_ids": req.output_ids(), "finish_reason": "length"}],
        "usage": req.usage(),
    }
    if req.body.get("return_token_ids") is True:
        body["prompt_token_ids"] = req.token_ids
    return body


def _event(payload: Mapping[str, Any], event: str = "") -> bytes:
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def stream(resp: web.StreamResponse, req: SimRequest, started: float) -> None:
    """The SSE answer of a streamed /v1/messages (Anthropic's events) or generate request."""
    first = True
    sent = 0
    async for tok in req.decode():
        if first:
            req.state.ttft.observe(time.monotonic() - started)
            first = False
            if req.api == "messages":
                start: dict[str, Any] = {"id": f"msg_{req.id}", "type": "message", "role": "assistant",
                                         "content": [], "model": req.model,
                                         "usage": {**req.usage(), "output_tokens": 0}}  # fmt: skip
                await resp.write(_event({"type": "message_start", "message": start}, "message_start"))
                block = {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                }
                await resp.write(_event(block, "content_block_start"))
        if req.api == "messages":
            delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": tok}}
            await resp.write(_event(delta, "content_block_delta"))
        else:
            ids = req.output_ids()[sent:]
            sent += len(ids)
            chunk: dict[str, Any] = {
                "request_id": f"generate-tokens-{req.id}",
                "choices": [{"index": 0, "token_ids": ids}],
            }
            if sent == len(ids) and req.body.get("return_token_ids") is True:
                chunk["prompt_token_ids"] = req.token_ids
            await resp.write(_event(chunk))
    if req.api == "messages":
        await resp.write(_event({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        done = {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": req.usage()}
        await resp.write(_event(done, "message_delta"))
        await resp.write(_event({"type": "message_stop"}, "message_stop"))
    else:
        final = {"request_id": f"generate-tokens-{req.id}", "choices": [], "usage": req.usage()}
        await resp.write(_event(final))
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
