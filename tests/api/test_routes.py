"""The parser registry (llm-d Router v0.10's rules) and the parses of the non-OpenAI routes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from epp.api import errors
from epp.api.errors import BadRequest
from epp.api.requests import Api, parse_request
from epp.api.routes import DEFAULT, Parser, Parsers, Route


def _parse(path: str, body: Any, parsers: Parsers = DEFAULT) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(path=path, headers={}, body=raw, request_id="r", route=parsers.resolve(path))


# --- resolution -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "api", "render", "parser"),
    [
        ("/v1/chat/completions", Api.CHAT, False, "openai-parser"),
        ("/v1/completions", Api.COMPLETIONS, False, "openai-parser"),
        ("/v1/chat/completions/render", Api.CHAT, True, "openai-parser"),
        ("/v1/completions/render", Api.COMPLETIONS, True, "openai-parser"),
        ("/v1/responses", Api.RESPONSES, False, "openai-parser"),
        ("/v1/responses/render", Api.RESPONSES, True, "openai-parser"),
        ("/v1/embeddings", Api.EMBEDDINGS, False, "openai-parser"),
        ("/v1/conversations", Api.CONVERSATIONS, False, "openai-parser"),
        ("/v1/images/generations", Api.IMAGES, False, "openai-parser"),
        ("/v1/messages", Api.MESSAGES, False, "anthropic-parser"),
        ("/v1/messages/", Api.MESSAGES, False, "anthropic-parser"),  # a trailing "/" is ignored
        ("/v1/messages?beta=true", Api.MESSAGES, False, "anthropic-parser"),  # so is the query
        ("/v1/messages/count_tokens", Api.COUNT_TOKENS, False, "anthropic-parser"),
        ("/v1/messages/render", Api.MESSAGES, True, "anthropic-parser"),
        ("/v1/foomessages", Api.MESSAGES, False, "anthropic-parser"),  # llm-d: a plain suffix test
        ("/inference/v1/generate", Api.GENERATE, False, "vllmhttp-parser"),
        ("/generate", Api.PASSTHROUGH, False, "passthrough-parser"),  # SGLang's: not claimed
        ("/v1/models", Api.PASSTHROUGH, False, "passthrough-parser"),
        ("/", Api.PASSTHROUGH, False, "passthrough-parser"),
    ],
)
def test_default_parsers_resolve_by_longest_suffix(path: str, api: Api, render: bool, parser: str) -> None:
    assert DEFAULT.resolve(path) == Route(api, render, parser)


def test_an_explicit_list_has_no_implied_fallback() -> None:
    parsers = Parsers([Parser("oa", "openai-parser")])
    assert parsers.resolve("/v1/chat/completions") == Route(Api.CHAT, parser="oa")
    with pytest.raises(BadRequest, match="no parser registered matching path suffix for: /v1/messages"):
        parsers.resolve("/v1/messages")


def test_duplicates_and_parsers_after_the_fallback_are_skipped() -> None:
    parsers = Parsers(
        [
            Parser("a", "openai-parser"),
            Parser("b", "openai-parser"),
            Parser("pass", "passthrough-parser"),
            Parser("anth", "anthropic-parser"),
        ]
    )
    assert [p.name for p in parsers.active] == ["a", "pass"]
    assert len(parsers.warnings) == 2
    assert "'b' is skipped" in parsers.warnings[0] and "'anth'" in parsers.warnings[1]
    assert parsers.resolve("/v1/messages") == Route(Api.PASSTHROUGH, parser="pass")


def test_no_engine_routes() -> None:
    assert not Route(Api.CHAT, render=True).runs_engine
    assert not Route(Api.COUNT_TOKENS).runs_engine
    assert not Route(Api.PASSTHROUGH).runs_engine
    assert Route(Api.MESSAGES).runs_engine and Route(Api.GENERATE).runs_engine


# --- passthrough, render ------------------------------------------------------------------------


def test_passthrough_forwards_any_body_unparsed() -> None:
    for body in (b"not json at all", b"", b'{"model": 5}'):
        req = _parse("/v2/whatever", body)
        assert req.api is Api.PASSTHROUGH and req.model == "" and req.body_bytes == body
        assert req.token_ids is None and not req.prompt_texts and not req.runs_engine


def test_render_routes_parse_as_their_api() -> None:
    req = _parse(
        "/v1/chat/completions/render", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert req.api is Api.CHAT and req.render and not req.runs_engine and req.prompt_texts == ["hi"]
    with pytest.raises(BadRequest, match="messages not found"):
        _parse("/v1/chat/completions/render", {"model": "m"})


# --- Anthropic ------------------------------------------------------------------------------------

MSG = {"model": "claude", "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}


def test_messages_read_the_routing_fields() -> None:
    body = {
        **MSG,
        "system": [{"type": "text", "text": "be brief"}],
        "stream": "true",
        "cache_salt": "s",
        "messages": [
            {"role": "user", "content": "hello"},
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "yo"}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "42"}]},
        ],
    }
    req = _parse("/v1/messages", body)
    assert (req.api, req.model, req.stream, req.cache_salt) == (Api.MESSAGES, "claude", True, "s")
    assert req.prompt_texts == ["be brief", "hello", "hm", "yo", "42"]
    assert (req.max_output_tokens, req.max_output_param) == (16, "max_completion_tokens")
    assert req.anthropic_errors and req.runs_engine


def test_count_tokens_needs_no_budget_and_runs_no_engine() -> None:
    req = _parse("/v1/messages/count_tokens", {"model": "claude", "messages": MSG["messages"]})
    assert req.api is Api.COUNT_TOKENS and req.max_output_tokens is None and not req.runs_engine


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({**MSG, "model": None}, "model: field required"),
        ({"max_tokens": 1, "messages": []}, "model: field required"),
        ({**MSG, "model": ""}, "Model is required"),
        ({**MSG, "model": 5}, "model: must be a string"),
        ({"model": "m", "max_tokens": 1}, "messages: field required"),
        ({"model": "m", "messages": []}, "max_tokens: field required"),
        ({**MSG, "max_tokens": 0}, "must be positive"),
        ({**MSG, "max_tokens": "x"}, "max_tokens: must be an integer"),
        ({**MSG, "max_tokens": 1.5}, "max_tokens: must be an integer"),
        ({**MSG, "stream": "maybe"}, "stream: must be a boolean"),
        ({**MSG, "messages": ["hi"]}, "$.messages[0]"),
        ({**MSG, "messages": [{"role": "user", "content": 5}]}, "$.messages[0].content"),
        ({**MSG, "messages": [{"role": "user", "content": ["x"]}]}, "$.messages[0].content[0]"),
    ],
)
def test_messages_refusals_of_the_request_model(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(BadRequest) as info:
        _parse("/v1/messages", body)
    assert needle in info.value.reason
    assert not info.value.anthropic  # FastAPI's validation handler: OpenAI's shape on every route


def test_lax_budgets_as_pydantic_reads_them() -> None:
    for spelled, value in (("7", 7), (7.0, 7), (True, 1), (" 8 ", 8)):
        assert _parse("/v1/messages", {**MSG, "max_tokens": spelled}).max_output_tokens == value


def test_error_shapes() -> None:
    exc = errors.BadRequest("nope")
    assert json.loads(exc.body()) == {
        "error": {"message": "nope", "type": "invalid_request_error", "code": 400}
    }
    exc.anthropic = True
    assert json.loads(exc.body()) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "nope"},
    }
    assert json.loads(errors.error_body(503, "busy", anthropic=True))["error"]["type"] == "overloaded_error"


# --- vLLM's /inference/v1/generate ---------------------------------------------------------------

GEN = {"token_ids": [1, 5, 9], "sampling_params": {"max_tokens": 4}}


def test_generate_takes_its_ids() -> None:
    req = _parse("/inference/v1/generate", {**GEN, "model": "m", "stream": True, "cache_salt": "x"})
    assert (req.api, req.model, req.token_ids, req.stream, req.cache_salt) == (
        Api.GENERATE,
        "m",
        [1, 5, 9],
        True,
        "x",
    )
    assert req.prompt_tokens_estimate == 3 and req.max_output_tokens == 4
    # the model is optional (vLLM serves its default); ids are read as pydantic reads integers
    req = _parse("/inference/v1/generate", {"token_ids": ["5", True, 2.0], "sampling_params": {}})
    assert (req.model, req.token_ids) == ("", [5, 1, 2])


def test_generate_with_media_parts_routes_without_ids() -> None:
    req = _parse("/inference/v1/generate", {**GEN, "content_parts": [{"type": "image_url", "url": "u"}]})
    assert req.token_ids is None and req.prompt_tokens_estimate == 3


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"sampling_params": {}}, "token_ids: field required"),
        ({**GEN, "token_ids": []}, "at least 1 item"),
        ({**GEN, "token_ids": [1, -2]}, "negative"),
        ({**GEN, "token_ids": [1, "x"]}, "token_ids[1]"),
        ({**GEN, "token_ids": "1 2"}, "list of integers"),
        ({"token_ids": [1]}, "sampling_params: field required"),
        ({"token_ids": [1], "sampling_params": [1]}, "valid dictionary"),
        ({**GEN, "cache_salt": "a/b"}, "cache_salt"),
        ({**GEN, "model": 3}, "model: must be a string"),
    ],
)
def test_generate_refusals(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(BadRequest) as info:
        _parse("/inference/v1/generate", body)
    assert needle in info.value.reason


# --- llm-d's minimal reads: conversations, image generation; Responses' own fields ----------------


def test_conversations_and_images() -> None:
    assert _parse("/v1/conversations", {"items": [{"type": "message"}]}).api is Api.CONVERSATIONS
    with pytest.raises(BadRequest, match="must have items"):
        _parse("/v1/conversations", {"items": []})
    req = _parse("/v1/images/generations", {"model": "sd", "prompt": "a cat"})
    assert (req.model, req.prompt_texts) == ("sd", ["a cat"])
    with pytest.raises(BadRequest, match="must have prompt"):
        _parse("/v1/images/generations", {"prompt": ""})


def test_responses_budget_and_truncation() -> None:
    req = _parse("/v1/responses", {"input": "hi", "max_output_tokens": "12", "truncation": "auto"})
    assert (req.model, req.max_output_tokens, req.max_output_param) == ("", 12, "max_output_tokens")
    assert req.truncate_prompt_tokens == -1
    assert _parse("/v1/responses", {"input": "hi", "truncation": None}).truncate_prompt_tokens == -1
    assert _parse("/v1/responses", {"input": "hi"}).truncate_prompt_tokens is None
    # an empty input list is vLLM's to judge (with instructions it renders them)
    assert _parse("/v1/responses", {"input": [], "instructions": "x"}).prompt_texts == ["x"]
    with pytest.raises(BadRequest, match="max_output_tokens"):
        _parse("/v1/responses", {"input": "hi", "max_output_tokens": "many"})
