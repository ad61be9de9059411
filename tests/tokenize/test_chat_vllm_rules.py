"""`chat`: the reshaping and refusals of vLLM 0.32's chat request handling, one rule per test.

Each rule was found by diffing epp against vLLM's request model and chat preprocessing
(vllm/entrypoints/openai/chat_completion/protocol.py, vllm/renderers/chat_utils.py, hf.py,
params.py; transformers' render_jinja_template) and by the differential run against real vLLM
(e2e/vllm/differential.py, scripts/differential_tokenize.py). Templates here print what they are
given (`messages | tojson`, variables tested for being defined), so a rule that is not applied
changes the text.
"""

from __future__ import annotations

from typing import Any

import pytest

from epp.tokenize import chat, tokenizer

DUMP = "{{ messages | tojson }}"


@pytest.fixture(scope="module")
def tiny() -> tokenizer.Tokenizer:
    return tokenizer.load_shipped()


def _render(tiny: tokenizer.Tokenizer, source: str, *messages: dict[str, Any], **fields: Any) -> str:
    tok = tokenizer.Tokenizer(
        tiny.backend, name="t", chat_template=source, special_tokens={"bos_token": "<s>"}
    )
    return chat.render_chat(tok, {"model": "m", "messages": list(messages), **fields})


def _messages(tiny: tokenizer.Tokenizer, *messages: dict[str, Any], **fields: Any) -> Any:
    import json

    return json.loads(_render(tiny, DUMP, *messages, add_generation_prompt=False, **fields))


U = {"role": "user", "content": "hi"}


# --- messages: what vLLM's request model accepts ------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "x", "name": None},  # name: a string when present
        {"role": "user", "content": "x", "name": 3},
        {"role": "user", "content": None},  # null content: assistant messages only
        {"role": "system", "content": None},
        {"role": "tool", "content": None},
        {"role": "assistant", "content": None, "tool_calls": None},  # ... and not with null tool_calls
        {"role": "tool", "content": "x", "tool_call_id": 5},
        {"role": "user", "content": 5},
    ],
)
def test_messages_vllm_refuses(tiny: tokenizer.Tokenizer, message: dict[str, Any]) -> None:
    with pytest.raises(chat.ChatTemplateError):
        _render(tiny, DUMP, message)


def test_messages_vllm_accepts(tiny: tokenizer.Tokenizer) -> None:
    # Absent content is an empty one in every role; null content on an assistant message is too;
    # a tool message's null tool_call_id is kept.
    got = _messages(
        tiny,
        {"role": "user"},
        {"role": "assistant", "content": None},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "content": "r", "tool_call_id": None},
        {"role": "critic", "content": "any role"},
    )
    assert got == [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "r", "tool_call_id": None},
        {"role": "critic", "content": "any role"},
    ]


@pytest.mark.parametrize(
    ("content", "passes"),
    [
        ([], True),
        (["a"], False),  # bare strings alone fail ...
        (["a", "b"], False),
        (["a", {"type": "text", "text": "b"}], True),  # ... and pass beside a typed part
        ([{"type": "input_text", "text": "x"}], False),
        ([{"type": "text", "text": "a"}, {"type": "input_text", "text": "x"}], True),
        ([{"type": "output_text", "text": "x"}, "b"], False),
        ([{"type": "text", "text": None}], False),
        ([{"type": "text", "text": None}, {"type": "text", "text": "a"}], True),
        ([{"type": "thinking", "thinking": "t"}], True),
        ([{"type": "refusal", "refusal": "no"}], True),
        ([{"type": "refusal", "refusal": None}], False),
    ],
)
def test_parts_on_openai_roles(tiny: tokenizer.Tokenizer, content: list[Any], passes: bool) -> None:
    """Observed on vLLM 0.32: on user, assistant, system and developer messages pydantic picks
    OpenAI's message shape unless a typed part (or a field only vLLM's shape has) tips it to
    vLLM's; OpenAI's shape then fails on the parts it does not know. Other roles take anything."""
    for role in ("user", "assistant", "system", "developer"):
        if passes:
            _render(tiny, DUMP, {"role": role, "content": content})
        else:
            with pytest.raises(chat.ChatTemplateError, match="parts not valid"):
                _render(tiny, DUMP, {"role": role, "content": content})
    _render(tiny, DUMP, {"role": "tool", "content": ["a"]})
    # A field only vLLM's shape has (reasoning, also as reasoning_content) tips it too.
    _render(tiny, DUMP, {"role": "assistant", "content": ["a"], "reasoning_content": "r"})


# --- content parts --------------------------------------------------------------------------------


def test_system_billing_header_line_is_dropped(tiny: tokenizer.Tokenizer) -> None:
    # chat_utils._strip_claude_code_billing_header: system messages only, first line only.
    header = "x-anthropic-billing-header: cc_version=1; cch=12345;"
    got = _messages(
        tiny,
        {"role": "system", "content": header + "\nBe brief."},
        {"role": "system", "content": [{"type": "text", "text": header}, {"type": "text", "text": "Two"}]},
        {"role": "system", "content": "Keep " + header},
        {"role": "user", "content": header + "\nkept"},
    )
    assert [m["content"] for m in got] == ["Be brief.", "Two", "Keep " + header, header + "\nkept"]


def test_text_part_extra_keys_reach_openai_templates(tiny: tokenizer.Tokenizer) -> None:
    # A text part's keys that no vLLM part type declares are passed on after type and text.
    source = "{% for m in messages %}{% for p in m.content %}{{ p | tojson }}{% endfor %}{% endfor %}"
    part = {"cache_control": {"type": "ephemeral"}, "text": "a", "type": "text", "closed": True}
    text = _render(tiny, source, {"role": "user", "content": [part]}, add_generation_prompt=False)
    assert text == '{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}'


def test_part_with_uuid_goes_by_its_keys(tiny: tokenizer.Tokenizer) -> None:
    # vLLM reads a part with a uuid by the keys present: a text part with a uuid has none it knows.
    with pytest.raises(chat.ChatTemplateError, match="no type"):
        _render(tiny, DUMP, {"role": "tool", "content": [{"type": "text", "text": "a", "uuid": "u"}]})
    with pytest.raises(chat.UnsupportedChat):
        _render(
            tiny, DUMP, {"role": "user", "content": [{"type": "text", "text": "a"}, {"video_embeds": "x"}]}
        )


# --- tool calls and tools -------------------------------------------------------------------------


def test_tool_calls_as_vllm_validates_them(tiny: tokenizer.Tokenizer) -> None:
    call = {
        "type": "function",
        "x-extra": 1,
        "function": {"x-f": 2, "name": "f", "arguments": '{"b": 1, "a": [2]}'},
        "id": "c1",
    }
    empty = {"id": "c2", "type": "function", "function": {"name": "g", "arguments": ""}}
    got = _messages(tiny, U, {"role": "assistant", "content": None, "tool_calls": [call, empty]})
    # pydantic's TypedDict order (id, function, type; arguments, name), other keys after them
    assert got[1]["tool_calls"] == [
        {
            "id": "c1",
            "function": {"arguments": {"b": 1, "a": [2]}, "name": "f", "x-f": 2},
            "type": "function",
            "x-extra": 1,
        },
        {"id": "c2", "function": {"arguments": {}, "name": "g"}, "type": "function"},
    ]
    assert list(got[1]["tool_calls"][0]) == ["id", "function", "type", "x-extra"]


@pytest.mark.parametrize(
    "call",
    [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}},  # no id
        {"id": 1, "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c", "function": {"name": "f", "arguments": "{}"}},  # no type
        {"id": "c", "type": "custom", "custom": {"name": "f", "input": "x"}},
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}},
        {"id": "c", "type": "function", "function": {"name": "f"}},
        {"id": "c", "type": "function", "function": {"arguments": "{}"}},
        "call",
    ],
)
def test_tool_calls_vllm_refuses(tiny: tokenizer.Tokenizer, call: Any) -> None:
    with pytest.raises(chat.ChatTemplateError, match="tool_calls"):
        _render(tiny, DUMP, U, {"role": "assistant", "content": None, "tool_calls": [call]})


def test_developer_tools_as_vllm_validates_them(tiny: tokenizer.Tokenizer) -> None:
    # The template names the 'developer' role, so developer messages keep their tools.
    source = "{# 'developer' #}{{ messages | tojson }}"
    fn = {"parameters": {"type": "object"}, "strict": True, "description": "d", "name": "f", "z": 1}
    tools = [{"x": 2, "type": "function", "function": fn}]
    text = _render(
        tiny, source, {"role": "developer", "content": "x", "tools": tools}, add_generation_prompt=False
    )
    assert text == (
        '[{"role": "developer", "content": "x", "tools": [{"function": {"name": "f", "description": "d", '
        '"parameters": {"type": "object"}, "strict": true, "z": 1}, "type": "function", "x": 2}]}]'
    )
    # strict is read as pydantic reads booleans
    lax = [{"type": "function", "function": {"name": "f", "strict": "yes"}}]
    text = _render(
        tiny, source, {"role": "developer", "content": "x", "tools": lax}, add_generation_prompt=False
    )
    assert '"tools": [{"function": {"name": "f", "strict": true}, "type": "function"}]' in text
    # a tool the shape does not take leaves the list as it came
    odd = [{"function": {"name": "f", "z": 1}}, {"type": "function", "function": {"name": "g"}}]
    text = _render(
        tiny, source, {"role": "developer", "content": "x", "tools": odd}, add_generation_prompt=False
    )
    assert (
        '"tools": [{"function": {"name": "f", "z": 1}}, {"type": "function", "function": {"name": "g"}}]'
        in text
    )


def test_tools_as_vllm_dumps_them(tiny: tokenizer.Tokenizer) -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "f", "strict": "true", "x": 1},
            "defer_loading": True,
            "y": 2,
        },
        {"function": {"name": "g", "defer_loading": False}, "defer_loading": True},
    ]
    text = _render(tiny, "{{ tools | tojson }}", U, tools=tools)
    assert text == (
        '[{"type": "function", "function": {"name": "f", "description": null, "parameters": null, '
        '"strict": true, "defer_loading": true}, "defer_loading": true}, '
        '{"type": "function", "function": {"name": "g", "description": null, "parameters": null, '
        '"defer_loading": false}, "defer_loading": true}]'
    )


def test_tool_choice(tiny: tokenizer.Tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    for choice in ("none", "auto", "required", {"type": "function", "function": {"name": "f"}}):
        _render(tiny, DUMP, U, tools=tools, tool_choice=choice)
    _render(tiny, DUMP, U, tool_choice="none")  # "none" needs no tools
    _render(tiny, DUMP, U, tool_choice=None)
    for choice in ("auto", "required"):
        with pytest.raises(chat.ChatTemplateError, match="needs tools"):
            _render(tiny, DUMP, U, tool_choice=choice)
    with pytest.raises(chat.ChatTemplateError, match="name"):
        _render(tiny, DUMP, U, tools=tools, tool_choice={"type": "function", "function": {"name": ""}})


# --- template variables ---------------------------------------------------------------------------

VARS = (
    "{{ add_generation_prompt }}|{{ documents }}|{{ reasoning_effort is defined and reasoning_effort }}"
    "|{{ enable_thinking is defined and enable_thinking }}|{{ custom is defined and custom }}"
    "|{{ tools | length if tools else tools }}|{{ content }}"
)


def _vars(tiny: tokenizer.Tokenizer, **fields: Any) -> str:
    return _render(tiny, VARS, U, **fields)


def test_request_fields_win_over_chat_template_kwargs(tiny: tokenizer.Tokenizer) -> None:
    """ChatCompletionRequest.build_chat_params: the request's own add_generation_prompt (always
    set, default true), documents and reasoning_effort (when set) override the kwargs."""
    docs = [{"title": "t", "text": "x"}]
    kwargs = {"add_generation_prompt": False, "documents": [{"text": "kw"}], "reasoning_effort": "high"}
    assert _vars(tiny, chat_template_kwargs=kwargs) == "True|[{'text': 'kw'}]|high|False|False|None|"
    got = _vars(tiny, chat_template_kwargs=kwargs, documents=docs, reasoning_effort="low")
    assert got == "True|[{'title': 't', 'text': 'x'}]|low|True|False|None|"


def test_unset_values_are_dropped_from_the_kwargs(tiny: tokenizer.Tokenizer) -> None:
    """merge_kwargs skips null and "auto": such kwargs are undefined in the template, and so is
    reasoning_effort when the request does not set it."""
    assert _vars(tiny) == "True|None|False|False|False|None|"
    assert _vars(tiny, chat_template_kwargs={"custom": None}) == "True|None|False|False|False|None|"
    assert _vars(tiny, chat_template_kwargs={"custom": "auto"}) == "True|None|False|False|False|None|"
    assert _vars(tiny, chat_template_kwargs={"custom": "x", "content": 0}) == "True|None|False|False|x|None|0"


def test_enable_thinking_follows_any_reasoning_effort(tiny: tokenizer.Tokenizer) -> None:
    # enable_thinking = reasoning_effort != "none", unless the kwargs name enable_thinking.
    assert _vars(tiny, reasoning_effort="none") == "True|None|none|False|False|None|"
    assert _vars(tiny, reasoning_effort="high") == "True|None|high|True|False|None|"
    kwargs = {"enable_thinking": False}
    assert (
        _vars(tiny, reasoning_effort="high", chat_template_kwargs=kwargs)
        == "True|None|high|False|False|None|"
    )


def test_tools_from_the_kwargs_replace_the_requests(tiny: tokenizer.Tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    kwargs = {"tools": [{"a": 1}, {"b": 2}]}
    assert _vars(tiny, tools=tools) == "True|None|False|False|False|1|"
    assert _vars(tiny, tools=tools, chat_template_kwargs=kwargs) == "True|None|False|False|False|2|"
    # a string or a mapping is walked like transformers walks it: items must be objects
    assert _vars(tiny, chat_template_kwargs={"tools": ""}) == "True|None|False|False|False|[]|"


def test_lax_booleans(tiny: tokenizer.Tokenizer) -> None:
    # Pydantic reads "false", "off", "0", 0 ... as false; the template sees a real boolean.
    for value in ("false", "off", "0", 0, "N"):
        assert _vars(tiny, add_generation_prompt=value).startswith("False|")
    body = {"model": "m", "messages": [U], "add_special_tokens": "yes"}
    assert chat.add_special_tokens(body) is True
    assert chat.add_special_tokens({**body, "add_special_tokens": "nope"}) is False


def test_tokenize_kwarg_means_no_special_tokens(tiny: tokenizer.Tokenizer) -> None:
    # With `tokenize` in the kwargs vLLM gets ids from apply_chat_template (no special tokens
    # added), so the body's add_special_tokens no longer adds BOS.
    body = {"model": "m", "messages": [U], "add_special_tokens": True}
    with_bos = chat.encode_chat(tiny, body)
    without = chat.encode_chat(tiny, {**body, "chat_template_kwargs": {"tokenize": True}})
    assert with_bos[0] == with_bos[1] == tiny.bos_token_id
    assert without == with_bos[1:]
    with pytest.raises(chat.UnsupportedChat):
        chat.encode_chat(tiny, {**body, "chat_template_kwargs": {"tokenize": True, "max_length": 3}})


# --- continue_final_message -----------------------------------------------------------------------


def test_continue_final_message_cuts_at_the_tagged_content(tiny: tokenizer.Tokenizer) -> None:
    """transformers 5 appends a tag to the final message and cuts there: the text is cut at the
    final message even when the same text came earlier, and a template that trims the message
    loses the message's trailing whitespace."""
    source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    a = {"role": "assistant", "content": "same"}
    text = _render(tiny, source, a, U, a, continue_final_message=True, add_generation_prompt=False)
    assert text == "<assistant>same</assistant><user>hi</user><assistant>same"
    trimmed = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}"
    b = {"role": "assistant", "content": "ends in space  "}
    assert _render(tiny, trimmed, U, b, continue_final_message=True, add_generation_prompt=False) == (
        "<user>hi</user><assistant>ends in space"
    )
    assert _render(tiny, source, U, b, continue_final_message=True, add_generation_prompt=False) == (
        "<user>hi</user><assistant>ends in space  "
    )


def test_continue_final_message_with_parts_and_errors(tiny: tokenizer.Tokenizer) -> None:
    source = (
        "{% for m in messages %}{% for p in m.content %}[{{ p.text }}]{% endfor %}"
        "{% if m.content is string %}{{ m.content }}{% endif %}{% endfor %}"
    )
    parts = {
        "role": "assistant",
        "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
    }
    assert _render(tiny, source, U, parts, continue_final_message=True, add_generation_prompt=False) == (
        "[hi][one][two"
    )
    with pytest.raises(chat.ChatTemplateError, match="never reads"):
        _render(tiny, "{{ messages | length }}", U, continue_final_message=True, add_generation_prompt=False)
    with pytest.raises(chat.ChatTemplateError, match="no text"):
        empty = {"role": "assistant", "content": []}
        _render(tiny, source, U, empty, continue_final_message=True, add_generation_prompt=False)


# --- ids forwarded in the body --------------------------------------------------------------------


def test_forwarded_prompt_token_ids_are_taken_as_they_are(tiny: tokenizer.Tokenizer) -> None:
    """online_renderer._reused_prompt_token_ids: kv_transfer_params.prompt_token_ids skip the
    template and the tokenizer, unless echo is set or a message has non-text parts."""
    body = {"model": "m", "messages": [U], "kv_transfer_params": {"prompt_token_ids": [5, 6, 7]}}
    assert chat.encode_chat(tiny, body) == [5, 6, 7]
    rendered = chat.encode_chat(tiny, {"model": "m", "messages": [U]})
    assert chat.encode_chat(tiny, {**body, "echo": True}) == rendered
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}
    with pytest.raises(chat.UnsupportedChat):  # rendered then, and epp cannot render media
        chat.encode_chat(tiny, {**body, "messages": [image]})
    for bad in ([], [1, -1], [1, True], "1 2", [1.0]):
        with pytest.raises(chat.ChatTemplateError, match="prompt_token_ids"):
            chat.encode_chat(tiny, {**body, "kv_transfer_params": {"prompt_token_ids": bad}})
    # the request model's checks still apply, the template's do not
    with pytest.raises(chat.ChatTemplateError, match="needs tools"):
        chat.encode_chat(tiny, {**body, "tool_choice": "auto"})
    with pytest.raises(chat.ChatTemplateError, match="parameters"):
        chat.encode_chat(
            tiny, {**body, "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}
        )
    with pytest.raises(chat.ChatTemplateError, match="name"):
        chat.encode_chat(tiny, {**body, "messages": [{"role": "user", "content": "x", "name": 1}]})
    with pytest.raises(chat.ChatTemplateError, match="boolean"):
        chat.encode_chat(tiny, {**body, "add_generation_prompt": None})
    assert chat.encode_chat(tiny, {**body, "chat_template_kwargs": {"messages": []}}) == [5, 6, 7]
    # parts are validated only when read, and nothing reads them
    odd_parts = {"role": "user", "content": ["a", {"text": "no type"}, {"type": "input_text", "text": "x"}]}
    assert chat.encode_chat(tiny, {**body, "messages": [odd_parts]}) == [5, 6, 7]
    assert chat.prepare_chat(tiny, body) == chat.ChatPrompt(token_ids=[5, 6, 7])
    # no messages: refused when rendering, fine with forwarded ids
    assert chat.encode_chat(tiny, {**body, "messages": []}) == [5, 6, 7]
    with pytest.raises(chat.ChatTemplateError, match="must not be empty"):
        chat.encode_chat(tiny, {"model": "m", "messages": []})
