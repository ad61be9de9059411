"""Errors that become an HTTP answer to the client (an ext-proc ImmediateResponse).

    RequestError(status, reason)
      ├── BadRequest           400  malformed JSON, missing model / prompt / messages
      ├── RequestTimeout       408  body not complete within --request-body-timeout
      ├── PayloadTooLarge      413  body over --max-body-bytes
      ├── NoCapacity           429  every endpoint filtered out, or a sheddable request shed
      └── ServiceUnavailable   503  no ready endpoint (empty pool, subset hint matched nothing)

The reason is one line, safe to show to the client; it is also logged. `headers` are added to
the answer (flow control's `x-llm-d-request-dropped-reason`). The body is OpenAI's error shape,
or Anthropic's (`anthropic`) where vLLM answers the route in it: /v1/messages and count_tokens,
for everything but its request model's validation (FastAPI's handler answers that in OpenAI's
shape on every route).
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


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def error_body(status: int, reason: str, *, anthropic: bool = False) -> bytes:
    """OpenAI's error shape (or Anthropic's), so the API's clients surface the reason; one line
    of JSON."""
    if anthropic:
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return _encode({"type": "error", "error": {"type": kind, "message": reason}})
    return _encode({"error": {"message": reason, "type": _ERROR_TYPES.get(status, "error"), "code": status}})


class RequestError(Exception):
    status: int = 500

    def __init__(self, reason: str, *, validation: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.headers: dict[str, str] = {}
        # vLLM's request model refused it: OpenAI's shape on every route (see the module doc)
        self.validation = validation
        self.anthropic = False  # answered in Anthropic's shape (set by the director per route)

    def body(self) -> bytes:
        return error_body(self.status, self.reason, anthropic=self.anthropic)


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


def one_line(text: str) -> str:
    """Reasons go into an HTTP body and a log line: collapse any line breaks and runs of spaces."""
    return " ".join(text.split())
