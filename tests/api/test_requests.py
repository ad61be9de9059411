"""Request parsing: every API shape, every 400, the model rewrite header, estimates, the subset hint."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import msgspec
import pytest

from epp.api import openai_bodies
from epp.api.errors import BadRequest
from epp.api.requests import EXACT_LENGTH_CHARS, Api, header_only_request, parse_request, utf8_length
from epp.api.routes import api_for_path

REWRITE = "x-gateway-model-name-rewrite"


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


def _parse(path: str, body: bytes, headers: dict[str, str] | None = None, **kw: Any) -> Any:
    return parse_request(path=path, headers=headers or {}, body=body, request_id="rid", **kw)


# --- API selection ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", Api.CHAT),
        ("/v1/chat/completions?api-version=2024", Api.CHAT),
        ("/openai/deployments/x/chat/completions", Api.CHAT),
        ("/v1/completions", Api.COMPLETIONS),
        ("/v1/completions?x=/chat/completions", Api.COMPLETIONS),  # query is not part of the path
        ("/v1/responses", Api.RESPONSES),
        ("/v1/embeddings", Api.EMBEDDINGS),
        ("/v1/embeddings#frag", Api.EMBEDDINGS),
        (
            "/generate",
            Api.PASSTHROUGH,
        ),  # unknown paths: llm-d's passthrough-parser (tests/api/test_routes.py)
        ("/", Api.PASSTHROUGH),
    ],
)
def test_api_for_path(path: str, api: Api) -> None:
    assert api_for_path(path) is api


# --- successful parses -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "fields", "texts", "ids", "estimate"),
    [
        # completions: the four prompt forms
        ("/v1/completions", {"prompt": "abcdefgh"}, ["abcdefgh"], [], 2),
        ("/v1/completions", {"prompt": "abcdefghi"}, ["abcdefghi"], [], 3),  # rounded up
        ("/v1/completions", {"prompt": "a"}, ["a"], [], 1),  # at least 1
        ("/v1/completions", {"prompt": [""]}, [""], [], 0),
        # prompt_embeds (vLLM's extension): fed before any prompt, so epp has no ids to give
        ("/v1/completions", {"prompt_embeds": "AAAA", "prompt": "x"}, [], [], 0),
        ("/v1/completions", {"prompt_embeds": ["AAAA"]}, [], [], 0),
        ("/v1/completions", {"prompt": ["ab", "cdef", "g"]}, ["ab", "cdef", "g"], [], 2),
        ("/v1/completions", {"prompt": [1, 2, 3]}, [], [[1, 2, 3]], 3),
        ("/v1/completions", {"prompt": [[1, 2], [3]]}, [], [[1, 2], [3]], 3),
        ("/v1/engines/x/completions", {"prompt": "abcd"}, ["abcd"], [], 1),  # a suffix match
        # chat: string content, content parts, tool-call message with null content
        (
            "/v1/chat/completions",
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
            ["be brief", "hi"],
            [],
            3,
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "look:"},
                            {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                            {"type": "text", "text": "what?"},
                        ],
                    },
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}],
                    },
                    {"role": "assistant", "tool_calls": [{"id": "c2"}]},  # content omitted
                    {"role": "assistant", "content": None, "function_call": {"name": "g"}},
                    {"role": "tool", "tool_call_id": "c1", "content": "42"},
                ],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "temperature": 0.5,
            },
            ["look:", "what?", "42"],
            [],
            3,
        ),
        # vLLM takes a message without content, a null assistant content, and bare string parts
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "system"},
                    {"role": "assistant", "content": None},
                    {"role": "user", "content": ["ab", {"type": "text", "text": "cd"}]},
                ]
            },
            ["ab", "cd"],
            [],
            1,
        ),
        # multi-byte UTF-8 counts bytes: "é" is 2 bytes, "😀" 4
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "é😀ab"}]}, ["é😀ab"], [], 2),
        # responses: string input, item list, instructions, function_call_output string output
        ("/v1/responses", {"input": "hello"}, ["hello"], [], 2),
        (
            "/v1/responses",
            {
                "instructions": "sys",
                "input": [
                    {"role": "user", "content": "q1"},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q2"}]},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c", "output": "out"},
                    {"type": "computer_call_output", "call_id": "d", "output": {"type": "screenshot"}},
                    {"type": "item_reference", "id": "x"},
                ],
            },
            ["sys", "q1", "q2", "out"],
            [],
            3,
        ),
        # embeddings: the four input forms
        ("/v1/embeddings", {"input": "abcde"}, ["abcde"], [], 2),
        ("/v1/embeddings", {"input": ["a", "b"]}, ["a", "b"], [], 1),
        ("/v1/embeddings", {"input": [5, 6]}, [], [[5, 6]], 2),
        ("/v1/embeddings", {"input": [[5], [6, 7, 8]]}, [], [[5], [6, 7, 8]], 4),
    ],
)
def test_parse_shapes(
    path: str, fields: dict[str, Any], texts: list[str], ids: list[list[int]], estimate: int
) -> None:
    body = _body(**fields)
    req = _parse(path, body)
    assert req.api is api_for_path(path)
    assert req.model == req.target_model == "m"
    assert req.prompt_texts == texts
    assert req.prompt_token_ids == ids
    assert req.prompt_tokens_estimate == estimate
    assert req.body_bytes is body  # no rewrite: the very same object
    assert req.body is None
    assert req.stream is False
    assert req.request_id == "rid"
    assert req.path == path


@pytest.mark.parametrize(("value", "expected"), [(True, True), (False, False), (None, False)])
def test_stream_flag(value: bool | None, expected: bool) -> None:
    assert _parse("/v1/completions", _body(prompt="x", stream=value)).stream is expected


def test_stream_defaults_to_false() -> None:
    assert _parse("/v1/completions", _body(prompt="x")).stream is False


def test_whitespace_and_unknown_fields_are_fine() -> None:
    body = b' \n{ "extra": {"deep": [1, {"prompt": 3}]}, "model" : "m", "prompt" : [ [ 1 ] , [ 2 ] ] }\n'
    req = _parse("/v1/completions", body)
    assert req.prompt_token_ids == [[1], [2]]


def test_headers_and_subset_are_passed_through() -> None:
    headers = {"x-request-id": "abc", "content-type": "application/json"}
    subset = frozenset({"10.0.0.1", "10.0.0.2"})
    req = _parse("/v1/completions", _body(prompt="x"), headers, subset_ips=subset)
    assert req.headers is headers
    assert req.subset_ips is subset
    assert _parse("/v1/completions", _body(prompt="x")).subset_ips is None


# --- 400s --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        # body-level
        ("/v1/completions", b"", "empty"),
        ("/v1/completions", b"   ", "JSON"),
        ("/v1/completions", b'{"model": "m", "prompt": "x"', "JSON"),
        ("/v1/completions", b'{"model": "m", "prompt": "x"} trailing', "JSON"),
        ("/v1/completions", b'{model: "m"}', "JSON"),
        ("/v1/completions", b'{"model": "m", "prompt": "\xff\xfe"}', "UTF-8"),
        ("/v1/embeddings", b'{"model": "m", "input": "\xff"}', "UTF-8"),
        ("/v1/responses", b'{"model": "m", "input": [{"output": "\xff"}]}', "UTF-8"),
        ("/v1/chat/completions", b"[1, 2]", "JSON object"),
        ("/v1/chat/completions", b'"a string"', "JSON object"),
        ("/v1/chat/completions", b"42", "JSON object"),
        # model
        ("/v1/completions", json.dumps({"prompt": "x"}).encode(), "model not found in request body"),
        ("/v1/completions", json.dumps({"model": "", "prompt": "x"}).encode(), "model not found"),
        ("/v1/completions", json.dumps({"model": None, "prompt": "x"}).encode(), "model not found"),
        ("/v1/completions", json.dumps({"model": 7, "prompt": "x"}).encode(), "model"),
        # missing prompt / messages / input
        ("/v1/completions", _body(), "prompt not found"),
        ("/v1/completions", _body(prompt=None), "prompt not found"),
        ("/v1/x/completions", _body(messages=[{"role": "user", "content": "x"}]), "prompt not found"),
        ("/v1/chat/completions", _body(), "messages not found"),
        ("/v1/chat/completions", _body(prompt="x"), "messages not found"),
        ("/v1/responses", _body(), "input not found"),
        ("/v1/embeddings", _body(), "input not found"),
        ("/v1/embeddings", _body(input=None), "input not found"),
        # empty collections
        ("/v1/completions", _body(prompt=[]), "prompt must not be empty"),
        # vLLM's completions: "The decoder prompt cannot be empty", for any prompt of a batch
        ("/v1/completions", _body(prompt=[[1, 2], []]), "token-id list must not be empty"),
        # vLLM's validate_prompt_and_prompt_embeds: an empty-string prompt needs prompt_embeds
        ("/v1/completions", _body(prompt=""), "prompt must not be empty"),
        ("/v1/completions", _body(prompt="", prompt_embeds=[]), "prompt must not be empty"),
        ("/v1/completions", _body(prompt_embeds=None), "prompt not found"),
        ("/v1/embeddings", _body(input=[]), "input must not be empty"),
        # wrong types
        ("/v1/completions", _body(prompt=5), "prompt"),
        ("/v1/completions", _body(prompt={"a": 1}), "prompt"),
        ("/v1/completions", _body(prompt=True), "prompt"),
        ("/v1/completions", _body(prompt=[1, "a"]), "$.prompt[1]"),
        ("/v1/completions", _body(prompt=["a", 1]), "$.prompt[1]"),
        ("/v1/completions", _body(prompt=[[1], ["a"]]), "$.prompt[1][0]"),
        ("/v1/completions", _body(prompt=[[1], 2]), "$.prompt[1]"),
        ("/v1/completions", _body(prompt=[1.5]), "$.prompt[0]"),
        ("/v1/completions", _body(prompt=[True]), "$.prompt[0]"),
        ("/v1/completions", _body(prompt=[None]), "$.prompt[0]"),
        ("/v1/completions", _body(prompt="x", stream="yes"), "$.stream"),
        ("/v1/embeddings", _body(input=[{"a": 1}]), "$.input[0]"),
        ("/v1/chat/completions", _body(messages="hi"), "$.messages"),
        ("/v1/chat/completions", _body(messages={"role": "user"}), "$.messages"),
        ("/v1/chat/completions", _body(messages=["hi"]), "$.messages[0]"),
        ("/v1/chat/completions", _body(messages=[{"content": "hi"}]), "role"),
        ("/v1/chat/completions", _body(messages=[{"role": 1, "content": "hi"}]), "$.messages[0].role"),
        ("/v1/chat/completions", _body(messages=[{"role": "user", "content": 5}]), "$.messages[0].content"),
        (
            "/v1/chat/completions",
            _body(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
            "$.messages[0].content[0].text",
        ),
        # vLLM takes null content on an assistant message only (absent content is empty anywhere)
        ("/v1/chat/completions", _body(messages=[{"role": "user", "content": None}]), "messages[0].content"),
        (
            "/v1/chat/completions",
            _body(messages=[{"role": "assistant", "content": None}, {"role": "tool", "content": None}]),
            "messages[1].content",
        ),
        ("/v1/chat/completions", _body(messages=[{"role": "u", "content": "x"}], tools={}), "$.tools"),
        ("/v1/responses", _body(input=5), "$.input"),
        ("/v1/responses", _body(input=["text"]), "$.input[0]"),
        ("/v1/responses", _body(input="x", instructions=3), "$.instructions"),
        ("/v1/responses", _body(input=[{"role": "user", "content": 3}]), "$.input[0].content"),
    ],
)
def test_bad_requests(path: str, body: bytes, needle: str) -> None:
    with pytest.raises(BadRequest) as info:
        _parse(path, body)
    err = info.value
    assert err.status == 400
    assert needle in err.reason
    assert "\n" not in err.reason and "\r" not in err.reason
    assert err.reason == err.reason.strip() and err.reason


def test_bad_request_reason_is_one_line_even_for_multiline_input() -> None:
    # Line breaks inside the broken JSON must not leak into the reason.
    with pytest.raises(BadRequest) as info:
        _parse("/v1/completions", b'{\n"model":\n"m",\n"prompt": [1,\n\n}')
    assert "\n" not in info.value.reason
    assert info.value.reason.startswith("invalid JSON in request body:")


# --- model rewrite header ----------------------------------------------------------------------------


def test_rewrite_header_replaces_model_and_keeps_everything_else() -> None:
    original = {
        "temperature": 0.1,
        "model": "incoming",
        "messages": [{"role": "user", "content": 'héllo "quoted" \n 😀'}],
        "logit_bias": {"50256": -100},
        "n": 1,
        "stop": None,
        "nested": {"model": "not-top-level", "list": [1, 2.5, True, False, None]},
        "big": 123456789012345678901234567890,
    }
    body = json.dumps(original).encode()
    req = _parse("/v1/chat/completions", body, {REWRITE: "target-lora"})
    assert req.model == "incoming"
    assert req.target_model == "target-lora"
    rewritten = json.loads(req.body_bytes)
    assert rewritten == {**original, "model": "target-lora"}
    assert list(rewritten) == list(original)  # key order kept
    assert rewritten["nested"]["model"] == "not-top-level"
    assert req.prompt_texts == ['héllo "quoted" \n 😀']  # parsed from the original body


@pytest.mark.parametrize(
    "number", ["0.1", "1.0000000000000001", "1e400", "-0.0", "1E5", "3", "-1e-400", "12345678901234567890123"]
)
def test_rewrite_keeps_number_values_exactly(number: str) -> None:
    body = b'{"model":"a","prompt":"p","x":' + number.encode() + b"}"
    req = _parse("/v1/completions", body, {REWRITE: "b"})
    out = json.loads(req.body_bytes, parse_float=Decimal, parse_int=Decimal)
    assert out["model"] == "b"
    assert out["x"] == Decimal(number)


@pytest.mark.parametrize("target", ["", None])
def test_rewrite_header_absent_or_empty_leaves_body_alone(target: str | None) -> None:
    body = _body(prompt="x")
    headers = {} if target is None else {REWRITE: target}
    req = _parse("/v1/completions", body, headers)
    assert req.target_model == "m"
    assert req.body_bytes is body


def test_rewrite_to_the_same_name_does_not_copy() -> None:
    body = _body(prompt="x")
    req = _parse("/v1/completions", body, {REWRITE: "m"})
    assert req.target_model == "m"
    assert req.body_bytes is body


def test_rewrite_target_needing_json_escapes() -> None:
    req = _parse("/v1/completions", _body(prompt="x"), {REWRITE: 'we"ird\\name/é'})
    assert msgspec.json.decode(req.body_bytes)["model"] == 'we"ird\\name/é'


def test_rewrite_still_validates() -> None:
    with pytest.raises(BadRequest, match="model not found"):
        _parse("/v1/completions", json.dumps({"prompt": "x"}).encode(), {REWRITE: "t"})


def test_rewrite_of_a_body_nested_to_the_recursion_limit_is_400_not_a_crash() -> None:
    """The typed parse skips a deep field; the rewrite decodes the body whole one call deeper.
    At the nesting where the first just passes, the second hit the recursion limit: a 500."""

    def nested(depth: int) -> bytes:
        return b'{"model":"m","prompt":"x","x":' + b"[" * depth + b"]" * depth + b"}"

    depth = 100
    while True:  # the shallowest nesting the typed parse refuses, at this call depth
        try:
            _parse("/v1/completions", nested(depth))
        except BadRequest:
            break
        depth += 1
    for d in range(depth - 8, depth + 2):
        try:
            req = _parse("/v1/completions", nested(d), {REWRITE: "t"})
        except BadRequest as exc:
            assert "nested" in exc.reason
        else:
            assert msgspec.json.decode(req.body_bytes, type=dict)["model"] == "t"


# --- header-only requests ----------------------------------------------------------------------------


@pytest.mark.parametrize(("headers", "model"), [({}, ""), ({REWRITE: "t"}, "t"), ({REWRITE: ""}, "")])
def test_header_only_request(headers: dict[str, str], model: str) -> None:
    subset = frozenset({"10.1.1.1"})
    req = header_only_request(path="/v1/models", headers=headers, request_id="r1", subset_ips=subset)
    assert req.api is Api.OTHER
    assert req.model == req.target_model == model
    assert req.path == "/v1/models"
    assert req.request_id == "r1"
    assert req.subset_ips is subset
    assert req.headers is headers
    assert req.body_bytes == b""
    assert req.prompt_texts == [] and req.prompt_token_ids == []
    assert req.prompt_tokens_estimate == 0


_SALTED = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]


@pytest.mark.parametrize("path", _SALTED)
@pytest.mark.parametrize("salt", ["", "a" * 129, "a@b", "a/b", "a\\b", "a\x00b"])
def test_cache_salt_vllm_refuses(path: str, salt: str) -> None:
    # vLLM's validate_cache_salt: a non-empty string of at most 128 characters without @ / \ NUL
    body = {"model": "m", "cache_salt": salt, "messages": [{"role": "user", "content": "x"}], "prompt": "x"}
    body["input"] = "x"
    with pytest.raises(BadRequest, match="cache_salt"):
        _parse(path, json.dumps(body).encode())


def test_cache_salt_kept() -> None:
    body = {"model": "m", "cache_salt": "a" * 128, "prompt": "x"}
    assert _parse("/v1/completions", json.dumps(body).encode()).cache_salt == "a" * 128


def test_chat_without_messages_is_left_to_the_template_step() -> None:
    # vLLM refuses no messages when it renders them, but takes prompt ids forwarded in
    # kv_transfer_params instead (epp.tokenize.chat decides both).
    req = _parse("/v1/chat/completions", json.dumps({"model": "m", "messages": []}).encode())
    assert req.prompt_texts == [] and req.prompt_tokens_estimate == 0


def test_utf8_length_is_exact_when_short_and_close_when_long() -> None:
    """The estimate's byte count: exact for ASCII and for texts up to EXACT_LENGTH_CHARS, from
    samples past it (a long prompt is not encoded whole for it)."""
    for text in ("", "plain", "héllo wörld 😀", "é" * EXACT_LENGTH_CHARS, "a" * 300_000):
        assert utf8_length(text) == len(text.encode("utf-8"))
    mixed = "routing 😀 naïve 数据 " * 20_000
    assert len(mixed) > EXACT_LENGTH_CHARS
    assert abs(utf8_length(mixed) - len(mixed.encode("utf-8"))) <= len(mixed.encode("utf-8")) // 50


@pytest.mark.parametrize(
    "body",
    [
        _body(prompt="hello"),
        _body(prompt='héllo 😀\n"q"', max_tokens=3.0, stream=None, cache_salt="s"),
        _body(prompt=""),
        _body(prompt=None),
        _body(prompt=["a", "b"]),
        _body(prompt=[1, 2, 3]),
        _body(prompt="x", prompt_embeds="AAAA"),
        _body(prompt="x", max_tokens="3", add_special_tokens=False),
        json.dumps({"prompt": "no model"}).encode(),
        b'{"model": "m", "prompt": "x" "y"}',
        b'{"model": "m", "prompt": "\\ud800"}',
        b'{"model": "m", "prompt": "\xff"}',
        b'{"model": "m", "prompt": "x", "max_tokens": ' + b"[" * 2000 + b"]" * 2000 + b"}",
    ],
)
def test_a_string_prompt_decoded_in_c_parses_as_msgspec_decodes_it(
    body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A string prompt is decoded by epp/api/_jsonstr.c; every field, and every error, is what
    msgspec's own decode of it gives."""

    def outcome() -> Any:
        try:
            req = _parse("/v1/completions", body)
        except BadRequest as e:
            return ("400", str(e))
        return (req.model, req.prompt_texts, req.prompt_token_ids, req.max_output_tokens, req.stream,
                req.cache_salt, req.add_special_tokens, req.prompt_tokens_estimate)  # fmt: skip

    fast = outcome()
    if body.startswith(b'{"model": "m", "prompt": "h'):  # the C decoder is the one that answers
        assert openai_bodies._jsonstr.string(msgspec.Raw(body[25:].split(b",")[0].rstrip(b"}"))) is not None
    monkeypatch.setattr(openai_bodies._jsonstr, "string", lambda raw: None)
    assert fast == outcome()
