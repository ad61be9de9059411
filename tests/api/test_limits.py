"""epp's own limits on a body's shape (epp.api.limits): each answered 400, naming its flag, and
checked before anything renders the body."""

from __future__ import annotations

import json
from typing import Any

import pytest

from epp.api import limits
from epp.api.errors import BadRequest
from epp.api.limits import RequestLimits, check_depth, decode_body
from epp.api.requests import parse_request

SMALL = RequestLimits(max_messages=3, max_content_parts=4, max_tools=2, max_json_depth=5)


def _parse(path: str, body: dict[str, Any], limits: RequestLimits = SMALL) -> Any:
    return parse_request(path=path, headers={}, body=json.dumps(body).encode(), request_id="r", limits=limits)


def _chat(n: int, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "x"}] * n, **extra}


def test_messages_parts_and_tools_at_the_limit_pass_and_beyond_are_400() -> None:
    _parse("/v1/chat/completions", _chat(3))
    with pytest.raises(BadRequest, match=r"messages: 4 exceeds epp's limit of 3 \(--max-request-messages\)"):
        _parse("/v1/chat/completions", _chat(4))
    parts = [{"type": "text", "text": "a"}, "b"]
    _parse("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": parts}] * 2})
    with pytest.raises(BadRequest, match=r"content parts: 6 exceeds .* \(--max-request-content-parts\)"):
        _parse("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": parts}] * 3})
    tool = {"type": "function", "function": {"name": "f"}}
    _parse("/v1/chat/completions", _chat(1, tools=[tool] * 2))
    with pytest.raises(BadRequest, match=r"tools: 3 exceeds .* \(--max-request-tools\)"):
        _parse("/v1/chat/completions", _chat(1, tools=[tool] * 3))


def test_responses_input_items_and_parts_are_limited() -> None:
    item = {"role": "user", "content": [{"type": "input_text", "text": "x"}] * 2}
    _parse("/v1/responses", {"model": "m", "input": [item] * 2})
    with pytest.raises(BadRequest, match="input items: 4 exceeds"):
        _parse("/v1/responses", {"model": "m", "input": [item] * 4})
    with pytest.raises(BadRequest, match="content parts: 6 exceeds"):
        _parse("/v1/responses", {"model": "m", "input": [item] * 3})


def test_defaults_sit_far_above_a_real_conversation() -> None:
    # a long agent session: 2,000 messages, 200 tools, schemas 12 deep
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(10):
        schema = {"type": "object", "properties": {"p": schema}}
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": schema}} for i in range(200)]
    body = json.dumps(_chat(2000, tools=tools)).encode()
    parse_request(path="/v1/chat/completions", headers={}, body=body, request_id="r")
    decode_body(body, RequestLimits())


def test_depth_is_checked_without_recursion() -> None:
    check_depth({"a": [[[{"b": 1}]]]}, SMALL)  # 5 levels: the body, a, [, [, {
    with pytest.raises(BadRequest, match=r"nested more than 5 levels deep .*--max-request-json-depth"):
        check_depth({"a": [[[[[1]]]]]}, SMALL)
    deep: Any = 1
    for _ in range(100_000):  # far past Python's recursion limit: no RecursionError
        deep = [deep]
    with pytest.raises(BadRequest, match="nested"):
        check_depth({"x": deep}, RequestLimits())


def test_decode_body_refuses_deep_json_and_reads_huge_floats_as_python_does() -> None:
    with pytest.raises(BadRequest, match="nested"):
        decode_body(b'{"x":' + b"[" * 100 + b"]" * 100 + b"}", RequestLimits())
    with pytest.raises(BadRequest, match="nested"):
        decode_body(b'{"x":' + b"[" * 5000 + b"]" * 5000 + b"}", RequestLimits())
    assert decode_body(b'{"t":1e400,"u":-1e400}', RequestLimits()) == {"t": float("inf"), "u": float("-inf")}


def test_a_typed_parse_of_a_body_nested_past_the_recursion_limit_is_400() -> None:
    body = b'{"model":"m","prompt":"x","extra":' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(BadRequest, match="nested"):
        parse_request(path="/v1/completions", headers={}, body=body, request_id="r")


@pytest.mark.parametrize(
    "ids", ["[9223372036854775808]", "[[1],[18446744073709551616]]", "[-9223372036854775809]"]
)
def test_token_ids_past_int64_are_400(ids: str) -> None:
    body = b'{"model":"m","prompt":' + ids.encode() + b"}"
    with pytest.raises(BadRequest, match="9223372036854775"):
        parse_request(path="/v1/completions", headers={}, body=body, request_id="r")


def test_huge_length_parameters_are_clamped_to_int64() -> None:
    body = (
        b'{"model":"m","prompt":"x","max_tokens":1'
        + b"0" * 400
        + b',"truncate_prompt_tokens":-1'
        + b"0" * 40
        + b"}"
    )
    req = parse_request(path="/v1/completions", headers={}, body=body, request_id="r")
    assert req.max_output_tokens == (1 << 63) - 1
    assert req.truncate_prompt_tokens == -(1 << 63)


def test_limits_must_be_sane() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RequestLimits(max_messages=0)
    with pytest.raises(ValueError, match="at most"):
        RequestLimits(max_json_depth=1000)


LIMITS = RequestLimits()
_LONG = 'system prompt line\n\t"quoted" 😀 naïve ' * 300  # ~11 KB of JSON: past KNOWN_STRING_BYTES


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": _LONG}, {"role": "user", "content": "hi"}],
        [{"role": "system", "content": _LONG, "name": "s"}, {"role": "user", "content": _LONG + "2"}],
        [{"role": "user", "content": [{"type": "text", "text": _LONG}]}, {"role": "user", "content": _LONG}],
        [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            {"role": "tool", "content": _LONG},
        ],
    ],
)
def test_a_chat_decoded_around_its_known_long_strings_equals_the_whole_decode(messages: list[Any]) -> None:
    body = json.dumps({"model": "m", "messages": messages, "tools": [{"type": "function"}]}).encode()[:-1]
    body += b', "n": 1e400}'  # past a double's range: the float hook reads it in both decodes
    req = _parse_chat(body)
    assert req.known_strings is not None and req.known_strings.body is body
    assert [span[0] for span in req.known_strings.spans] == [
        i for i, m in enumerate(messages) if isinstance(m["content"], str) and len(m["content"]) > 1000
    ]
    assert limits._spliced(body, req.known_strings, LIMITS) is not None  # the splice answered
    assert decode_body(body, LIMITS, req.known_strings) == decode_body(body, LIMITS)


def test_known_strings_apply_to_their_own_body_only() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": _LONG}]}).encode()
    known = _parse_chat(body).known_strings
    other = json.dumps({"model": "m", "messages": [{"role": "user", "content": _LONG + "!"}]}).encode()
    assert decode_body(other, LIMITS, known)["messages"][0]["content"] == _LONG + "!"
    # A duplicate key: both decodes take the last, so the known string is the one kept.
    dup = (
        b'{"model": "m", "messages": [{"role": "user", "content": "x", "content": '
        + json.dumps(_LONG).encode()
        + b"}]}"
    )
    assert decode_body(dup, LIMITS, _parse_chat(dup).known_strings) == decode_body(dup, LIMITS)


def test_a_chat_decoded_around_its_known_strings_is_still_depth_checked() -> None:
    deep = {"a": {"b": {"c": {"d": 1}}}}
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": _LONG}], "x": deep}).encode()
    known = _parse_chat(body).known_strings
    with pytest.raises(BadRequest, match="max-request-json-depth"):
        decode_body(body, RequestLimits(max_json_depth=4), known)


def _parse_chat(body: bytes) -> Any:
    return parse_request(path="/v1/chat/completions", headers={}, body=body, request_id="r", limits=LIMITS)
