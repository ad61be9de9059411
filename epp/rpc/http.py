"""The HTTP JSON twin of the gRPC API, on --metrics-port:

- `POST /debug/score` takes an OpenAI request body (path from `?path=`, default by body shape:
  `messages` -> chat, else completions) and answers the `ExplainResponse` fields as JSON.
- `GET /debug/endpoints` answers `ListEndpointsResponse` as JSON.
- `GET /debug/flow-control` answers flow control's state: queued requests and bytes per band and
  flow (the first 100 flows of a band), saturation, why dispatch is halted, outcomes so far
  (`{"enabled": false}` without the flowControl feature gate).
- `POST /debug/tokenize` takes an OpenAI request body (path as for /debug/score) and answers
  `{"model": ..., "token_ids": [...] | null, "count": n, "scored": bool}`: the token ids epp
  computes for it (null: none, e.g. no tokenizer for the model), and whether the configured
  plugins score them (when none consumes them, routing skips tokenizing).

The routes exist only with `epp serve --enable-debug-api`: they take request bodies from
whoever reaches the metrics port (0.0.0.0 by default) and run the tokenizer and the scheduler
for them. Off (the default), every /debug path answers 404 saying how to turn them on.
"""

from __future__ import annotations

from aiohttp import web

from epp.api import errors
from epp.requestcontrol.director import Director
from epp.rpc import explain


async def _openai_request(request: web.Request) -> tuple[str, dict[str, str], bytes]:
    """(API path, lower-cased headers, body) of a debug call carrying an OpenAI body: the path from
    `?path=`, else chat when the body has "messages", else completions."""
    body = await request.read()
    guess = "/v1/chat/completions" if b'"messages"' in body else "/v1/completions"
    path = request.query.get("path") or guess
    return path, {k.lower(): v for k, v in request.headers.items()}, body


def _error(exc: errors.RequestError) -> web.Response:
    body = exc.body()
    return web.Response(status=exc.status, body=body, content_type="application/json")


DISABLED = "debug API disabled: start epp serve with --enable-debug-api to use /debug/*\n"


async def _disabled(_: web.Request) -> web.Response:
    return web.Response(status=404, text=DISABLED)


def add_routes(app: web.Application, director: Director, *, enabled: bool = True) -> None:
    """The /debug routes on `app`; with `enabled` false, a 404 that names the flag on /debug/*."""
    if not enabled:
        app.router.add_route("*", "/debug/{rest:.*}", _disabled)
        return

    async def score(request: web.Request) -> web.Response:
        path, headers, body = await _openai_request(request)
        try:
            payload = await explain.explain(director, path=path, headers=headers, body=body)
        except errors.RequestError as exc:
            return _error(exc)
        return web.json_response(payload)

    async def tokenize(request: web.Request) -> web.Response:
        path, headers, body = await _openai_request(request)
        try:
            req, scored = await director.tokenize(path=path, headers=headers, body=body)
        except errors.RequestError as exc:
            return _error(exc)
        ids = req.token_ids
        return web.json_response(
            {"model": req.target_model, "token_ids": ids, "count": len(ids or ()), "scored": scored}
        )

    async def endpoints(_: web.Request) -> web.Response:
        return web.json_response(explain.list_endpoints(director.datastore))

    async def flow_control(_: web.Request) -> web.Response:
        flow = director.flow_control
        if flow is None:
            return web.json_response({"enabled": False})
        return web.json_response({"enabled": True, **flow.snapshot()})

    app.router.add_post("/debug/score", score)
    app.router.add_post("/debug/tokenize", tokenize)
    app.router.add_get("/debug/endpoints", endpoints)
    app.router.add_get("/debug/flow-control", flow_control)
