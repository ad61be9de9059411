"""400, never 500: every client fault is answered 4xx by the Director, with no ERROR logged.

The corpus (tests/fuzz/corpus.py) holds the defects of issue 19 and hand-made nasty bodies;
hypothesis then mutates valid bodies (wrong types in any field, any nesting) and their bytes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.api import errors
from epp.requestcontrol.offload import BodyParsers
from epp.tokenize.registry import Tokenizers
from tests.fuzz.conftest import ErrorLog, build_director, route_once
from tests.fuzz.corpus import CHAT, PATHS, corpus


async def test_corpus_is_answered_without_5xx_or_error_logs(
    tokenizers: Tokenizers, error_log: ErrorLog
) -> None:
    director = build_director(tokenizers)
    failures = []
    for name, path, body in corpus():
        status = await route_once(director, path, body)
        logged = error_log.take()
        if status >= 500 or logged:
            failures.append(f"{name} ({path}): {status} {logged}")
    assert not failures, "\n".join(failures)
    assert all(ep.inflight_requests == 0 for ep in director.datastore.endpoints())


async def test_corpus_gets_the_same_answers_through_the_body_parsers(
    tokenizers: Tokenizers, error_log: ErrorLog
) -> None:
    # Every body parsed and every chat rendered in a body-parser process (min_bytes 0): the
    # answers must be the in-process ones, errors included (they cross a pickle).
    here, there = build_director(tokenizers), build_director(tokenizers)
    parsers = BodyParsers(1, min_bytes=0)
    there.prompts.body_parsers = parsers
    try:
        diffs = []
        for name, path, body in corpus():
            expected, got = await route_once(here, path, body), await route_once(there, path, body)
            logged = error_log.take()
            if got != expected or logged:
                diffs.append(f"{name} ({path}): in process {expected}, offloaded {got} {logged}")
        assert not diffs, "\n".join(diffs)
        assert parsers.restarts == 0
    finally:
        parsers.close()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"model":"m","prompt":[9223372036854775808]}', "<= 9223372036854775807"),
        (
            b'{"model":"m","messages":[{"role":"user","content":"x"}],"x":'
            + b"[" * 1000
            + b"]" * 1000
            + b"}",
            "nested",
        ),
    ],
)
async def test_issue_19_cases_are_400(tokenizers: Tokenizers, body: bytes, reason: str) -> None:
    director = build_director(tokenizers)
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    with pytest.raises(errors.BadRequest, match=reason):
        await director.route(path=path, headers={}, body=body, subset=None)


# --- hypothesis -------------------------------------------------------------------------------------

# integers at the edges of what consumers pack (int64, uint64) and far past them
_EDGE_INTS = st.sampled_from([(1 << 63) - 1, 1 << 63, 1 << 64, -(1 << 63) - 1, 10**400, -(10**400)])
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | _EDGE_INTS
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(
        ["user", "assistant", "system", "developer", "tool", "text", "function", "image_url", ""]
    )
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_KEYS = (
    "role", "content", "type", "text", "name", "tool_calls", "function", "arguments", "id", "tools",
    "tool_choice", "chat_template_kwargs", "documents", "reasoning_effort", "add_generation_prompt",
    "continue_final_message", "kv_transfer_params", "prompt_token_ids", "echo", "max_tokens",
    "truncate_prompt_tokens", "truncation_side", "prompt", "input", "output", "instructions",
    "cache_salt", "stream", "add_special_tokens", "image_url", "reasoning_content", "tool_call_id",
)  # fmt: skip
_values: st.SearchStrategy[Any] = _json | st.builds(
    dict, st.lists(st.tuples(st.sampled_from(_KEYS), _json), max_size=5)
)


@st.composite
def _bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """A body that looks like a request: the fields epp reads, some set to anything."""
    path = draw(st.sampled_from(PATHS))
    message: st.SearchStrategy[Any] = st.builds(
        dict,
        st.lists(st.tuples(st.sampled_from(_KEYS[:12]), _values), max_size=4),
        role=st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | _json,
    )
    body: dict[str, Any] = {
        "model": draw(st.just("m") | _json),
        "messages": draw(st.lists(message, max_size=4) | _json),
        "prompt": draw(
            st.text(max_size=30)
            | st.lists(st.integers(min_value=-(1 << 65), max_value=1 << 65) | _EDGE_INTS, max_size=4)
            | _json
        ),
        "input": draw(st.text(max_size=30) | st.lists(message, max_size=3) | _json),
    }
    for key in draw(st.lists(st.sampled_from(_KEYS), max_size=6)):
        body[key] = draw(_values)
    for key in draw(st.lists(st.sampled_from(list(body)), max_size=3)):
        body.pop(key, None)
    text = json.dumps(body)  # ensure_ascii: lone surrogates become \ud800 escapes
    raw = text.encode()
    if draw(st.booleans()):  # byte-level damage: flip, cut, insert
        data = bytearray(raw)
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, max(0, len(data) - 1)))
            op = draw(st.sampled_from(["flip", "cut", "insert"]))
            if op == "flip" and data:
                data[at] = draw(st.integers(0, 255))
            elif op == "cut":
                del data[at:]
            else:
                data[at:at] = draw(
                    st.sampled_from([b"[", b"{", b'"', b"\\", b"\\ud800", b"\xff", b"1e400", b",", b"null"])
                )
        raw = bytes(data)
    return path, raw


def test_generated_bodies_are_answered_without_5xx_or_error_logs(
    tokenizers: Tokenizers, error_log: ErrorLog
) -> None:
    loop = asyncio.new_event_loop()
    director = build_director(tokenizers)

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_bodies())
    def check(case: tuple[str, bytes]) -> None:
        path, body = case
        status = loop.run_until_complete(route_once(director, path, body))
        logged = error_log.take()
        assert status < 500 and not logged, (status, logged, body[:300])

    try:
        check()
    finally:
        loop.close()
    assert CHAT in PATHS
