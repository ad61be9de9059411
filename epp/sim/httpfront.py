"""What vLLM's HTTP stack (uvicorn and FastAPI) answers where aiohttp, which serves the simulator,
would answer otherwise: the bytes a peer router or a client sees besides the routes themselves.

Checked against a real vLLM 0.32 (the CPU build) with the same requests
(docs/simulator.md#the-routes-against-vllm-032):

- JSON bodies are compact and typed `application/json` with no charset, as FastAPI's
  `JSONResponse` writes them (`json_response`).
- A path no route serves is 404 `{"detail": "Not Found"}`, a method a route does not take 405
  `{"detail": "Method Not Allowed"}`: FastAPI's answers, where aiohttp writes plain text
  (`fastapi_errors`).
- Bytes that are not HTTP/1.1 (sglang-router opens an HTTP/2 prior-knowledge connection to every
  worker, `PRI * HTTP/2.0`, to tell gRPC workers from HTTP ones) get a 400 and the connection
  closed, as from uvicorn, and one WARNING line, uvicorn's "Invalid HTTP request received.", not
  aiohttp's ERROR with a traceback (`server_logger`). The 400's body is aiohttp's.
- With API keys (vLLM's --api-key), a request under /v1, /v2, /inference or /cohere (any method
  but OPTIONS, any path, served or not) without `Authorization: Bearer <a key>` is 401
  `{"error":"Unauthorized"}`; /health, /metrics and the rest stay open (`authenticate`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware

INVALID_REQUEST = "Invalid HTTP request received."  # uvicorn's words, at WARNING


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """`data` as FastAPI's JSONResponse writes it."""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")  # vLLM's, a plain prefix match


def authenticate(keys: tuple[str, ...]) -> Middleware:
    """vLLM's API-key check, for the paths it guards. Digests compared in constant time, as vLLM
    does; a scheme other than Bearer (any case) fails."""
    digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and request.path.startswith(GUARDED_PREFIXES):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            given = hashlib.sha256(token.encode()).digest()
            if scheme.lower() != "bearer" or not any(hmac.compare_digest(given, d) for d in digests):
                return json_response({"error": "Unauthorized"}, 401)
        return await handler(request)

    return check


@web.middleware
async def fastapi_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """404 and 405 as FastAPI answers them (JSON `detail`), for paths and methods no route takes."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        allow = {"allow": ", ".join(sorted(exc.allowed_methods))}
        return json_response({"detail": "Method Not Allowed"}, 405, headers=allow)
    except web.HTTPNotFound:
        return json_response({"detail": "Not Found"}, 404)


class _UvicornWords(logging.Filter):
    """Rewrites aiohttp's "Error handling request" record for bytes that do not parse as HTTP
    into uvicorn's one-line warning (no traceback); other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = INVALID_REQUEST, ()
            record.exc_info = record.exc_text = None
        return True


def server_logger() -> logging.Logger:
    """The logger for the simulator's aiohttp request handlers (`AppRunner(logger=...)`)."""
    logger = logging.getLogger("epp.sim.http")
    if not any(isinstance(f, _UvicornWords) for f in logger.filters):
        logger.addFilter(_UvicornWords())
    return logger
