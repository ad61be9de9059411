"""`epp serve`'s bounds on one request's work and on what all streams hold (the request-limit flags)."""

from __future__ import annotations

import argparse

from epp.flags.types import byte_size, duration, non_negative_int, positive_int


def _json_depth(text: str) -> int:
    value = positive_int(text)
    if value > 512:  # epp.api.limits.MAX_JSON_DEPTH_CAP: well below Python's recursion limit
        raise argparse.ArgumentTypeError(f"must be at most 512: {text!r}")
    return value


def add_request_limit_arguments(p: argparse.ArgumentParser) -> None:
    """epp's own bounds on one request's work and on what all streams hold
    (docs/security.md#request-limits; epp.api.limits, epp.extproc.limits). vLLM has no such limits:
    the defaults sit far above any legitimate request."""
    g = p.add_argument_group("request limits")
    g.add_argument(
        "--max-request-messages",
        type=positive_int,
        default=10_000,
        help="chat messages / Responses input items per request; more are 400 (default 10000)",
    )
    g.add_argument(
        "--max-request-content-parts",
        type=positive_int,
        default=20_000,
        help="content parts per request, all messages together (default 20000)",
    )
    g.add_argument(
        "--max-request-tools", type=positive_int, default=2_000, help="chat tools per request (default 2000)"
    )
    g.add_argument(
        "--max-request-json-depth",
        type=_json_depth,
        default=64,
        help="nesting of arrays and objects in a body, at most 512 (default 64)",
    )
    g.add_argument(
        "--max-buffered-body-bytes",
        type=byte_size,
        default=None,
        help="request-body bytes held across requests until each is routed; past it 503 (default: "
        "sized from the pod's memory limit, at most 1Gi; docs/security.md)",
    )
    g.add_argument(
        "--max-concurrent-streams",
        type=positive_int,
        default=None,
        help="requests in progress at once; more are answered 503 (default: sized from the pod's "
        "memory limit, at most 10000; docs/security.md)",
    )
    g.add_argument(
        "--max-unfinished-bodies-per-connection",
        type=non_negative_int,
        default=16,
        help="request bodies still arriving from one client connection, when the gateway names it "
        "(Envoy's connection.id attribute; the generated full-duplex config sends it); more are "
        "429 (default 16, 0: no bound)",
    )
    g.add_argument(
        "--max-buffered-body-bytes-per-connection",
        type=byte_size,
        default=64 << 20,
        help="request-body bytes those bodies may hold; past it 429 (default 64Mi, 0: no bound)",
    )
    g.add_argument(
        "--request-body-timeout",
        type=duration,
        default=60.0,
        help="from the request headers to the body's end; later 408 (default 60s, 0: none)",
    )
    g.add_argument(
        "--body-parser-processes",
        type=non_negative_int,
        default=1,
        help="processes that parse and render bodies over --body-parser-min-bytes (and chats of "
        "more than 64 messages), so they never hold the event loop; 0: in epp's own (default 1)",
    )
    g.add_argument(
        "--body-parser-min-bytes",
        type=byte_size,
        default=256 << 10,
        help="request bodies larger than this are parsed by the body-parser processes (default 256Ki)",
    )
    g.add_argument(
        "--large-body-min-bytes",
        type=byte_size,
        default=1 << 20,
        help="request bodies larger than this are paced by --max-concurrent-large-bodies and "
        "--large-body-rate (default 1Mi: above any text-only prompt a model reads)",
    )
    g.add_argument(
        "--max-concurrent-large-bodies",
        type=non_negative_int,
        default=2,
        help="requests with a body over --large-body-min-bytes read and parsed at once; others "
        "wait unread, their senders held by flow control (default 2, 0: no bound)",
    )
    g.add_argument(
        "--large-body-rate",
        type=byte_size,
        default=64 << 20,
        help="bytes a second of bodies over --large-body-min-bytes read, all streams together; "
        "a large body waits unread until within it (default 64Mi, 0: no bound)",
    )
