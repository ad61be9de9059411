"""Anthropic's Messages API as vLLM 0.32 serves it: the chat request it renders for a body.

vLLM serves `/v1/messages`, `/v1/messages/count_tokens` and `/v1/messages/render` by turning the
body into a chat completions request and rendering that (vllm/entrypoints/anthropic/protocol.py
and serving.py, `AnthropicServingMessages.to_chat_completion_request`). `to_chat` repeats it:

1. **Validation** of `AnthropicMessagesRequest` (or `AnthropicCountTokensRequest`):
   `epp.tokenize.anthropic_request`. A failure is a `RequestModelError`: vLLM answers it 400 in
   OpenAI's error shape (FastAPI's validation handler), everything later in Anthropic's.
2. **Conversion**, step by step as vLLM: the system prompt (the top-level `system`, its text
   blocks joined without a separator, Claude Code's billing-header blocks dropped; inline system
   messages merged into it when the template requires system-first ordering, else kept in place);
   text blocks as text parts (a single one as a string), thinking as `reasoning`, tool_use as tool
   calls (`arguments` = json.dumps(input)), a user's tool_result as a tool message placed before
   the user's own (its text blocks joined by newlines; tool references as a second tool message),
   an assistant's tool_result as "Tool result: " + Python's str() of its content; a user message
   left without content dropped; tools after their tool_addition/tool_removal blocks, as function
   tools; `thinking: disabled` as reasoning_effort "none" (or "low", when the template renders
   "none" like an effort: `disabled_thinking_effort`; the render route always says "none"),
   `output_config.effort` as reasoning_effort; `max_tokens` as both max_tokens and
   max_completion_tokens.
3. **The chat request's own checks** that run on the converted request (its constructor): the
   cache salt's rules (at most 128 characters, no '@', '/', '\\', NUL). tools and tool_choice are
   set after construction in vLLM, so its chat checks of them (`tools: []`, a named choice without
   tools) do not run: `tools: []` reaches the template as an empty list. A tool choice naming a
   tool the (resolved, non-empty) tools lack is refused by the tool parser's grammar for a forced
   call, as on pods that run a tool parser (tools need one).

The result is a chat body for `epp.tokenize.chat.prepare_chat(..., checked=True)`.
Images (image blocks, images in tool results) are media: the chat step routes such requests
without token ids (`UnsupportedChat`), as it does for chat.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from epp.lax import is_object
from epp.tokenize.anthropic_request import EFFORTS, TOOL_CHANGES, validate
from epp.tokenize.chat_request import ChatTemplateError

_BILLING_HEADER = "x-anthropic-billing-header"
_MAX_CHAT_SALT = 128
_SALT_FORBIDDEN = frozenset("@/\\\x00")
SALT_RULE = (
    "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL."
)


@dataclasses.dataclass(frozen=True, slots=True)
class Converted:
    body: dict[str, Any]  # the chat completions body vLLM renders
    max_tokens: int | None  # the output budget (None for count_tokens)


def to_chat(
    body: Mapping[str, Any],
    *,
    count_tokens: bool,
    merge_inline_system: bool,
    disabled_thinking_effort: str = "none",
) -> Converted:
    """The chat completions body vLLM renders for an Anthropic body (module docstring).

    Raises:
        RequestModelError: vLLM's request model refuses the body (400, OpenAI's shape).
        ChatTemplateError: vLLM refuses it later (400, Anthropic's shape on /v1/messages).
    """
    req = validate(body, count_tokens=count_tokens)
    messages: list[dict[str, Any]] = []
    _system_message(req, messages, merge_inline_system)
    for msg in req["messages"]:
        _message(msg, messages, merge_inline_system)
    chat: dict[str, Any] = {"model": req["model"], "messages": messages}
    if req["chat_template_kwargs"] is not None:
        chat["chat_template_kwargs"] = dict(req["chat_template_kwargs"])
    if not count_tokens:
        chat["max_tokens"] = chat["max_completion_tokens"] = req["max_tokens"]
        for key in ("kv_transfer_params", "cache_salt"):
            if req[key] is not None:
                chat[key] = req[key]
        _check_chat_salt(req["cache_salt"])
    config = req["output_config"]
    if config is not None and config["effort"] is not None:
        chat["reasoning_effort"] = config["effort"]
    thinking = req["thinking"]
    if thinking is not None and thinking["type"] == "disabled":
        chat["reasoning_effort"] = disabled_thinking_effort
    tools = _resolve_tools(req)
    if tools is not None:
        chat["tools"] = [_chat_tool(t) for t in tools]
        choice = req["tool_choice"]
        named = choice is not None and choice["type"] == "tool"
        if tools and named and choice["name"] not in {t["name"] for t in tools}:
            # the tool parser's grammar for a forced call (vLLM's chat checks did not run on it)
            raise ChatTemplateError(f"The tool with name {choice['name']!r} is not found in the tools list.")
    return Converted(chat, req["max_tokens"])


def _check_chat_salt(salt: str | None) -> None:
    """The chat request's own salt rule, checked when vLLM constructs it from the converted body."""
    if salt is not None and (len(salt) > _MAX_CHAT_SALT or not _SALT_FORBIDDEN.isdisjoint(salt)):
        raise ChatTemplateError(SALT_RULE)


def _text_of_system(content: str | list[dict[str, Any]]) -> str | None:
    """An inline system message's text (vLLM's _extract_system_text): None when empty."""
    if isinstance(content, str):
        return None if content.startswith(_BILLING_HEADER) else content
    parts = _system_texts(content)
    return "".join(parts) if parts else None


def _system_texts(blocks: list[dict[str, Any]]) -> list[str]:
    """A system prompt's non-empty text blocks, without Claude Code's billing header."""
    return [
        b["text"]
        for b in blocks
        if b["type"] == "text" and b["text"] and not b["text"].startswith(_BILLING_HEADER)
    ]


def _system_message(req: Mapping[str, Any], out: list[dict[str, Any]], merge_inline: bool) -> None:
    parts: list[str] = []
    system = req["system"]
    if system:
        if isinstance(system, str):
            parts.append(system)
        else:
            parts.extend(_system_texts(system))
    if merge_inline:
        for msg in req["messages"]:
            if msg["role"] == "system":
                text = _text_of_system(msg["content"])
                if text:
                    parts.append(text)
    if parts:
        out.append({"role": "system", "content": "".join(parts)})


def _message(msg: Mapping[str, Any], out: list[dict[str, Any]], merge_inline: bool) -> None:
    role = msg["role"]
    if role == "system":
        if not merge_inline:
            text = _text_of_system(msg["content"])
            if text:
                out.append({"role": "system", "content": text})
        return
    converted: dict[str, Any] = {"role": role}
    content = msg["content"]
    if isinstance(content, str):
        converted["content"] = content
    else:
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for block in content:
            _block_to_chat(block, role, parts, calls, reasoning, out)
        if reasoning:
            converted["reasoning"] = "".join(reasoning)
        if calls:
            converted["tool_calls"] = calls
        if parts:
            one_text = len(parts) == 1 and parts[0]["type"] == "text"
            converted["content"] = parts[0]["text"] if one_text else parts
    if not (role == "user" and "content" not in converted):
        out.append(converted)


def _block_to_chat(
    block: Mapping[str, Any],
    role: str,
    parts: list[dict[str, Any]],
    calls: list[dict[str, Any]],
    reasoning: list[str],
    out: list[dict[str, Any]],
) -> None:
    kind = block["type"]
    if kind == "text" and block["text"]:
        parts.append({"type": "text", "text": block["text"]})
    elif kind == "image" and block["source"]:
        parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
    elif kind == "thinking" and block["thinking"] is not None:
        reasoning.append(block["thinking"])
    elif kind == "tool_use":
        calls.append(
            {
                # vLLM's own fallback id: the time in seconds, as it prints it.
                "id": block["id"] or f"call_{int(time.time())}",
                "type": "function",
                "function": {"name": block["name"] or "", "arguments": _dumps(block["input"] or {})},
            }
        )
    elif kind == "tool_result":
        if role == "user":
            _user_tool_result(block, out)
        else:
            text = _python_str(block["content"]) if block["content"] else ""
            parts.append({"type": "text", "text": f"Tool result: {text}"})


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value)
    except (ValueError, RecursionError) as e:  # NaN cannot come from JSON; depth is epp's limit
        raise ChatTemplateError(f"tool_use input: {e}") from None


def _python_str(value: Any) -> str:
    """Python's str() of a decoded JSON value, as vLLM formats an assistant's tool_result."""
    return str(value)


def _image_url(source: Mapping[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _user_tool_result(block: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
    text = ""
    images: list[str] = []
    references: list[dict[str, Any]] = []
    content = block["content"]
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts: list[Any] = []
        for item in content:
            kind = item.get("type")
            if kind == "text":
                texts.append(item.get("text", ""))
            elif kind == "image":
                source = item.get("source", {})
                if not is_object(source):
                    raise ChatTemplateError("tool_result: an image source must be an object")
                images.append(_image_url(source))
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        if not all(isinstance(t, str) for t in texts):
            raise ChatTemplateError("tool_result: a text block's text must be a string")  # vLLM: TypeError
        text = "\n".join(texts)
    call_id = block["tool_use_id"] or ""
    out.append({"role": "tool", "tool_call_id": call_id, "content": text or ""})
    if images:
        out.append(
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]}
        )
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})


def _resolve_tools(req: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The tools in effect after the messages' tool_addition/tool_removal blocks."""
    changes = [
        b
        for msg in req["messages"]
        if not isinstance(msg["content"], str)
        for b in msg["content"]
        if b["type"] in TOOL_CHANGES
    ]
    if not changes:
        return req["tools"]  # type: ignore[no-any-return]
    tools = {t["name"]: t for t in req["tools"] or []}
    removed: set[str] = set()
    for block in changes:
        change = block["tool"]
        if change["type"] == "tool_definition":
            name = change["definition"]["name"]
            tools[name] = change["definition"]
        else:
            name = change["name"]
            if name not in tools:
                raise ChatTemplateError(
                    f"{block['type']} references tool {name!r}, which is not declared in tools"
                )
            if block["type"] == "tool_addition":
                tools[name] = {**tools[name], "defer_loading": None}
        if block["type"] == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [t for name, t in tools.items() if name not in removed]


def _chat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {
        "name": tool["name"],
        "description": tool["description"],
        "parameters": tool["input_schema"],
    }
    for key in ("strict", "defer_loading"):
        if tool[key] is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


# --- what vLLM decides from the template --------------------------------------------------------


@functools.lru_cache(maxsize=64)
def merge_inline_system(chat_template: str | None) -> bool:
    """Whether vLLM merges inline system messages into the leading one for this template: when
    rendering [system, user, system, user] in a plain sandboxed Jinja environment fails (vLLM's
    `_detect_merge_inline_system`; no template: merged)."""
    if not chat_template:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    probe = [
        {"role": "system", "content": "t"},
        {"role": "user", "content": "t"},
        {"role": "system", "content": "t"},
        {"role": "user", "content": "t"},
    ]
    try:
        env.from_string(chat_template).render(messages=probe, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    except Exception:  # vLLM 0.32 fails to start with such a template: merging is as good as any
        return True
    return False


def disabled_thinking_effort(render: Callable[[str], str | None]) -> str:
    """What `thinking: {"type": "disabled"}` becomes on /v1/messages and count_tokens: "none",
    unless the template renders "none" as it renders some effort (or fails on it), then "low"
    (vLLM's `_probe_disabled_thinking_effort`). `render(effort)` is the prompt text of a one-message
    chat ("Hi") with that reasoning_effort, None when it fails."""
    none = render("none")
    if none is None:
        return "low"
    return "low" if any(render(effort) == none for effort in EFFORTS) else "none"
