"""Hypothesis strategies for request bodies: valid bodies mutated (wrong types in any field, any
nesting) and their bytes damaged. Used by test_director (a seeded sample) and run_fuzz (the long run)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tests.fuzz.corpus import PATHS

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
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
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
