"""Errors that become an HTTP answer to the client (an ext-proc ImmediateResponse).

    RequestError(status, reason)
      ├── BadRequest           400  malformed JSON, missing model / prompt / messages
      ├── RequestTimeout       408  body not complete within --request-body-timeout
      ├── PayloadTooLarge      413  body over --max-body-bytes
      ├── NoCapacity           429  every endpoint filtered out, or a sheddable request shed
      └── ServiceUnavailable   503  no ready endpoint (empty pool, subset hint matched nothing)

The reason is one line, safe to show to the client; it is also logged. `headers` are added to
the answer (flow control's `x-llm-d-request-dropped-reason`).
"""

from __future__ import annotations

import msgspec

_ERROR_TYPES = {
    400: "invalid_request_error",
    408: "timeout",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "internal_error",
    503: "service_unavailable",
}
_encode = msgspec.json.Encoder().encode


def error_body(status: int, reason: str) -> bytes:
    """OpenAI's error shape, so OpenAI clients surface the reason; one line of JSON."""
    return _encode({"error": {"message": reason, "type": _ERROR_TYPES.get(status, "error"), "code": status}})


class RequestError(Exception):
    status: int = 500

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.headers: dict[str, str] = {}


class BadRequest(RequestError):
    status = 400


class RequestTimeout(RequestError):
    status = 408


class PayloadTooLarge(RequestError):
    status = 413


class NoCapacity(RequestError):
    status = 429


class ServiceUnavailable(RequestError):
    status = 503
