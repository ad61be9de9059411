"""Errors that become an HTTP answer to the client (an ext-proc ImmediateResponse).

    RequestError(status, reason)
      ├── BadRequest           400  malformed JSON, missing model / prompt / messages
      ├── PayloadTooLarge      413  body over --max-body-bytes
      ├── NoCapacity           429  every endpoint filtered out, or a sheddable request shed
      └── ServiceUnavailable   503  no ready endpoint (empty pool, subset hint matched nothing)

The reason is one line, safe to show to the client; it is also logged.
"""

from __future__ import annotations


class RequestError(Exception):
    status: int = 500

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadRequest(RequestError):
    status = 400


class PayloadTooLarge(RequestError):
    status = 413


class NoCapacity(RequestError):
    status = 429


class ServiceUnavailable(RequestError):
    status = 503
