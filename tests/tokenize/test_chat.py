"""`chat`: chat templates rendered after vLLM's request preprocessing, and `Tokenizers.encode_chat`.

The templates under data/ were written for these tests in the styles of real model families
(Llama-3 headers, ChatML with tools and thinking, [INST] with role checks, one that walks content
parts); epp-tiny's own template comes from its tokenizer_config.json. Expected strings are
written out by hand from the template text.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest

from epp.tokenize import chat, registry, tokenizer

DATA = Path(__file__).resolve().parent / "data"
DATE = {"date_string": "01 Jan 2026"}  # the Llama-like template prints today's date otherwise


def _tok(shipped: tokenizer.Tokenizer, name: str) -> tokenizer.Tokenizer:
    """epp-tiny's vocabulary with one of the test templates."""
    return tokenizer.Tokenizer(
        shipped.backend,
        name=name,
        chat_template=(DATA / f"{name}.jinja").read_text(),
        bos_token_id=shipped.bos_token_id,
        special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
    )


@pytest.fixture(scope="module")
def tiny() -> tokenizer.Tokenizer:
    return tokenizer.load_shipped()


@pytest.fixture(scope="module")
def make(tiny: tokenizer.Tokenizer) -> Callable[[str], tokenizer.Tokenizer]:
    return lambda name: _tok(tiny, name)


def _body(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **fields}


SYS = {"role": "system", "content": "Be brief."}
U1 = {"role": "user", "content": "Hi"}
A1 = {"role": "assistant", "content": "Hello!"}
U2 = {"role": "user", "content": "What is 2+2?"}


# -- epp-tiny, the shipped template ---------------------------------------------------------------


def test_tiny_system_and_multi_turn(tiny: tokenizer.Tokenizer) -> None:
    text = chat.render_chat(tiny, _body(SYS, U1, A1, U2))
    assert text == (
        "<s><|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n"
        "<|user|>\nWhat is 2+2?</s>\n<|assistant|>\n"
    )


def test_tiny_no_system_and_no_generation_prompt(tiny: tokenizer.Tokenizer) -> None:
    text = chat.render_chat(tiny, _body(U1, add_generation_prompt=False))
    assert text == "<s><|user|>\nHi</s>\n"


def test_tiny_bos_is_not_doubled(tiny: tokenizer.Tokenizer) -> None:
    bos = tiny.bos_token_id
    assert bos is not None
    body = _body(U1)
    ids = chat.encode_chat(tiny, body)
    assert ids[0] == bos and ids[1] != bos
    assert ids == tiny.encode(chat.render_chat(tiny, body), add_special_tokens=False)
    # add_special_tokens: true is honoured, and then the post-processor adds a second BOS (as vLLM).
    doubled = chat.encode_chat(tiny, {**body, "add_special_tokens": True})
    assert doubled[:2] == [bos, bos] and doubled[1:] == ids


def test_tiny_special_tokens_come_from_the_config(tiny: tokenizer.Tokenizer) -> None:
    assert tiny.special_tokens["bos_token"] == "<s>"
    assert tiny.special_tokens["eos_token"] == "</s>"
    assert tiny.special_tokens["additional_special_tokens"] == ["<|system|>", "<|user|>", "<|assistant|>"]
    assert "mask_token" not in tiny.special_tokens  # unset tokens stay undefined for templates


# -- content parts ------------------------------------------------------------------------------


PARTS = {
    "role": "user",
    "content": [
        {"type": "text", "text": "Hi"},
        {"type": "text", "text": ""},
        "plain",
        {"type": "input_text", "text": "there"},
        {"type": "text", "text": None},
    ],
}


def test_string_format_drops_empty_parts_and_joins(tiny: tokenizer.Tokenizer) -> None:
    text = chat.render_chat(tiny, _body(PARTS, add_generation_prompt=False))
    assert text == "<s><|user|>\nHi\nplain\nthere</s>\n"


def test_openai_format_gets_parts_and_strings_as_parts(make: Callable[[str], tokenizer.Tokenizer]) -> None:
    tok = make("openai_parts")
    text = chat.render_chat(tok, _body(SYS, PARTS))
    # The system string became one text part; the empty text part is kept, the null one skipped.
    assert text == (
        "<|system|>\n[text]Be brief.<|end|>\n"
        "<|user|>\n[text]Hi[text][text]plain[text]there<|end|>\n<|assistant|>\n"
    )


def test_null_content_is_empty(tiny: tokenizer.Tokenizer, make: Callable[[str], tokenizer.Tokenizer]) -> None:
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msg = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert chat.render_chat(tiny, _body(U1, msg, add_generation_prompt=False)).endswith(
        "<|assistant|>\n</s>\n"
    )
    assert chat.render_chat(make("openai_parts"), _body(msg, add_generation_prompt=False)) == (
        "<|assistant|>\n<|end|>\n"
    )


def test_tool_message_parts_are_always_joined(make: Callable[[str], tokenizer.Tokenizer]) -> None:
    tool = {
        "role": "tool",
        "tool_call_id": "c1",
        "content": [
            {"type": "text", "text": "a"},
            {"type": "text", "text": ""},
            {"type": "text", "text": "b"},
        ],
    }
    # "openai": the parts (empty ones included) become one string, so the template prints it as is.
    assert chat.render_chat(make("openai_parts"), _body(tool, add_generation_prompt=False)) == (
        "<|tool|>\na\n\nb<|end|>\n"
    )
    # "string": empty parts are dropped first.
    text = chat.render_chat(make("chatml_tools"), _body(U1, tool, add_generation_prompt=False))
    assert text.endswith("<tool_response>\na\nb\n</tool_response><|im_end|>\n")


def test_tool_reference_parts_keep_the_tool_message_a_list(
    make: Callable[[str], tokenizer.Tokenizer],
) -> None:
    tool = {
        "role": "tool",
        "content": [{"type": "text", "text": "x"}, {"type": "tool_reference", "name": "t"}],
    }
    text = chat.render_chat(make("openai_parts"), _body(tool, add_generation_prompt=False))
    assert text == "<|tool|>\n[text]x[tool t]<|end|>\n"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
        {"image_url": "http://x/y.png"},
        {"type": "audio_url", "audio_url": {"url": "a"}},
        {"type": "banana", "text": "x"},
        {"text": "no type"},
        {"type": 3},
        7,
    ],
)
def test_bad_or_media_parts_are_refused(tiny: tokenizer.Tokenizer, part: Any) -> None:
    with pytest.raises(chat.ChatTemplateError, match=r"messages\[0\]\.content"):
        chat.render_chat(tiny, _body({"role": "user", "content": [part]}))


# -- content format detection -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "string"),
        ("{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}", "openai"),
        ("{% for m in messages %}{% for p in m.content %}{{ p }}{% endfor %}{% endfor %}", "openai"),
        # through a name set from messages, a slice and a filter
        (
            "{% set rest = messages[1:] %}{% for m in rest %}"
            "{% for p in m.content | selectattr('type', 'equalto', 'text') %}{{ p.text }}{% endfor %}"
            "{% endfor %}",
            "openai",
        ),
        # a macro walking a variable named content
        ("{% macro r(content) %}{% for c in content %}{{ c.text }}{% endfor %}{% endmacro %}", "openai"),
        # indexing or testing the content without a loop does not count (vLLM's rule)
        (
            "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% endif %}{% endfor %}",
            "string",
        ),
        ("{{ messages[0]['content'][0] }}", "string"),
        # a loop over something else's content
        ("{% for d in documents %}{% for p in d.content %}{{ p }}{% endfor %}{% endfor %}", "string"),
    ],
)
def test_content_format_detection(source: str, expected: str) -> None:
    assert chat.compile_template(source).content_format == expected


def test_shipped_and_test_templates_formats(
    tiny: tokenizer.Tokenizer, make: Callable[[str], tokenizer.Tokenizer]
) -> None:
    assert tiny.chat_template is not None
    assert chat.compile_template(tiny.chat_template).content_format == "string"
    found = {n: chat.compile_template(make(n).chat_template or "") for n in _TEMPLATES}
    assert {n: c.content_format for n, c in found.items()} == {
        "llama3_like": "string",
        "chatml_tools": "string",
        "mistral_like": "string",
        "openai_parts": "openai",
    }
    assert [n for n, c in found.items() if c.supports_developer] == ["openai_parts"]


_TEMPLATES = ("llama3_like", "chatml_tools", "mistral_like", "openai_parts")


# -- realistic templates ------------------------------------------------------------------------


def test_llama_like_exact(make: Callable[[str], tokenizer.Tokenizer]) -> None:
    text = chat.render_chat(make("llama3_like"), _body(SYS, U1, A1, U2, chat_template_kwargs=DATE))
    assert text == (
        "<s><|start_header_id|>system<|end_header_id|>\n\nToday Date: 01 Jan 2026\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama_like_without_system_uses_today(make: Callable[[str], tokenizer.Tokenizer]) -> None:
    text = chat.render_chat(make("llama3_like"), _body(U1))
    today = datetime.datetime.now().strftime("%d %b %Y")
    assert text.startswith(
        f"<s><|start_header_id|>system<|end_header_id|>\n\nToday Date: {today}\n\n<|eot_id|>"
    )


def test_documents_reach_the_template(make: Callable[[str], tokenizer.Tokenizer]) -> None:
    docs = [{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]
    text = chat.render_chat(make("llama3_like"), _body(U1, documents=docs, chat_template_kwargs=DATE))
    assert "Today Date: 01 Jan 2026\n\nDocuments:\n[1] A: alpha\n[2] B: beta\n\n<|eot_id|>" in text


def test_chatml_tools_and_tool_calls(make: Callable[[str], tokenizer.Tokenizer]) -> None:
    tools = [
        # keys out of order, an unknown key, no description: vLLM's request model rebuilds it
        {
            "function": {"parameters": {"type": "object"}, "name": "get_weather", "x-extra": 1},
            "type": "function",
        },
        {"type": "function", "function": {"name": "now", "description": "Time", "strict": True}},
    ]
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
        },
        {"id": "c2", "type": "function", "function": {"name": "now", "arguments": "not json"}},
        {"id": "c3", "type": "function", "function": {"name": "now", "arguments": "[1, 2]"}},
        {"id": "c4", "type": "function", "function": {"name": "now", "arguments": '{"tz": "UTC"}'}},
    ]
    body = _body(
        U1,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
        tools=tools,
    )
    before = copy.deepcopy(body)
    text = chat.render_chat(make("chatml_tools"), body)
    assert body == before  # the request body is never modified
    assert text == (
        "<|im_start|>system\n# Tools\n\nFunction signatures, one per line:\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": null, '
        '"parameters": {"type": "object"}}}\n'
        '{"type": "function", "function": {"name": "now", "description": "Time", "parameters": null, '
        '"strict": true}}\n'
        '</tools>\n\nCall a function with <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>\n'
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
        '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
        '\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
        '\n<tool_call>\n{"name": "now", "arguments": {"tz": "UTC"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>"
        "\n<tool_response>\n12:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_empty_tool_calls_are_dropped(make: Callable[[str], tokenizer.Tokenizer]) -> None:
    tok = make("openai_parts")
    source = "{% for m in messages %}{{ m.tool_calls is defined }}{% endfor %}"
    compiled = chat.compile_template(source)
    tok = tokenizer.Tokenizer(tok.backend, name="t", chat_template=source)
    assert compiled.content_format == "string"
    assert chat.render_chat(tok, _body({"role": "assistant", "content": "x", "tool_calls": []})) == "False"


def test_reasoning_and_reasoning_effort(make: Callable[[str], tokenizer.Tokenizer]) -> None:
    tok = make("chatml_tools")
    assistant = {"role": "assistant", "content": "4", "reasoning": "  2+2 is 4  "}
    text = chat.render_chat(tok, _body(U2, assistant, U1, reasoning_effort="none"))
    assert text == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n2+2 is 4\n</think>\n\n4<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # Another effort leaves thinking alone; chat_template_kwargs win over reasoning_effort.
    assert chat.render_chat(tok, _body(U1, reasoning_effort="low")).endswith("<|im_start|>assistant\n")
    kwargs = {"enable_thinking": True}
    text = chat.render_chat(tok, _body(U1, reasoning_effort="none", chat_template_kwargs=kwargs))
    assert text.endswith("<|im_start|>assistant\n")


def test_reasoning_content_is_the_older_name_of_reasoning(tiny: tokenizer.Tokenizer) -> None:
    # vLLM's ChatCompletionRequest._normalize_messages_before: reasoning_content moves to reasoning
    # when reasoning is absent or null; reasoning wins when both are set. Only assistant messages
    # pass reasoning on (as both names); other keys never reach the template.
    source = "{% for m in messages %}[{{ m.reasoning_content }}|{{ m.reasoning }}|{{ m.extra }}]{% endfor %}"
    tok = tokenizer.Tokenizer(tiny.backend, name="t", chat_template=source)
    msgs = [
        {"role": "assistant", "content": "a", "reasoning": "r"},
        {"role": "assistant", "content": "b", "reasoning_content": "old", "extra": 1},
        {"role": "assistant", "content": "c", "reasoning": "new", "reasoning_content": "old"},
        {"role": "assistant", "content": "d", "reasoning": None, "reasoning_content": "old"},
        {"role": "assistant", "content": "e", "reasoning_content": None},
        {"role": "user", "content": "f", "reasoning": "ignored", "reasoning_content": "ignored"},
    ]
    assert chat.render_chat(tok, _body(*msgs)) == "[r|r|][old|old|][new|new|][old|old|][||][||]"


def test_developer_merged_into_system_when_template_lacks_it(
    make: Callable[[str], tokenizer.Tokenizer],
) -> None:
    dev = {"role": "developer", "content": "Use metric units.", "tools": [{"x": 1}]}
    body = _body(SYS, U1, dev, U2, add_generation_prompt=False)
    text = chat.render_chat(make("chatml_tools"), body)
    assert text == (
        "<|im_start|>system\nBe brief.\n\nUse metric units.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    )
    # A template that names the role gets developer messages as they are.
    text = chat.render_chat(make("openai_parts"), body)
    assert "<|developer|>\n[text]Use metric units.<|end|>" in text


def test_a_lone_first_developer_message_becomes_system(tiny: tokenizer.Tokenizer) -> None:
    body = _body({"role": "developer", "content": "D", "name": "n"}, U1, add_generation_prompt=False)
    assert chat.render_chat(tiny, body) == "<s><|system|>\nD</s>\n<|user|>\nHi</s>\n"


def test_system_messages_merge_only_with_a_developer(tiny: tokenizer.Tokenizer) -> None:
    body = _body(SYS, U1, {"role": "system", "content": "Late."}, add_generation_prompt=False)
    assert (
        chat.render_chat(tiny, body)
        == "<s><|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|system|>\nLate.</s>\n"
    )


def test_raise_exception_is_a_chat_template_error(make: Callable[[str], tokenizer.Tokenizer]) -> None:
    tok = make("mistral_like")
    assert chat.render_chat(tok, _body(SYS, U1, A1, U2)) == (
        "<s>[INST] Be brief.\n\nHi[/INST] Hello!</s>[INST] What is 2+2?[/INST]"
    )
    with pytest.raises(chat.ChatTemplateError, match="roles must alternate"):
        chat.render_chat(tok, _body(U1, U2))
    with pytest.raises(chat.ChatTemplateError, match="Only user and assistant"):
        chat.render_chat(tok, _body(U1, {"role": "tool", "content": "x"}))


def test_other_template_failures_are_chat_template_errors(tiny: tokenizer.Tokenizer) -> None:
    for source in ["{{ messages.append(1) }}", "{{ 1 / 0 }}", "{{ undefined_thing.attr.more }}"]:
        tok = tokenizer.Tokenizer(tiny.backend, name="t", chat_template=source)
        with pytest.raises(chat.ChatTemplateError, match="chat template failed"):
            chat.render_chat(tok, _body(U1))
    with pytest.raises(chat.ChatTemplateError, match="does not compile"):
        chat.compile_template("{% for %}")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"messages": "hi"}, "must be a list"),
        ({"messages": []}, "must not be empty"),
        ({"messages": [{"content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"tools": []}, "tools must not be empty"),
        ({"tools": [{"type": "function", "function": {}}]}, "name"),
        ({"tools": [{"type": "retrieval"}]}, "type function"),
        ({"chat_template_kwargs": {"chat_template": "x"}}, "may not set"),
        ({"chat_template_kwargs": []}, "must be an object"),
        ({"continue_final_message": True}, "cannot both"),
        # vLLM's check_generation_prompt tests the raw values' truth: "false" is a true string
        ({"continue_final_message": True, "add_generation_prompt": "false"}, "cannot both"),
        ({"add_generation_prompt": None}, "must be a boolean"),
        ({"continue_final_message": "perhaps"}, "must be a boolean"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"documents": [{"title": 1}]}, "documents"),
        ({"tool_choice": "auto"}, "needs tools"),
        ({"tool_choice": "sometimes", "tools": [{"function": {"name": "f"}}]}, "tool_choice"),
        (
            {
                "tool_choice": {"type": "function", "function": {"name": "g"}},
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "names none",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": "maybe"}}]}, "strict"),
        ({"chat_template_kwargs": {"messages": []}}, "may not set"),
        ({"chat_template_kwargs": {"conversation": []}}, "may not set"),
        ({"chat_template_kwargs": {"tools": True}}, "tools must be a list of objects"),
        ({"chat_template_kwargs": {"documents": ["a"]}}, "documents must be a list of objects"),
    ],
)
def test_refused_bodies(tiny: tokenizer.Tokenizer, fields: dict[str, Any], match: str) -> None:
    with pytest.raises(chat.ChatTemplateError, match=match):
        chat.render_chat(tiny, {**_body(U1), **fields})


def test_no_template_is_an_error(tiny: tokenizer.Tokenizer) -> None:
    with pytest.raises(chat.ChatTemplateError, match="no chat template"):
        chat.render_chat(tokenizer.Tokenizer(tiny.backend, name="bare"), _body(U1))


def test_continue_final_message(
    tiny: tokenizer.Tokenizer, make: Callable[[str], tokenizer.Tokenizer]
) -> None:
    partial = {"role": "assistant", "content": "The answer is "}
    body = _body(U2, partial, add_generation_prompt=False, continue_final_message=True)
    assert chat.render_chat(tiny, body) == "<s><|user|>\nWhat is 2+2?</s>\n<|assistant|>\nThe answer is "
    # The Llama-like template trims the content, so the trailing space cannot be kept.
    text = chat.render_chat(make("llama3_like"), {**body, "chat_template_kwargs": DATE})
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\nThe answer is")


# -- invariants ---------------------------------------------------------------------------------


CONVERSATION = [SYS, U1, A1, U2, {"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks"}]


@pytest.mark.parametrize("name", ["epp-tiny", "llama3_like", "chatml_tools"])
def test_growing_conversation_renders_prefixes(
    tiny: tokenizer.Tokenizer, make: Callable[[str], tokenizer.Tokenizer], name: str
) -> None:
    tok = tiny if name == "epp-tiny" else make(name)
    renders = [
        chat.render_chat(
            tok, _body(*CONVERSATION[:n], add_generation_prompt=False, chat_template_kwargs=DATE)
        )
        for n in range(1, len(CONVERSATION) + 1)
    ]
    for shorter, longer in itertools.pairwise(renders):
        assert longer.startswith(shorter) and longer != shorter
    # With the generation prompt, the next assistant turn continues the prompt's text.
    prompt = chat.render_chat(tok, _body(*CONVERSATION[:4], chat_template_kwargs=DATE))
    assert renders[4].startswith(prompt)


def test_mistral_prefix_breaks_where_the_system_prompt_moves(
    make: Callable[[str], tokenizer.Tokenizer],
) -> None:
    # The invariant above is not free: a template that folds the system prompt into the first
    # user turn renders [SYS] alone differently from its start with a user turn.
    tok = make("mistral_like")
    alone = chat.render_chat(tok, _body(U1))
    assert not chat.render_chat(tok, _body(SYS, U1)).startswith(alone)


# -- the Jinja environment ----------------------------------------------------------------------


def _render_source(tiny: tokenizer.Tokenizer, source: str, **fields: Any) -> str:
    return chat.render_chat(
        tokenizer.Tokenizer(tiny.backend, name="t", chat_template=source), _body(U1, **fields)
    )


def test_tojson_matches_transformers_options(tiny: tokenizer.Tokenizer) -> None:
    data = {"b": "<ü & 'x'>", "a": [1, 2]}
    assert _render_source(tiny, "{{ d | tojson }}", chat_template_kwargs={"d": data}) == json.dumps(
        data, ensure_ascii=False
    )
    out = _render_source(tiny, "{{ d | tojson(indent=2, sort_keys=true) }}", chat_template_kwargs={"d": data})
    assert out == json.dumps(data, ensure_ascii=False, indent=2, sort_keys=True)
    out = _render_source(tiny, "{{ d | tojson(separators=(',', ':')) }}", chat_template_kwargs={"d": data})
    assert out == '{"b":"<ü & \'x\'>","a":[1,2]}'


def test_environment_features(tiny: tokenizer.Tokenizer) -> None:
    loop = (
        "{% for i in [1, 2, 3, 4] %}{% if i == 2 %}{% continue %}{% endif %}"
        "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    )
    assert _render_source(tiny, loop) == "13"
    assert _render_source(tiny, "{% generation %}kept{% endgeneration %}") == "kept"
    # trim_blocks + lstrip_blocks: block lines leave no blank lines or indentation behind
    assert _render_source(tiny, "a\n  {% if true %}\nb\n  {% endif %}\nc") == "a\nb\nc"
    assert _render_source(tiny, "{{ strftime_now('%Y') }}") == str(datetime.datetime.now().year)
    with pytest.raises(chat.ChatTemplateError, match="chat template: boom"):
        _render_source(tiny, "{{ raise_exception('boom') }}")


def test_templates_are_compiled_once(tiny: tokenizer.Tokenizer) -> None:
    assert tiny.chat_template is not None
    first = chat.compile_template(tiny.chat_template)
    assert chat.compile_template(tiny.chat_template) is first
    assert isinstance(first.template, jinja2.Template)


# -- Tokenizers.encode_chat ---------------------------------------------------------------------


async def test_registry_encode_chat(
    tiny: tokenizer.Tokenizer, track: Callable[[registry.Tokenizers], registry.Tokenizers]
) -> None:
    toks = track(registry.Tokenizers({"m": tiny}, max_chars=2000))
    short = _body(U1)
    assert await toks.encode_chat("m", short) == chat.encode_chat(tiny, short)
    long = _body(SYS, {"role": "user", "content": "word " * 1000})  # past INLINE_CHARS and max_chars
    ids = await toks.encode_chat("m", long)
    assert ids == tiny.encode(chat.render_chat(tiny, long)[:2000], add_special_tokens=False)
    assert toks.truncated == {tiny.name: 1}
    assert await toks.encode_chat("other", short) is None
    assert toks.missing == {"other": 1}
    with pytest.raises(chat.ChatTemplateError):
        await toks.encode_chat("m", _body(U1, tools=[]))
