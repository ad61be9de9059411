"""OpenAI's Responses API as vLLM 0.32 renders it: the chat request behind `/v1/responses` and
`/v1/responses/render` (vllm/entrypoints/openai/responses/protocol.py and utils.py,
renderers/online_renderer.py `render_responses`).

vLLM validates `input` against the OpenAI SDK's union of some sixty item types, then builds chat
messages from the items (`construct_input_messages`) and renders them with the chat template. epp
models the items chat-like clients send, and routes a request holding anything else without
token ids (`UnsupportedChat`: vLLM answers it, epp neither refuses nor guesses):

- `input` a string (one user message), or a list of:
  - messages `{role: user|system|developer, content: string | [input_text parts]}`, and
    `{role: assistant, content: string}`; an assistant output message (`type: "message"`,
    `content: [output_text parts]`) gives its first part's text;
  - `function_call` (`call_id`, `name`, `arguments` strings) as an assistant tool call, merged
    into the assistant message before it; `function_call_output` with a string `output` as a
    tool message; `reasoning` (its first `content` text, else its first summary text) as the
    assistant's reasoning, merged likewise; encrypted reasoning is refused, as vLLM refuses it;
- `instructions` as a first system message; function `tools` (other tool types: unsupported);
  `tool_choice` "none" / "auto" / "required" / a named function, with vLLM's checks (required or
  named without tools: 400; a name no tool has: 400); `reasoning.effort` as reasoning_effort
  (and enable_thinking, as for chat); `chat_template_kwargs`;
- a final assistant or reasoning item whose `status` is in_progress or incomplete is continued
  (`continue_final_message`) instead of answered;
- `previous_response_id` needs vLLM's response store: the render route refuses it (400); on
  /v1/responses the request routes without ids; `prompt` is refused; `background` is refused
  without `store` (both routes), and on /v1/responses at all (vLLM has no store unless
  VLLM_ENABLE_RESPONSES_API_STORE is set); `truncation: null` is refused on /v1/responses, whose
  answer cannot carry it (vLLM renders and serves it, then fails to build the response);
- the cache salt as vLLM checks it (1-128 characters, no '@', '/', '\\', NUL).

vLLM encodes the rendering with the tokenizer's special tokens added (a BOS template thus starts
with two), and with `truncation` other than "disabled" (its default is "disabled"; null is not)
it keeps the prompt's last `max_model_len - 1` tokens. `to_chat` returns the chat body for
`epp.tokenize.chat.prepare_chat(..., checked=True)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from epp.lax import is_object, lax_bool, lax_int
from epp.tokenize.anthropic import SALT_RULE
from epp.tokenize.anthropic_request import RequestModelError
from epp.tokenize.chat_request import ChatTemplateError, UnsupportedChat

EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
_ROLES = frozenset({"user", "system", "developer"})
_CONTINUED = frozenset({"in_progress", "incomplete"})
_MAX_SALT = 128
_SALT_FORBIDDEN = frozenset("@/\\\x00")


@dataclasses.dataclass(frozen=True, slots=True)
class Converted:
    body: dict[str, Any]  # the chat body vLLM renders
    max_output_tokens: int | None
    truncate: bool  # keep the last max_model_len - 1 tokens (truncation other than "disabled")


def to_chat(body: Mapping[str, Any], *, render: bool) -> Converted:
    """The chat body vLLM renders for a Responses body (`render`: the /render route).

    Raises:
        RequestModelError / ChatTemplateError: vLLM refuses the request (400).
        UnsupportedChat: epp does not model part of it (route without token ids).
    """
    if not is_object(body):
        raise RequestModelError("the body must be an object")
    _check_fields(body, render=render)
    raw_input = body.get("input")
    tools = _tools(body.get("tools", []))
    _check_tool_choice(body.get("tool_choice", "auto"), tools)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    continue_final = False
    if isinstance(raw_input, str):
        messages.append({"role": "user", "content": raw_input})
    else:
        assert isinstance(raw_input, list)
        own: list[dict[str, Any]] = []
        for i, item in enumerate(raw_input):
            _item(item, i, own)
        messages.extend(own)
        continue_final = _continues(raw_input)
    chat: dict[str, Any] = {
        "messages": messages,
        "add_generation_prompt": not continue_final,
        "continue_final_message": continue_final,
        "add_special_tokens": True,
    }
    reasoning = body.get("reasoning")
    if is_object(reasoning) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    for key in ("chat_template_kwargs", "kv_transfer_params", "cache_salt"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if tools:
        chat["tools"] = tools
    budget = body.get("max_output_tokens")
    max_output = None if budget is None else lax_int(budget)
    return Converted(chat, max_output, body.get("truncation", "disabled") != "disabled")


def _check_fields(body: Mapping[str, Any], *, render: bool) -> None:
    if "input" not in body or body["input"] is None:
        raise RequestModelError("input: field required")
    if not isinstance(body["input"], str | list):
        raise RequestModelError("input: must be a string or a list of items")
    for key in ("model", "instructions", "previous_response_id"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise RequestModelError(f"{key}: must be a string")
    if body.get("prompt") is not None:
        raise RequestModelError("prompt template is not supported")
    if body.get("max_output_tokens") is not None and lax_int(body["max_output_tokens"]) is None:
        raise RequestModelError("max_output_tokens: must be an integer")
    truncation = body.get("truncation")
    if truncation is not None and truncation not in ("auto", "disabled"):
        raise RequestModelError("truncation: must be 'auto' or 'disabled'")
    for key in ("stream", "store", "background"):
        if body.get(key) is not None and lax_bool(body[key]) is None:
            raise RequestModelError(f"{key}: must be a boolean")
    if body.get("background") and not body.get("store", True):  # vLLM tests the raw values' truth
        raise RequestModelError("background can only be used when `store` is true")
    if not render and lax_bool(body.get("background")) and lax_bool(body.get("store", True)) is not False:
        # the store is off unless the server sets VLLM_ENABLE_RESPONSES_API_STORE
        raise ChatTemplateError("background mode needs the response store, which vLLM has off by default")
    if not render and "truncation" in body and body["truncation"] is None:
        # vLLM serves it, then fails to build its answer (ResponsesResponse takes no null): 400
        raise ChatTemplateError("truncation: Input should be 'auto' or 'disabled'")
    if body.get("chat_template_kwargs") is not None and not is_object(body["chat_template_kwargs"]):
        raise RequestModelError("chat_template_kwargs: must be an object")
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not is_object(reasoning):
            raise RequestModelError("reasoning: must be an object")
        effort = reasoning.get("effort")
        if effort is not None and effort not in EFFORTS:
            raise RequestModelError(f"reasoning.effort: must be one of {sorted(EFFORTS)}")
    _check_salt(body.get("cache_salt"))
    if body.get("previous_response_id") is not None:
        if render:
            raise ChatTemplateError("previous_response_id is not supported by the stateless render endpoint.")
        raise UnsupportedChat("previous_response_id: the history is in vLLM's response store")
    if body.get("previous_input_messages") is not None:
        raise UnsupportedChat("previous_input_messages (Harmony models only)")


def _check_salt(salt: Any) -> None:
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise RequestModelError("Parameter 'cache_salt' must be a non-empty string if provided.")
    if len(salt) > _MAX_SALT or not _SALT_FORBIDDEN.isdisjoint(salt):
        raise RequestModelError(SALT_RULE)


def _tools(raw: Any) -> list[dict[str, Any]]:
    """Function tools as vLLM hands them to the template (other tool types: unsupported)."""
    if not isinstance(raw, list):
        raise RequestModelError("tools: must be a list")
    out = []
    for i, tool in enumerate(raw):
        if not is_object(tool) or tool.get("type") != "function":
            raise UnsupportedChat(f"tools[{i}]: only function tools are modelled")
        name, params, description = tool.get("name"), tool.get("parameters"), tool.get("description")
        if not isinstance(name, str):
            raise RequestModelError(f"tools[{i}].name: must be a string")
        if params is not None and not is_object(params):
            raise RequestModelError(f"tools[{i}].parameters: must be an object")
        if description is not None and not isinstance(description, str):
            raise RequestModelError(f"tools[{i}].description: must be a string")
        function: dict[str, Any] = {"name": name, "description": description, "parameters": params}
        for key in ("strict", "defer_loading"):
            value = tool.get(key)
            if value is not None:
                found = lax_bool(value)
                if found is None:
                    raise RequestModelError(f"tools[{i}].{key}: must be a boolean")
                function[key] = found
        out.append({"type": "function", "function": function})
    return out


def _check_tool_choice(choice: Any, tools: list[dict[str, Any]]) -> None:
    """vLLM's check_tool_usage on the modelled choices."""
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise RequestModelError("tool_choice: must be 'none', 'auto', 'required' or a tool")
        if choice == "required" and not tools:
            raise RequestModelError("Tool choice 'required' must be specified with 'tools' parameter.")
        return
    if not is_object(choice) or choice.get("type") != "function" or set(choice) - {"type", "name"}:
        raise UnsupportedChat("tool_choice: only none, auto, required and a named function are modelled")
    name = choice.get("name")
    if not isinstance(name, str):
        raise RequestModelError("tool_choice.name: must be a string")
    if not name or name not in {t["function"]["name"] for t in tools}:
        raise RequestModelError("Tool choice 'function' not found in 'tools' parameter.")


def _item(item: Any, index: int, out: list[dict[str, Any]]) -> None:
    """One input item, appended to `out` or merged into its last assistant message."""
    where = f"input[{index}]"
    if not is_object(item):
        raise UnsupportedChat(f"{where}: not an object")
    kind = item.get("type", "message")
    prev = out[-1] if out and out[-1].get("role") == "assistant" else None
    if kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise UnsupportedChat(f"{where}.{key}: not a string")
        if item.get("namespace") is not None:
            raise UnsupportedChat(f"{where}: namespaced tools are not modelled")
        call = {
            "id": item["call_id"],
            "function": {"name": item["name"], "arguments": item["arguments"]},
            "type": "function",
        }
        if prev is not None and isinstance(prev.get("tool_calls"), list):
            prev["tool_calls"].append(call)
        elif prev is not None and "tool_calls" not in prev:
            prev["tool_calls"] = [call]
        else:
            out.append({"role": "assistant", "tool_calls": [call]})
        return
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
            raise UnsupportedChat(f"{where}: only string outputs are modelled")
        out.append({"role": "tool", "content": item["output"], "tool_call_id": item["call_id"]})
        return
    if kind == "reasoning":
        _reasoning(item, where, prev, out)
        return
    if kind != "message":
        raise UnsupportedChat(f"{where}: items of type {kind!r} are not modelled")
    role, content = item.get("role"), item.get("content")
    if role == "assistant":
        text = _assistant_text(item, where)
        if prev is not None and prev.get("content") is None:
            prev["content"] = text
        else:
            out.append({"role": "assistant", "content": text})
        return
    if not isinstance(role, str) or role not in _ROLES:  # a list or object is unhashable
        raise UnsupportedChat(f"{where}.role: {role!r} is not modelled")
    if isinstance(content, list):
        if not all(
            is_object(p) and p.get("type") == "input_text" and isinstance(p.get("text"), str) for p in content
        ):
            raise UnsupportedChat(f"{where}.content: only input_text parts are modelled")
        content = [{"type": "input_text", "text": p["text"]} for p in content]
    elif not isinstance(content, str):
        raise UnsupportedChat(f"{where}.content: not a string or parts")
    out.append({"role": role, "content": content})


def _assistant_text(item: Mapping[str, Any], where: str) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    output = (
        isinstance(content, list)
        and content
        and "type" in item
        and all(
            is_object(p) and p.get("type") == "output_text" and isinstance(p.get("text"), str)
            for p in content
        )
    )
    if not output:
        raise UnsupportedChat(f"{where}.content: only a string or output_text parts are modelled")
    status = item.get("status", "completed")
    if status not in ("completed", "in_progress", "incomplete") or not isinstance(item.get("id", ""), str):
        raise UnsupportedChat(f"{where}: not an output message vLLM reads as such")
    assert isinstance(content, list)
    return str(content[0]["text"])


def _reasoning(
    item: Mapping[str, Any], where: str, prev: dict[str, Any] | None, out: list[dict[str, Any]]
) -> None:
    summary, content = item.get("summary"), item.get("content")
    texts_ok = (
        isinstance(summary, list)
        and all(
            is_object(s) and s.get("type") == "summary_text" and isinstance(s.get("text"), str)
            for s in summary
        )
        and (
            content is None
            or (
                isinstance(content, list)
                and all(
                    is_object(c) and c.get("type") == "reasoning_text" and isinstance(c.get("text"), str)
                    for c in content
                )
            )
        )
        and isinstance(item.get("id", ""), str)
        and item.get("status", "completed") in ("completed", "in_progress", "incomplete")
    )
    if not texts_ok:
        raise UnsupportedChat(f"{where}: a reasoning item vLLM may read another way")
    if item.get("encrypted_content"):
        raise ChatTemplateError("Encrypted content is not supported.")
    assert isinstance(summary, list)
    text = ""
    if content:
        text = content[0]["text"]
    elif summary:
        text = summary[0]["text"]
    if prev is not None and prev.get("reasoning") is None:
        prev["reasoning"] = text
    else:
        out.append({"role": "assistant", "reasoning": text})


def _continues(items: list[Any]) -> bool:
    """vLLM's should_continue_final_message: the last item is a partial message or reasoning."""
    if not items or not is_object(items[-1]):
        return False
    last = items[-1]
    if last.get("type", "message") not in ("message", "reasoning"):
        return False
    status = last.get("status")
    return isinstance(status, str) and status in _CONTINUED
