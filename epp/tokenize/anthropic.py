"""Anthropic's Messages API as vLLM 0.32 serves it: the chat request it renders for a body.

vLLM serves `/v1/messages`, `/v1/messages/count_tokens` and `/v1/messages/render` by turning the
body into a chat completions request and rendering that (vllm/entrypoints/anthropic/protocol.py
and serving.py, `AnthropicServingMessages.to_chat_completion_request`). `to_chat` repeats it:

1. **Validation** of `AnthropicMessagesRequest` (or `AnthropicCountTokensRequest`), pydantic's lax
   mode: `model` a non-empty string; `messages` a list of `{role: user|assistant|system, content:
   string | blocks}`; `max_tokens` an integer > 0 (not for count_tokens); blocks of the nine known
   types, each field of its declared type; tool_addition/tool_removal blocks only in system
   content, with a `tool` (a tool_reference or a tool_definition; removal only by reference);
   `tools` with a string `name` and an object `input_schema`; `tool_choice` {auto, any, tool (with
   a name), none}; `thinking` {enabled with budget_tokens >= 1024 and < max_tokens, disabled,
   adaptive}; `output_config` {effort, format}; at most 4 `stop_sequences`; a `cache_salt` of
   1-1024 characters; the other fields' types. A failure is a `RequestModelError`: vLLM answers it
   400 in OpenAI's error shape (FastAPI's validation handler), everything later in Anthropic's.
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from epp.lax import is_object, lax_bool, lax_float, lax_int
from epp.tokenize.chat_request import ChatTemplateError


class RequestModelError(ChatTemplateError):
    """vLLM's request model refuses the body: 400 in OpenAI's error shape (FastAPI's validation
    handler), even on the Anthropic routes."""


BLOCK_TYPES = frozenset(
    {"text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking",
     "tool_addition", "tool_removal"}
)  # fmt: skip
ROLES = frozenset({"user", "assistant", "system"})
EFFORTS = ("low", "medium", "high", "xhigh", "max")
MAX_STOP_STRINGS = 4  # VLLM_MAX_STOP_STRINGS's default
_BILLING_HEADER = "x-anthropic-billing-header"
_TOOL_CHANGES = frozenset({"tool_addition", "tool_removal"})
_MAX_CHAT_SALT = 128
_SALT_FORBIDDEN = frozenset("@/\\\x00")
SALT_RULE = (
    "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL."
)


@dataclasses.dataclass(frozen=True, slots=True)
class Converted:
    body: dict[str, Any]  # the chat completions body vLLM renders
    max_tokens: int | None  # the output budget (None for count_tokens)


# --- validation (step 1) --------------------------------------------------------------------------


def _fail(where: str, problem: str) -> RequestModelError:
    return RequestModelError(f"{where}: {problem}")


def _string(obj: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
    if key not in obj or (obj[key] is None and not required):
        if required:
            raise _fail(f"{where}.{key}" if where else key, "field required")
        return None
    value = obj[key]
    if not isinstance(value, str):
        raise _fail(f"{where}.{key}" if where else key, "must be a string")
    return value


def _optional(obj: Mapping[str, Any], key: str, where: str, read: Callable[[Any], Any], kind: str) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    out = read(value)
    if out is None:
        raise _fail(f"{where}.{key}" if where else key, f"must be {kind}")
    return out


def _object(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    return _optional(obj, key, where, lambda v: v if is_object(v) else None, "an object")  # type: ignore[no-any-return]


def _literal(obj: Mapping[str, Any], key: str, where: str, allowed: Sequence[str], *, required: bool) -> Any:
    value = obj.get(key) if key in obj else None
    if value is None and not required:
        return None
    if not isinstance(value, str) or value not in allowed:
        raise _fail(f"{where}.{key}" if where else key, f"must be one of {', '.join(map(repr, allowed))}")
    return value


def _tool(raw: Any, where: str) -> dict[str, Any]:
    if not is_object(raw):
        raise _fail(where, "must be an object")
    name = _string(raw, "name", where, required=True)
    schema = raw.get("input_schema")
    if not is_object(schema):
        raise _fail(f"{where}.input_schema", "must be an object")
    schema = dict(schema)
    schema.setdefault("type", "object")  # AnthropicTool's validator
    return {
        "name": name,
        "description": _string(raw, "description", where),
        "input_schema": schema,
        "strict": _optional(raw, "strict", where, lax_bool, "a boolean"),
        "defer_loading": _optional(raw, "defer_loading", where, lax_bool, "a boolean"),
    }


def _tool_change(raw: Any, where: str) -> dict[str, Any]:
    if not is_object(raw):
        raise _fail(where, "must be an object")
    kind = raw.get("type")
    if kind == "tool_reference":
        return {"type": kind, "name": _string(raw, "name", where, required=True)}
    if kind == "tool_definition":
        return {"type": kind, "definition": _tool(raw.get("definition"), f"{where}.definition")}
    raise _fail(f"{where}.type", "must be 'tool_reference' or 'tool_definition'")


def _block(raw: Any, where: str) -> dict[str, Any]:
    """One AnthropicContentBlock, its fields read as pydantic reads them."""
    if not is_object(raw):
        raise _fail(where, "must be an object")
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in BLOCK_TYPES:
        raise _fail(f"{where}.type", f"must be one of {sorted(BLOCK_TYPES)}")
    block: dict[str, Any] = {"type": kind}
    for key in ("text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data"):
        block[key] = _string(raw, key, where)
    block["source"] = _object(raw, "source", where)
    block["input"] = _object(raw, "input", where)
    content = raw.get("content")
    objects = isinstance(content, list) and all(is_object(item) for item in content)
    if not (content is None or isinstance(content, str) or objects):
        raise _fail(f"{where}.content", "must be a string or a list of objects")
    block["content"] = content
    block["is_error"] = _optional(raw, "is_error", where, lax_bool, "a boolean")
    tool = raw.get("tool")
    block["tool"] = None if tool is None else _tool_change(tool, f"{where}.tool")
    if kind in _TOOL_CHANGES:
        if block["tool"] is None:
            raise _fail(where, f"tool is required for {kind} blocks")
        if kind == "tool_removal" and block["tool"]["type"] != "tool_reference":
            raise _fail(where, "tool_removal only accepts a tool_reference")
    return block


def _content(raw: Any, where: str, *, allow_changes: bool) -> str | list[dict[str, Any]]:
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise _fail(where, "must be a string or a list of content blocks")
    blocks = [_block(b, f"{where}[{i}]") for i, b in enumerate(raw)]
    if not allow_changes and any(b["type"] in _TOOL_CHANGES for b in blocks):
        raise _fail(
            where, 'tool_addition and tool_removal blocks are only allowed in messages with role "system"'
        )
    return blocks


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise _fail("messages", "must be a list")
    out = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not is_object(msg):
            raise _fail(where, "must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _fail(f"{where}.role", "must be 'user', 'assistant' or 'system'")
        if "content" not in msg or msg["content"] is None:
            raise _fail(f"{where}.content", "field required")
        out.append(
            {
                "role": role,
                "content": _content(msg["content"], f"{where}.content", allow_changes=role == "system"),
            }
        )
    return out


def _thinking(raw: Any, max_tokens: int | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not is_object(raw):
        raise _fail("thinking", "must be an object")
    kind = _literal(raw, "type", "thinking", ("enabled", "disabled", "adaptive"), required=True)
    if kind != "disabled":
        _literal(raw, "display", "thinking", ("summarized", "omitted", "updates"), required=False)
    if kind != "enabled":
        return {"type": kind}
    budget = lax_int(raw.get("budget_tokens"))
    if budget is None:
        raise _fail("thinking.budget_tokens", "must be an integer")
    if budget < 1024:
        raise _fail("thinking.budget_tokens", "must be at least 1024")
    return {"type": kind, "budget_tokens": budget}


def _output_config(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not is_object(raw):
        raise _fail("output_config", "must be an object")
    effort = _literal(raw, "effort", "output_config", EFFORTS, required=False)
    fmt = raw.get("format")
    if fmt is not None:
        if not is_object(fmt):
            raise _fail("output_config.format", "must be an object")
        _object(fmt, "schema", "output_config.format")
        if "type" in fmt:
            _literal(fmt, "type", "output_config.format", ("json_schema",), required=True)
    return {"effort": effort, "format": fmt}


def _tool_choice(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not is_object(raw):
        raise _fail("tool_choice", "must be an object")
    kind = _literal(raw, "type", "tool_choice", ("auto", "any", "tool", "none"), required=True)
    name = _string(raw, "name", "tool_choice")
    disable = _optional(raw, "disable_parallel_tool_use", "tool_choice", lax_bool, "a boolean")
    if kind == "tool" and not name:
        raise _fail("tool_choice.name", "is required when type is 'tool'")
    return {"type": kind, "name": name, "disable_parallel_tool_use": disable}


def _vllm_xargs(raw: Any) -> None:
    if raw is None:
        return
    scalar = (str, int, float)
    if not is_object(raw) or not all(
        isinstance(v, scalar) or (isinstance(v, list) and all(isinstance(x, scalar) for x in v))
        for v in raw.values()
    ):
        raise _fail("vllm_xargs", "must be an object of strings, numbers or lists of them")


def validate(body: Mapping[str, Any], *, count_tokens: bool) -> dict[str, Any]:
    """The body as vLLM's request model reads it (step 1). Raises `RequestModelError`."""
    if not is_object(body):
        raise _fail("body", "must be an object")
    model = _string(body, "model", "", required=True)
    if not model:
        raise _fail("model", "Model is required")
    if "messages" not in body:
        raise _fail("messages", "field required")
    req: dict[str, Any] = {"model": model, "messages": _messages(body["messages"])}
    system = body.get("system")
    req["system"] = None if system is None else _content(system, "system", allow_changes=False)
    max_tokens: int | None = None
    if not count_tokens:
        if "max_tokens" not in body:
            raise _fail("max_tokens", "field required")
        found = lax_int(body["max_tokens"])
        if found is None:
            raise _fail("max_tokens", "must be an integer")
        if found <= 0:
            raise _fail("max_tokens", "max_tokens must be positive")
        max_tokens = found
    req["max_tokens"] = max_tokens
    req["thinking"] = _thinking(body.get("thinking"), max_tokens)
    req["output_config"] = _output_config(body.get("output_config"))
    req["tool_choice"] = _tool_choice(body.get("tool_choice"))
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _fail("tools", "must be a list")
    req["tools"] = None if tools is None else [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]
    req["chat_template_kwargs"] = _object(body, "chat_template_kwargs", "")
    if count_tokens:
        return req
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _fail("stop_sequences", "must be a list of strings")
        if len(stop) > MAX_STOP_STRINGS:
            raise _fail("stop_sequences", f"must have at most {MAX_STOP_STRINGS} items")
    req["stop_sequences"] = stop
    req["stream"] = _optional(body, "stream", "", lax_bool, "a boolean")
    for key in ("temperature", "top_p"):
        req[key] = _optional(body, key, "", lax_float, "a number")
    req["top_k"] = _optional(body, "top_k", "", lax_int, "an integer")
    req["watermarking"] = _optional(body, "watermarking", "", lax_bool, "a boolean")
    _optional(body, "return_mm_kwargs", "", lax_bool, "a boolean")
    if "mm_payload" in body:
        _literal(body, "mm_payload", "", ("tensors", "none"), required=True)
    for key in ("metadata", "kv_transfer_params", "ec_transfer_params"):
        req[key] = _object(body, key, "")
    _vllm_xargs(body.get("vllm_xargs"))
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not 1 <= len(salt) <= 1024):
        raise _fail("cache_salt", "must be a string of 1 to 1024 characters")
    req["cache_salt"] = salt
    thinking = req["thinking"]
    kv = req["kv_transfer_params"]
    remote_decode = kv is not None and kv.get("do_remote_decode")
    if thinking is not None and thinking["type"] == "enabled" and not remote_decode:
        assert max_tokens is not None
        if thinking["budget_tokens"] >= max_tokens:
            raise _fail("thinking.budget_tokens", "must be less than max_tokens")
    return req


# --- conversion (step 2) --------------------------------------------------------------------------


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
        if b["type"] in _TOOL_CHANGES
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
