"""Header abuse: what a client can put in a request's headers, path and content type, as Envoy
forwards it to epp (names lower-cased; a repeated header as one entry per value, in order).

`header_cases()` is a hand-made list (giant, repeated and malformed values, every control and
routing header epp reads, odd paths and content types); `headers_strategy()` generates more.
Each case is (name, headers as a list of (name, value) pairs, body). The bodies are valid
requests: what is judged is epp's handling of the headers.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from epp.api.requests import MODEL_REWRITE_HEADER
from epp.api.slo import TPOT_HEADER, TTFT_HEADER
from epp.requestcontrol.admission import OBJECTIVE_HEADER
from epp.sidecar.protocol import ENCODER_HEADER, PREFILL_HEADER

Headers = list[tuple[str, str]]

CHAT_BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}]}).encode()
COMPLETION_BODY = json.dumps({"model": "m", "prompt": "hello"}).encode()

# Every header epp reads, and the ones the gateway or a sidecar acts on.
EPP_HEADERS = (
    "x-request-id",
    OBJECTIVE_HEADER,
    "x-gateway-inference-fairness-id",
    TTFT_HEADER,
    TPOT_HEADER,
    MODEL_REWRITE_HEADER,
    "x-gateway-destination-endpoint",
    "x-gateway-destination-endpoint-served",
    "x-gateway-destination-endpoint-subset",
    PREFILL_HEADER,
    ENCODER_HEADER,
    "content-length",
    "content-type",
    "traceparent",
    "tracestate",
    "x-epp-worker",
    "x-llm-d-request-dropped-reason",
)

ODD_VALUES = (
    "",
    " ",
    "0",
    "-1",
    "1e999",
    "NaN",
    "inf",
    "18446744073709551616",
    "9" * 400,
    "\x00",
    "\t\x7f",
    "\u00e9\u4e2d\ufffd",
    "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    "a,b,c",
    "10.0.0.1:8000,10.0.0.2:8000",
    "127.0.0.1:19000",
    "[::1]:1",
    "premium",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-zz-yy-01",
    "x" * 65_536,
)

PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/chat/completions?x=1&y=%00",
    "//v1//chat//completions",
    "/v1/chat/completions/../../admin",
    "/%2e%2e/%2f",
    "/v1/models",
    "/",
    "*",
    "/" + "a" * 8000,
    "/v1/chat/completions#frag",
    "/v1/\u00e9",
    "/v1/responses",
    "/v1/embeddings",
    "/metrics",
    "/debug/score",
)

CONTENT_TYPES = (
    "application/json",
    "application/json; charset=utf-16",
    "text/plain",
    "multipart/form-data; boundary=x",
    "application/x-www-form-urlencoded",
    "application/msgpack",
    "",
    "application/json" + "; x=y" * 1000,
)


def _base(path: str = "/v1/chat/completions", **extra: str) -> Headers:
    return [(":method", "POST"), (":path", path), (":authority", "gw"), *extra.items()]


def header_cases() -> list[tuple[str, Headers, bytes]]:
    out: list[tuple[str, Headers, bytes]] = []
    for name in EPP_HEADERS:
        for i, value in enumerate(ODD_VALUES):
            out.append((f"{name}={i}", [*_base(), (name, value)], CHAT_BODY))
        out.append((f"{name} repeated", [*_base(), (name, "a"), (name, "b"), (name, "")], CHAT_BODY))
    for path in PATHS:
        body = COMPLETION_BODY if "completions" in path and "chat" not in path else CHAT_BODY
        out.append((f"path {path[:40]}", _base(path), body))
    for ctype in CONTENT_TYPES:
        out.append((f"content-type {ctype[:40]}", [*_base(), ("content-type", ctype)], CHAT_BODY))
    out.append(("no :path", [(":method", "POST"), (":authority", "gw")], CHAT_BODY))
    out.append(("no :method", [(":path", "/v1/chat/completions")], CHAT_BODY))
    out.append(("GET with a body", [(":method", "GET"), (":path", "/v1/chat/completions")], CHAT_BODY))
    out.append(("many headers", _base() + [(f"x-h{i}", "v" * 100) for i in range(1000)], CHAT_BODY))
    out.append(("one giant header", [*_base(), ("x-big", "b" * (1 << 20))], CHAT_BODY))
    out.append(("giant name", [*_base(), ("x-" + "n" * 10_000, "v")], CHAT_BODY))
    out.append(("empty name", [*_base(), ("", "v")], CHAT_BODY))
    out.append(("pseudo header repeated", [*_base(), (":path", "/v1/completions")], COMPLETION_BODY))
    every = [(n, v) for n in EPP_HEADERS for v in ODD_VALUES[:6]]
    out.append(("every header at once", [*_base(), *every], CHAT_BODY))
    return out


_names = st.sampled_from(EPP_HEADERS) | st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20
).map(str.lower)
_values = st.sampled_from(ODD_VALUES) | st.text(max_size=60)


@st.composite
def headers_strategy(draw: st.DrawFn) -> tuple[Headers, bytes]:
    """A request: a path, some of epp's headers and random ones with odd values, a valid body."""
    path = draw(st.sampled_from(PATHS) | st.text(max_size=40).map(lambda t: "/" + t))
    pairs: Headers = [(draw(_names), draw(_values)) for _ in range(draw(st.integers(0, 8)))]
    body: Any = draw(st.sampled_from([CHAT_BODY, COMPLETION_BODY]))
    return _base(path) + pairs, body
