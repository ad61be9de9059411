"""Anthropic's Messages API as vLLM 0.32 serves it, step 1: the body as vLLM's request model reads
it (`validate`); `epp.tokenize.anthropic` converts what passes to the chat request vLLM renders.

Validation of `AnthropicMessagesRequest` (or `AnthropicCountTokensRequest`), pydantic's lax
mode: `model` a non-empty string; `messages` a list of `{role: user|assistant|system, content:
string | blocks}`; `max_tokens` an integer > 0 (not for count_tokens); blocks of the nine known
types, each field of its declared type; tool_addition/tool_removal blocks only in system
content, with a `tool` (a tool_reference or a tool_definition; removal only by reference);
`tools` with a string `name` and an object `input_schema`; `tool_choice` {auto, any, tool (with
a name), none}; `thinking` {enabled with budget_tokens >= 1024 and < max_tokens, disabled,
adaptive}; `output_config` {effort, format}; at most 4 `stop_sequences`; a `cache_salt` of
1-1024 characters; the other fields' types. A failure is a `RequestModelError`: vLLM answers it
400 in OpenAI's error shape (FastAPI's validation handler), everything later in Anthropic's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
TOOL_CHANGES = frozenset({"tool_addition", "tool_removal"})


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
    if kind in TOOL_CHANGES:
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
    if not allow_changes and any(b["type"] in TOOL_CHANGES for b in blocks):
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
