"""A simulated vLLM replica over HTTP (aiohttp): vLLM's OpenAI-compatible routes and /metrics.

The behaviour behind the routes (the step engine in real time: batching, prefix cache, KV events,
preemption, the Prometheus text) is `epp.sim.engine`'s; this module parses requests, writes JSON
and SSE responses the way vLLM does (errors as vLLM's `{"error": {message, type, param, code}}`;
what vLLM refuses for its context length is a 400 with its message, `epp.api.context_length`),
and starts and addresses the server. A client that disconnects aborts its request in the engine.

Every response carries `x-sim-server` (this replica's name, by default `host:port`) and
`x-sim-received-destination` (the `x-gateway-destination-endpoint` request header it got, or ""),
so a test can tell which backend served and what the gateway told it. GET /sim/stats returns
counters as JSON (`models`: the model names the inference requests carried, as received);
POST /sim/reset clears them and the cache (even while requests run).

Requests are parsed by epp's own parser (`epp.api.requests.parse_request`), so what epp accepts
and how it renders a prompt for tokenizing is what this server does. Beside the OpenAI routes it
serves vLLM 0.32's others (`epp.sim.apis`): Anthropic's /v1/messages and count_tokens, the
tokens-in /inference/v1/generate, the four /render routes (the ids /tokenize gives), GET /version,
POST /tokenize and POST /reset_prefix_cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from array import array
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from epp.api import context_length
from epp.api.errors import BadRequest
from epp.api.requests import Api, InferenceRequest, parse_request
from epp.sim import apis
from epp.sim.core import RequestRejected
from epp.sim.engine import SimConfig, SimRequest, SimState
from epp.sim.httpfront import authenticate, fastapi_errors, json_response, server_logger
from epp.sim.metrics_page import as_vllm_serves, render_metrics
from epp.tokenize.anthropic_request import RequestModelError
from epp.tokenize.chat import ChatTemplateError

DESTINATION_HEADER = "x-gateway-destination-endpoint"
SERVER_HEADER = "x-sim-server"
RECEIVED_DESTINATION_HEADER = "x-sim-received-destination"


SIM_STATE = web.AppKey("sim_state", SimState)


# --- request parsing -------------------------------------------------------------------------------


class _BadRequest(ValueError):
    pass


def _parse(path: str, raw: bytes, config: SimConfig) -> tuple[dict[str, Any], InferenceRequest]:
    """The body as JSON, and as epp parses it (so the prompt is rendered as epp renders it)."""
    try:
        body = json.loads(raw)
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _BadRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    if "model" not in body and not _anthropic(path):
        # vLLM serves its model when none is named (not on Anthropic's routes, which need one).
        body["model"] = config.served_model
        raw = json.dumps(body).encode()
    # No headers: a model-name rewrite is the gateway's business, the body is what vLLM sees.
    try:
        req = parse_request(path=path, headers={}, body=raw, request_id="")
    except BadRequest as exc:
        raise _BadRequest(exc.reason) from None
    return body, req


def _anthropic(path: str) -> bool:
    return "/messages" in path


async def _within_context(state: SimState, parsed: InferenceRequest, ids: list[int]) -> list[int]:
    """vLLM 0.32's context-length rules (`epp.api.context_length`): the prompt as truncated, or
    BadRequest with vLLM's message."""
    limit = state.profile.max_model_len
    context_length.check_parameters(parsed, limit)
    if parsed.prompt_token_ids:
        return context_length.check_given_ids(parsed.prompt_token_ids, parsed, limit)
    specials = (0, 0)
    if (
        parsed.truncate_prompt_tokens is not None
        and parsed.truncation_side is None
        and parsed.add_special_tokens
        and parsed.api is Api.COMPLETIONS  # a chat prompt comes from its template, without specials
    ):
        encode = state.tokenizers.encode
        specials = await context_length.text_specials(
            lambda text, add: encode(parsed.model, text, add_special_tokens=add)
        )
    ids = context_length.truncate(ids, parsed, limit, specials=specials)
    context_length.check_prompt(len(ids), parsed, limit, from_text=True)
    return ids


def _check_token_ids(ids: list[int]) -> None:
    if not ids:
        raise _BadRequest("the prompt cannot be empty")
    if min(ids) < 0 or max(ids) >= 1 << 63:
        raise _BadRequest("token ids must be in [0, 2**63)")


def _output_token_ids(body: Mapping[str, Any]) -> list[int] | None:
    """The simulator's extension `sim_output_token_ids`: the tokens to generate instead of filler
    (vLLM has no such field). A benchmark's multi-turn chat sends the reply its next turn will
    carry, so that turn can hit the reply's blocks as it would on a real model."""
    ids = body.get("sim_output_token_ids")
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise _BadRequest("'sim_output_token_ids' must be a list of token ids")
    if ids:
        _check_token_ids(ids)
    return ids


def _max_tokens(
    api: str, body: Mapping[str, Any], state: SimState, prompt_tokens: int, parsed: InferenceRequest
) -> int:
    """The tokens to generate: the request's limit (capped at `max_output_tokens`), else the
    default, cut to what fits in `max_model_len` as vLLM defaults it. An embedding runs as one."""
    if api == "embeddings":
        return 1
    cfg = state.config
    room = state.profile.max_model_len - prompt_tokens
    if api in ("messages", "generate"):  # budgets epp's parser has read as vLLM reads them
        budget = parsed.max_output_tokens
        return max(1, min(budget or cfg.default_max_tokens, cfg.max_output_tokens, room))
    keys = ("max_output_tokens",) if api == "responses" else ("max_completion_tokens", "max_tokens")
    for key in keys:
        value = body.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise _BadRequest(f"'{key}' must be a positive integer")
            if value < 1:
                raise _BadRequest(f"max_tokens must be at least 1, got {value}.")  # vLLM's words
            # vLLM clamps the budget to what the context has left, it does not refuse it.
            return min(value, cfg.max_output_tokens, state.profile.max_model_len - prompt_tokens)
    return max(1, min(cfg.default_max_tokens, state.profile.max_model_len - prompt_tokens))


def _error(
    status: int,
    message: str,
    err_type: str = "BadRequestError",
    *,
    anthropic: bool = False,
    param: str | None = None,
) -> web.Response:
    """vLLM's error answer (`ErrorResponse`: the error nested under "error", code = the status),
    or, past request validation on its Anthropic routes, Anthropic's (`{"type": "error", ...}`)."""
    if anthropic:
        error: dict[str, Any] = {"type": "error", "error": {"type": err_type, "message": message}}
        return json_response(error, status=status)
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return json_response(body, status=status)


def _unknown_model(config: SimConfig, model: str) -> web.Response | None:
    """vLLM's 404 for a model it does not serve (with `strict_models`), else None."""
    served = (config.served_model, *config.lora_adapters)
    if not config.strict_models or model in served:
        return None
    message = f"The model `{model}` does not exist. Valid aliases: {', '.join(served)}."
    return _error(404, message, "NotFoundError", param="model")


# --- handlers --------------------------------------------------------------------------------------


def _sse(payload: Mapping[str, Any], event: str = "") -> bytes:
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def _inference(request: web.Request, api: str) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    cfg = state.config
    state.stats.inference_requests += 1
    if cfg.fault_reset:
        state.stats.faults += 1
        if request.transport is not None:
            request.transport.abort()  # the proxy sees a reset before any response byte
        raise asyncio.CancelledError
    if cfg.fault_status:
        state.stats.faults += 1
        return _error(cfg.fault_status, "injected fault", "SimulatedFault")
    try:
        body, parsed = _parse(request.path, await request.read(), cfg)
    except _BadRequest as exc:
        state.stats.errors += 1
        return _error(400, str(exc))
    state.stats.models[parsed.model] += 1
    unknown = _unknown_model(cfg, parsed.model)
    if unknown is not None:
        state.stats.errors += 1
        return unknown
    started = time.monotonic()
    try:
        ids = await state.prompt_token_ids(parsed, body=body, add_special_tokens=parsed.add_special_tokens)
        if context_length.applies(parsed):
            ids = await _within_context(state, parsed, ids)
        _check_token_ids(ids)
        n_out = _max_tokens(api, body, state, len(ids), parsed)
        out_ids = _output_token_ids(body)
    except (_BadRequest, ChatTemplateError) as exc:
        state.stats.errors += 1
        return _error(400, str(exc), anthropic=api == "messages" and not isinstance(exc, RequestModelError))
    except BadRequest as exc:
        state.stats.errors += 1
        return _error(400, exc.reason, anthropic=api == "messages")
    # P/D (NixlConnector's protocol): a prefill for a remote decode keeps its KV for the pull; a
    # decode with a remote prefill pulls it first (the transfer's time), or fails with a 500 as
    # vLLM does when the prefill pod is gone.
    params = body.get("kv_transfer_params")
    remote = 0
    if isinstance(params, dict) and params.get("do_remote_prefill") is True:
        transfer = state.pull(str(params.get("remote_engine_id")), str(params.get("remote_request_id")), ids)
        if transfer is None:
            state.stats.errors += 1
            return _error(500, "Internal server error", "InternalServerError")
        await state.delay(transfer)
        remote = len(ids)
    req = SimRequest(
        state,
        api,
        body,
        ids,
        n_out,
        cache_salt=parsed.cache_salt,
        output_token_ids=out_ids,
        remote_tokens=remote,
    )
    if isinstance(params, dict) and params.get("do_remote_decode") is True:
        host, _, port = request.host.rpartition(":")
        req.kv_transfer_params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [
                list(range(1, (len(ids) + state.profile.block_size - 1) // state.profile.block_size + 1))
            ],
            "remote_engine_id": state.engine_id,
            "remote_request_id": req.id,
            "remote_host": host,
            "remote_port": int(port) if port.isdigit() else 0,
            "remote_num_tokens": len(ids),
            "tp_size": 1,
        }

    await state.delay(cfg.base_latency)
    try:
        state.submit(req)
    except RequestRejected as exc:
        state.stats.errors += 1
        return _error(400, str(exc))
    try:
        if body.get("stream") is True and api != "embeddings":
            resp = await _stream(request, req, started)
        else:
            resp = await _complete(req, started)
    except (asyncio.CancelledError, ConnectionResetError):
        # The client (or the proxy on its behalf) went away: vLLM aborts the request.
        state.stats.aborted += 1
        raise
    finally:
        state.cancel(req)  # a no-op once it finished
    state.stats.completed += 1
    state.stats.prompt_tokens += req.prompt_tokens
    state.stats.cached_tokens += req.cached_tokens
    state.stats.generation_tokens += req.generated
    state.success["stop" if api == "embeddings" else "length"] += 1
    state.e2e.observe(time.monotonic() - started)
    return resp


async def _complete(req: SimRequest, started: float) -> web.Response:
    tokens: list[str] = []
    async for tok in req.decode():
        if not tokens:
            req.state.ttft.observe(time.monotonic() - started)
        tokens.append(tok)
    text = "".join(tokens)
    head = {"id": f"{_ID_PREFIX[req.api]}{req.id}", "created": req.created, "model": req.model}
    if req.api == "embeddings":
        digest = hashlib.blake2b(array("q", req.token_ids).tobytes(), digest_size=64).digest()
        vector = [round((digest[i % 64] - 127.5) / 127.5, 6) for i in range(req.state.config.embedding_dims)]
        payload: dict[str, Any] = {
            "object": "list",
            "model": req.model,
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "usage": {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens},
        }
    elif req.api == "chat":
        payload = head | {
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": req.usage(),
        }
    elif req.api == "completions":
        payload = head | {
            "object": "text_completion",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
            "usage": req.usage(),
        }
    elif req.api == "responses":
        payload = _response_object(req, text, "completed")
    else:
        payload = apis.complete_body(req, text)
    if req.kv_transfer_params is not None:
        req.state.keep_for_decode(req.id, req.token_ids)
        payload["kv_transfer_params"] = req.kv_transfer_params
    return json_response(payload)


_ID_PREFIX = {"chat": "chatcmpl-", "completions": "cmpl-", "responses": "resp_", "embeddings": "embd-"}
_ID_PREFIX.update(apis.ID_PREFIX)


def _response_object(req: SimRequest, text: str, status: str) -> dict[str, Any]:
    return {
        "id": f"resp_{req.id}",
        "object": "response",
        "created_at": req.created,
        "model": req.model,
        "status": status,
        "output": [
            {
                "type": "message",
                "id": f"msg_{req.id}",
                "role": "assistant",
                "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": req.usage() if status == "completed" else None,
    }


async def _stream(request: web.Request, req: SimRequest, started: float) -> web.StreamResponse:
    # Headers go out at once (vLLM's StreamingResponse starts before its generator runs); the first
    # data chunk (the chat role chunk, response.created) waits for the first token, as vLLM's
    # stream generators write it on their first output: a client's TTFT is the engine's.
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    if req.api in apis.ID_PREFIX:
        await apis.stream(resp, req, started)
        return resp
    head = {"id": f"{_ID_PREFIX[req.api]}{req.id}", "created": req.created, "model": req.model}
    opts = req.body.get("stream_options")
    include_usage = isinstance(opts, Mapping) and opts.get("include_usage") is True

    if req.api == "responses":
        parts: list[str] = []
        async for tok in req.decode():
            if not parts:
                req.state.ttft.observe(time.monotonic() - started)
                created = {"type": "response.created", "response": _response_object(req, "", "in_progress")}
                await resp.write(_sse(created, "response.created"))
            parts.append(tok)
            delta = {
                "type": "response.output_text.delta",
                "item_id": f"msg_{req.id}",
                "output_index": 0,
                "content_index": 0,
                "delta": tok,
            }
            await resp.write(_sse(delta, "response.output_text.delta"))
        completed = {
            "type": "response.completed",
            "response": _response_object(req, "".join(parts), "completed"),
        }
        await resp.write(_sse(completed, "response.completed"))
        await resp.write_eof()
        return resp

    chat = req.api == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"

    def choice(delta: str | None, finish: str | None) -> dict[str, Any]:
        if chat:
            d: dict[str, Any] = {} if delta is None else {"content": delta}
            return {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}

    first_token = True
    async for tok in req.decode():
        if first_token:
            req.state.ttft.observe(time.monotonic() - started)
            first_token = False
            if chat:
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                await resp.write(_sse(head | {"object": obj, "choices": [role | {"finish_reason": None}]}))
        await resp.write(_sse(head | {"object": obj, "choices": [choice(tok, None)]}))
    await resp.write(_sse(head | {"object": obj, "choices": [choice(None, "length")]}))
    if include_usage:
        await resp.write(_sse(head | {"object": obj, "choices": [], "usage": req.usage()}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _route(api: str) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        state = request.app[SIM_STATE]
        state.in_flight += 1  # vLLM's server load: from the request's arrival to its answer's end
        try:
            return await _inference(request, api)
        finally:
            state.in_flight -= 1

    return handler


def _model_card(name: str, created: int, *, parent: str | None, max_model_len: int | None) -> dict[str, Any]:
    """One entry of GET /v1/models, field for field vLLM 0.32's ModelCard (with one
    ModelPermission): `max_model_len` on the base model's card, null on an adapter's, as vLLM."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": name,
        "parent": parent,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


async def _models(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    cfg = state.config
    created = int(time.time())  # vLLM stamps the cards when it answers
    data = [_model_card(cfg.served_model, created, parent=None, max_model_len=state.profile.max_model_len)]
    data += [
        _model_card(name, created, parent=cfg.served_model, max_model_len=None) for name in cfg.lora_adapters
    ]
    return json_response({"object": "list", "data": data})


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _metrics(request: web.Request) -> web.Response:
    text = as_vllm_serves(
        render_metrics(request.app[SIM_STATE]), request.path, request.query.getall("name[]", [])
    )
    return web.Response(
        text=text, content_type="text/plain", charset="utf-8", headers={"X-Content-Type-Options": "nosniff"}
    )


async def _stats(request: web.Request) -> web.Response:
    return json_response(request.app[SIM_STATE].snapshot())


async def _reset(request: web.Request) -> web.Response:
    request.app[SIM_STATE].reset()
    return json_response({"ok": True})


async def _reset_prefix_cache(request: web.Request) -> web.Response:
    # vLLM's dev route: refused (409, as recent vLLM answers) while requests hold blocks, unless
    # ?reset_running_requests=true, which vLLM serves by preempting them.
    force = request.query.get("reset_running_requests", "").lower() == "true"
    if not request.app[SIM_STATE].reset_prefix_cache(force=force):
        return _error(409, "Prefix cache reset failed.", "Conflict")
    return web.Response(status=200)


@web.middleware
async def _count(request: web.Request, handler: Any) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    # Scrapes and probes are not routed traffic: keep them out of the routing counters. So is a
    # model-card read that no gateway routed (a router's discovery: epp reads /v1/models every 30 s).
    discovery = request.path == "/v1/models" and DESTINATION_HEADER not in request.headers
    if (
        not request.path.startswith("/sim/")
        and request.path not in ("/metrics", "/metrics/", "/health")
        and not discovery
    ):
        state.stats.requests += 1
        state.stats.by_path[request.path] += 1
        state.stats.destinations[request.headers.get(DESTINATION_HEADER, "")] += 1
    resp: web.StreamResponse = await handler(request)
    return resp


async def _tag_response(request: web.Request, response: web.StreamResponse) -> None:
    # on_response_prepare runs before headers go out, for plain and streamed responses alike.
    response.headers[SERVER_HEADER] = request.app[SIM_STATE].name
    response.headers[RECEIVED_DESTINATION_HEADER] = request.headers.get(DESTINATION_HEADER, "")


async def _close_state(app: web.Application) -> None:
    await app[SIM_STATE].aclose()


def make_app(config: SimConfig) -> web.Application:
    middlewares: list[Middleware] = [fastapi_errors, _count]
    if config.api_keys:  # outermost, as in vLLM: a 401 before any 404, and not counted as traffic
        middlewares.insert(0, authenticate(config.api_keys))
    app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
    app[SIM_STATE] = SimState(config)
    app.on_response_prepare.append(_tag_response)
    app.on_cleanup.append(_close_state)
    app.router.add_post("/v1/completions", _route("completions"))
    app.router.add_post("/v1/chat/completions", _route("chat"))
    app.router.add_post("/v1/responses", _route("responses"))
    app.router.add_post("/v1/embeddings", _route("embeddings"))
    app.router.add_post("/v1/messages", _route("messages"))
    if config.scale_out:
        app.router.add_post("/inference/v1/generate", _route("generate"))
    hooks = apis.Hooks(SIM_STATE, _parse, _within_context, _error, _unknown_model)
    apis.add_routes(app, hooks, scale_out=config.scale_out)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/reset_prefix_cache", _reset_prefix_cache)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/metrics/", _metrics)
    app.router.add_get("/health", _health)
    app.router.add_get("/sim/stats", _stats)
    app.router.add_post("/sim/reset", _reset)
    return app


async def start_sim_server(
    host: str, port: int, *, config: SimConfig | None = None, shutdown_timeout: float = 60.0
) -> web.AppRunner:
    """Serve one simulated replica on host:port (port 0 = any free port); returns the runner.

    Stop it with `await runner.cleanup()`, which lets requests in flight finish for up to
    `shutdown_timeout` seconds (aiohttp's default 60 s) before cancelling them.
    `sim_state(runner)` gives the live state and `bound_address(runner)` the actual "host:port";
    with `config.kv_events`, the state's `kv_endpoint` / `kv_replay_endpoint` are where its KV
    events are published.
    """
    cfg = config or SimConfig()
    app = make_app(cfg)
    # handler_cancellation: a client disconnect aborts the request, freeing its slot (as vLLM).
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        logger=server_logger(),
        shutdown_timeout=shutdown_timeout,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        state = app[SIM_STATE]
        address = bound_address(runner)
        if not cfg.name:
            state.name = address
        state.start_kv_events(address)
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def sim_state(runner: web.AppRunner) -> SimState:
    return runner.app[SIM_STATE]


def bound_address(runner: web.AppRunner) -> str:
    """'host:port' the runner listens on (the first, if several)."""
    addr = runner.addresses[0]
    host, port = str(addr[0]), int(addr[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
