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
from epp.tokenize.anthropic import RequestModelError
from epp.tokenize.chat import ChatTemplateError

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


def add_routes(app: web.Application, hooks: Hooks) -> None:
    for path in RENDER_ROUTES:
        app.router.add_post(path, _render(hooks))
    app.router.add_post("/v1/messages/count_tokens", _count_tokens(hooks))
    app.router.add_get("/version", _version)


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": VLLM_VERSION})


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
            return web.json_response(answers)
        return web.json_response(answers[0])

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
        return web.json_response({"input_tokens": n, "context_management": {"original_input_tokens": n}})

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
