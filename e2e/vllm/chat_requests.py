"""Varied OpenAI request bodies for the differential tests against vLLM, generated from a seed.

Each `Case` is one request: its API path and body, sent as it is to vLLM and to epp
(e2e/vllm/differential.py). The styles are the served aliases of the suite's model
(e2e/vllm/build_model.py): `tiny` (epp-tiny's own template, string content) and one per template
in templates/. A style's body carries its template as `chat_template` (vLLM renders it under
--trust-request-chat-template; epp renders the same template from `--tokenizer STYLE=DIR`).
`probe` prints everything it is given (message keys in order, tools, documents, the optional
template variables), so any reshaping epp does differently shows in the ids.

What varies, as issue 15 asks: completions (text, token ids, batches, add_special_tokens spelled
the lax ways pydantic reads); chat with system/developer messages (one, several, not first, with
Claude Code's billing header line), multi-turn, content as parts (text, input_text, output_text,
refusal, thinking, strings, empty and null texts, extra keys), tools (with and without description
or parameters, unknown keys, `strict`), tool_choice, assistant tool calls (arguments valid,
invalid, an array, empty; keys in another order; extra keys) and tool results, `reasoning` and
its older name `reasoning_content` (alone, both, one null), `name`s, `add_generation_prompt` /
`continue_final_message` (as booleans and as strings), `chat_template_kwargs` (overriding the
request's own fields too, null and "auto" values), `reasoning_effort`, `documents`,
`add_special_tokens`, odd whitespace and Unicode and the style's control-token strings, long
prompts, prompts longer than the context, and requests vLLM refuses (malformed tool calls,
unknown part types, `tools: []`, bad `tool_choice`, an unknown `reasoning_effort`, null booleans).
Every body has `max_tokens` 1 unless a case is about the length limit (`boundary_cases`).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.vllm.texts import mixed_text, sentence_soup

TEMPLATES = Path(__file__).resolve().parent / "templates"
MAX_MODEL_LEN = 2048  # e2e/vllm/fleet.py serves every model with this context
# Control strings of each style, spliced into content now and then: both sides must split them
# off as single ids.
CONTROL = {
    "llama3-tools": ["<|eot_id|>", "<|start_header_id|>user<|end_header_id|>"],
    "chatml-tools": ["<|im_end|>", "<tool_call>"],
    "mistral-tools": ["[INST]", "[/INST]"],
    "parts": [],
    "probe": ["<|user|>", "CONTINUE_FINAL_MESSAGE_TAG"],
    "tiny": ["<|user|>", "</s>"],
}
TOOL_STYLES = ("tiny", "llama3-tools", "chatml-tools", "mistral-tools", "probe")
# Styles whose template takes any role order (mistral and llama3 have rules of their own).
FREE_STYLES = ("tiny", "chatml-tools", "parts", "probe")
ODD_UNICODE = (
    "zero\u200bwidth",
    "e\u0301 combining",
    "crlf\r\nline",
    "nbsp\u00a0here",
    "\u202eright-to-left\u202c",
    "\ufeffbom",
    "tabs\t\t\tand  spaces   ",
    # "Unicode Here" in Fraktur letters (outside the BMP but the H)
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522"
    " \u210c\U0001d522\U0001d52f\U0001d522",
    "x-anthropic-billing-header: not at the start",
)
BILLING = "x-anthropic-billing-header: cc_version=1.0; cch=%05d;"


@dataclasses.dataclass(frozen=True)
class Case:
    path: str
    body: dict[str, Any]
    kind: str = ""  # what the case is about, for the report

    def describe(self) -> str:
        shown = {k: v for k, v in self.body.items() if k != "chat_template"}
        return f"{self.kind} {self.path} {json.dumps(shown, ensure_ascii=False)[:900]}"

    @property
    def style(self) -> str:
        return str(self.body.get("model", ""))


def templates() -> dict[str, str]:
    return {p.stem.replace("_", "-"): p.read_text() for p in sorted(TEMPLATES.glob("*.jinja"))}


def styles() -> dict[str, str | None]:
    return {"tiny": None, **templates()}


def _text(rng: random.Random, style: str, max_words: int = 30) -> str:
    text = mixed_text(rng, max_words)
    if rng.random() < 0.1:
        odd = rng.choice(ODD_UNICODE)
        cut = rng.randint(0, len(text))
        text = text[:cut] + odd + text[cut:]
    if CONTROL[style] and rng.random() < 0.12:
        cut = rng.randint(0, len(text))
        text = text[:cut] + rng.choice(CONTROL[style]) + text[cut:]
    return text


def _part(rng: random.Random, style: str, role: str) -> Any:
    roll = rng.random()
    text = _text(rng, style, 12)
    part: Any
    if roll < 0.55:
        part = {"type": "text", "text": text}
    elif roll < 0.62:
        part = {"type": rng.choice(["input_text", "output_text"]), "text": text}
    elif roll < 0.68:
        part = {"type": "text", "text": ""}
    elif roll < 0.72:
        part = {"type": "text", "text": None}  # skipped by vLLM
    elif roll < 0.78:
        part = text  # a bare string part
    elif roll < 0.84 and role == "assistant":
        part = {"type": "refusal", "refusal": text}
    elif roll < 0.9 and role == "assistant":
        part = {"type": "thinking", "thinking": text, "closed": rng.random() < 0.5}
    else:
        part = {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}
    if isinstance(part, dict) and rng.random() < 0.2:
        part = dict(reversed(list(part.items())))  # key order must not matter
    return part


def _content(rng: random.Random, style: str, role: str = "user") -> str | list[Any]:
    if rng.random() < 0.3:
        return [_part(rng, style, role) for _ in range(rng.randint(1, 3))]
    return _text(rng, style)


def _tool(rng: random.Random, i: int) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": f"tool_{i}_{rng.choice(['lookup', 'order', 'weather', 'search'])}"}
    if rng.random() < 0.8:
        fn["description"] = sentence_soup(rng, rng.randint(3, 12))
    if rng.random() < 0.8:
        fn["parameters"] = {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": sentence_soup(rng, 4)},
                "limit": {"type": "integer", "minimum": 1},
            },
            "required": ["query"],
        }
    if rng.random() < 0.2:
        fn["strict"] = rng.choice([True, False, "true", 0])
    if rng.random() < 0.05:
        fn["defer_loading"] = rng.random() < 0.5
    if rng.random() < 0.1:
        fn["x-extra"] = "dropped by vLLM"
    tool: dict[str, Any] = {"type": "function", "function": fn}
    if rng.random() < 0.15:
        tool["x-unknown"] = "dropped by vLLM"
    if rng.random() < 0.05:
        tool["defer_loading"] = True  # copied into the function when it has none
    if rng.random() < 0.15:
        tool = {"function": fn, "type": "function"}
    return tool


def _arguments(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.7:
        return json.dumps(
            {"query": sentence_soup(rng, 3), "limit": rng.randint(1, 9)}, ensure_ascii=rng.random() < 0.5
        )
    if roll < 0.8:
        return '{"query": "unterminated'
    if roll < 0.88:
        return "[1, 2]"
    if roll < 0.94:
        return "null"
    return ""


def _tool_call(rng: random.Random, name: str, call_id: str) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name, "arguments": _arguments(rng)}
    call: dict[str, Any] = {"id": call_id, "type": "function", "function": fn}
    roll = rng.random()
    if roll < 0.2:
        call = {"function": {"arguments": fn["arguments"], "name": name}, "type": "function", "id": call_id}
    elif roll < 0.3:
        call["index"] = 0  # streaming clients echo deltas back with their index
    elif roll < 0.35:
        fn["x-extra"] = True
    return call


def _tool_turn(
    rng: random.Random, style: str, tools: list[dict[str, Any]], turn: int
) -> list[dict[str, Any]]:
    """An assistant message calling 1-2 tools, then one tool message per call."""
    calls = []
    for k in range(rng.randint(1, 2)):
        name = rng.choice(tools)["function"]["name"] if tools else "tool_x"
        calls.append(_tool_call(rng, name, f"call{turn}x{k}ab"[:9]))  # Mistral: 9 alphanumerics
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": rng.choice([None, "", "Let me check."]),
        "tool_calls": calls,
    }
    if rng.random() < 0.1:
        assistant.pop("content")
    results: list[dict[str, Any]] = []
    for call in calls:
        content: Any = sentence_soup(rng, rng.randint(2, 10))
        if rng.random() < 0.25:
            content = [{"type": "text", "text": sentence_soup(rng, 3)} for _ in range(rng.randint(0, 2))]
            if rng.random() < 0.2:
                content.append({"type": "tool_reference", "name": call["function"]["name"]})
        result = {"role": "tool", "tool_call_id": call["id"], "content": content}
        if rng.random() < 0.1:
            result["name"] = call["function"]["name"]
        results.append(result)
    return [assistant, *results]


def _reasoning(rng: random.Random, msg: dict[str, Any]) -> None:
    """`reasoning` and its older name `reasoning_content`, in the combinations vLLM resolves."""
    roll = rng.random()
    r1, r2 = sentence_soup(rng, 6), sentence_soup(rng, 6)
    if roll < 0.3:
        msg["reasoning"] = r1
    elif roll < 0.6:
        msg["reasoning_content"] = r1
    elif roll < 0.75:
        msg["reasoning"], msg["reasoning_content"] = r1, r2  # reasoning wins
    elif roll < 0.9:
        msg["reasoning"], msg["reasoning_content"] = None, r2  # the old name fills a null
    else:
        msg["reasoning_content"] = None


def _system(rng: random.Random, style: str) -> dict[str, Any]:
    role = "developer" if rng.random() < 0.2 else "system"
    content: Any = _content(rng, style, role)
    if rng.random() < 0.12:
        header = BILLING % rng.randrange(100000)
        roll = rng.random()
        if roll < 0.4:
            content = header + "\n" + _text(rng, style)
        elif roll < 0.6:
            content = header
        else:
            content = [
                {"type": "text", "text": header + rng.choice(["", "\n" + _text(rng, style)])},
                _text(rng, style),
            ]
    msg: dict[str, Any] = {"role": role, "content": content}
    if rng.random() < 0.1:
        msg["name"] = "ops"
    if role == "developer" and rng.random() < 0.3:
        msg["tools"] = [_tool(rng, 9)]  # kept on the message where the template knows the role
    return msg


def chat_case(rng: random.Random, style: str, template: str | None, *, long_words: int = 0) -> Case:
    free = style in FREE_STYLES
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append(_system(rng, style))
    tools = (
        [_tool(rng, i) for i in range(rng.randint(1, 3))]
        if style in TOOL_STYLES and rng.random() < 0.35
        else []
    )
    for turn in range(rng.randint(1, 4)):
        user: dict[str, Any] = {"role": "user", "content": _content(rng, style)}
        if rng.random() < 0.1:
            user["name"] = rng.choice(["alice", "bob smith", "ünï"])
        if free and rng.random() < 0.05:
            user["task"] = "summarise"
        messages.append(user)
        if free and rng.random() < 0.08:
            messages.append(_system(rng, style))  # a system or developer message mid-chat
        if tools and rng.random() < 0.5:
            messages += _tool_turn(rng, style, tools, turn)
            messages.append({"role": "assistant", "content": _text(rng, style)})
        elif rng.random() < 0.85:
            assistant: dict[str, Any] = {"role": "assistant", "content": _content(rng, style, "assistant")}
            if style in ("chatml-tools", "probe") and rng.random() < 0.4:
                _reasoning(rng, assistant)
            if rng.random() < 0.05:
                assistant["tool_calls"] = []
            if rng.random() < 0.05:
                assistant["name"] = "helper"
            messages.append(assistant)
    if messages[-1]["role"] == "assistant" and rng.random() < 0.6:
        messages.append({"role": "user", "content": _content(rng, style)})
    if long_words:
        messages[-1 if messages[-1]["role"] == "user" else 0] = {
            "role": "user",
            "content": sentence_soup(rng, long_words),
        }
    body: dict[str, Any] = {"model": style, "messages": messages, "max_tokens": 1}
    if template is not None:
        body["chat_template"] = template
    if tools:
        body["tools"] = tools
        if rng.random() < 0.4:
            body["tool_choice"] = rng.choice(
                [
                    "none",
                    "auto",
                    "required",
                    {"type": "function", "function": {"name": tools[0]["function"]["name"]}},
                ]
            )
    _generation_flags(rng, body)
    _template_kwargs(rng, style, body)
    if rng.random() < 0.05:
        body["add_special_tokens"] = rng.choice([True, "true", 1, "yes"])  # BOS from the post-processor too
    if style == "probe" and rng.random() < 0.15:
        body["documents"] = [{"title": "doc", "text": sentence_soup(rng, 6)}]
    _extras(rng, body)
    return Case("/v1/chat/completions", body, "long chat" if long_words else "chat")


def _extras(rng: random.Random, body: dict[str, Any]) -> None:
    """Fields beside the prompt that change what vLLM does with it: a cache salt, prompt ids
    forwarded from a prefill stage (chat), truncation (`truncate_prompt_tokens`)."""
    if rng.random() < 0.05:
        body["cache_salt"] = rng.choice(["tenant-a", "x" * 128])
    if "messages" in body and rng.random() < 0.03:
        body["kv_transfer_params"] = {
            "prompt_token_ids": [rng.randrange(7, 8192) for _ in range(rng.randint(1, 40))]
        }
        if rng.random() < 0.3:
            body["echo"] = True  # vLLM then renders the messages instead
    if rng.random() < 0.04:
        body["truncate_prompt_tokens"] = rng.choice([1, 5, 64, -1])
        if rng.random() < 0.5:
            body["truncation_side"] = rng.choice(["left", "right"])


def _generation_flags(rng: random.Random, body: dict[str, Any]) -> None:
    last = body["messages"][-1]
    if last["role"] == "assistant" and rng.random() < 0.5:
        body["add_generation_prompt"] = rng.choice([False, "false", 0, "no", "off"])
        body["continue_final_message"] = rng.choice([True, True, "true", 1, "yes"])
    elif rng.random() < 0.1:
        body["add_generation_prompt"] = rng.choice([False, "f", "0"])
    elif rng.random() < 0.05:
        body["add_generation_prompt"] = rng.choice([True, "True", "on"])
        body["continue_final_message"] = rng.choice([False, "n"])


def _template_kwargs(rng: random.Random, style: str, body: dict[str, Any]) -> None:
    kwargs: dict[str, Any] = {}
    if style in ("chatml-tools", "probe") and rng.random() < 0.25:
        kwargs["enable_thinking"] = rng.random() < 0.5
    if style == "llama3-tools" and rng.random() < 0.25:
        kwargs["date_string"] = "01 Jan 2026"
    if style == "probe":
        roll = rng.random()
        if roll < 0.15:
            kwargs["custom"] = rng.choice([None, "auto", "value", 7, ["a", {"b": None}]])
        elif roll < 0.25:
            # The request's own fields win over these (vLLM's merge order).
            key = rng.choice(
                ["add_generation_prompt", "continue_final_message", "reasoning_effort", "documents", "tools"]
            )
            kwargs[key] = rng.choice([True, False, None, "auto", "low", [{"title": "t", "text": "kw"}]])
    if style in ("chatml-tools", "probe") and rng.random() < 0.15:
        body["reasoning_effort"] = rng.choice(["none", "low", "medium", "high", "minimal", "xhigh", "max"])
    if kwargs or rng.random() < 0.02:
        body["chat_template_kwargs"] = kwargs


def completion_case(rng: random.Random) -> Case:
    roll = rng.random()
    prompt: Any
    if roll < 0.15:
        prompt = [rng.randrange(7, 8192) for _ in range(rng.randint(1, 80))]
    elif roll < 0.25:
        prompt = sentence_soup(rng, rng.randint(100, 400))
    elif roll < 0.32:
        prompt = [_text(rng, "tiny", 20) or "x" for _ in range(rng.randint(1, 3))]
    else:
        prompt = _text(rng, "tiny", 60) or "x"
    body: dict[str, Any] = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    if rng.random() < 0.2:
        body["add_special_tokens"] = rng.choice([False, True, "false", "0", 0, "off", "yes"])
    _extras(rng, body)
    return Case("/v1/completions", body, "completion")


def refused_case(rng: random.Random, style: str, template: str | None) -> Case:
    """A chat request vLLM answers with 400 (its request model or its chat preprocessing)."""
    base = chat_case(rng, style, template)
    body = dict(base.body)
    msgs = [dict(m) for m in body["messages"]]
    body["messages"] = msgs
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    kind = rng.choice(
        [
            "tools empty", "tool_choice without tools", "tool_choice unknown", "tool_choice names no tool",
            "part type unknown", "part without type", "tool call without id", "tool call custom",
            "tool call arguments object", "tool call without name", "reasoning_effort unknown",
            "add_generation_prompt null", "both generation flags", "name not a string",
            "content a number", "role missing", "tools type", "tools parameters list",
            "chat_template_kwargs list", "tool_calls not a list", "cache_salt", "forwarded ids",
        ]
    )  # fmt: skip
    user = {"role": "user", "content": "hi"}
    if kind == "tools empty":
        body["tools"] = []
    elif kind == "tool_choice without tools":
        body.pop("tools", None)
        body["tool_choice"] = rng.choice(["auto", "required"])
    elif kind == "tool_choice unknown":
        body["tool_choice"] = "sometimes"
    elif kind == "tool_choice names no tool":
        body["tools"] = [_tool(rng, 0)]
        body["tool_choice"] = {"type": "function", "function": {"name": "no_such_tool"}}
    elif kind == "part type unknown":
        msgs.append({"role": "user", "content": [{"type": "bogus", "text": "x"}]})
    elif kind == "part without type":
        msgs.append({"role": "user", "content": [{"text": "x"}]})
    elif kind.startswith("tool call"):
        bad = json.loads(json.dumps(call))
        if kind == "tool call without id":
            bad.pop("id")
        elif kind == "tool call custom":
            bad = {"id": "c1", "type": "custom", "custom": {"name": "f", "input": "x"}}
        elif kind == "tool call arguments object":
            bad["function"]["arguments"] = {"a": 1}
        else:
            bad["function"].pop("name")
        msgs += [user, {"role": "assistant", "content": None, "tool_calls": [bad]}]
    elif kind == "reasoning_effort unknown":
        body["reasoning_effort"] = "extreme"
    elif kind == "add_generation_prompt null":
        body["add_generation_prompt"] = None
    elif kind == "both generation flags":
        body["add_generation_prompt"], body["continue_final_message"] = True, True
    elif kind == "name not a string":
        msgs.append({"role": "user", "content": "x", "name": 7})
    elif kind == "content a number":
        msgs.append({"role": "user", "content": 7})
    elif kind == "role missing":
        msgs.append({"content": "x"})
    elif kind == "tools type":
        body["tools"] = [{"type": "custom", "function": {"name": "f"}}]
    elif kind == "tools parameters list":
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": [1]}}]
    elif kind == "chat_template_kwargs list":
        body["chat_template_kwargs"] = [1]
    elif kind == "cache_salt":
        body["cache_salt"] = rng.choice(["", "x" * 129, "a/b", "a@b"])
    elif kind == "forwarded ids":
        body["kv_transfer_params"] = {"prompt_token_ids": rng.choice([[], [1, -2], "1 2"])}
    else:
        msgs += [user, {"role": "assistant", "content": "x", "tool_calls": call}]
    return Case(base.path, body, f"refused: {kind}")


def edge_case(rng: random.Random, style: str, template: str | None) -> Case:
    """Rare shapes vLLM accepts or refuses by rules of its own: no messages, a message without
    content, a null content, a custom role, parts as bare strings only, kwargs named like
    apply_chat_template's own parameters, and `tokenize` in the kwargs."""
    base = chat_case(rng, style, template)
    body = dict(base.body)
    msgs = [dict(m) for m in body["messages"]]
    body["messages"] = msgs
    kind = rng.choice(
        [
            "no messages", "user without content", "assistant content null", "user content null",
            "custom role", "only string parts", "string parts with reasoning", "kwargs messages",
            "kwargs conversation", "kwargs tokenize", "kwargs tools not a list", "kwargs documents strings",
            "tool_call_id a number", "empty parts",
        ]
    )  # fmt: skip
    kwargs = dict(body.get("chat_template_kwargs") or {})
    if kind == "no messages":
        body["messages"] = []
    elif kind == "user without content":
        msgs.append({"role": "user"})
    elif kind == "assistant content null":
        msgs.append({"role": "assistant", "content": None})
    elif kind == "user content null":
        msgs.append({"role": "user", "content": None})
    elif kind == "custom role":
        msgs.insert(rng.randint(0, len(msgs)), {"role": "critic", "content": _content(rng, style)})
    elif kind == "only string parts":
        msgs.append(
            {
                "role": rng.choice(["user", "system", "tool"]),
                "content": [_text(rng, style, 8), _text(rng, style, 8)],
            }
        )
    elif kind == "string parts with reasoning":
        msgs.append({"role": "assistant", "content": [_text(rng, style, 8)], "reasoning_content": "r"})
    elif kind == "kwargs messages":
        kwargs["messages"] = [{"role": "user", "content": "x"}]
    elif kind == "kwargs conversation":
        kwargs["conversation"] = []
    elif kind == "kwargs tokenize":
        kwargs["tokenize"] = rng.choice([True, False, None])
    elif kind == "kwargs tools not a list":
        kwargs["tools"] = rng.choice([True, 3, "", {}, [{"type": "function"}], ["x"]])
    elif kind == "kwargs documents strings":
        kwargs["documents"] = rng.choice([["a"], "", [{"title": "t", "text": "x"}], False])
    elif kind == "tool_call_id a number":
        msgs.append({"role": "tool", "tool_call_id": rng.choice([5, None, "id"]), "content": "x"})
    else:
        msgs.append({"role": "user", "content": []})
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return Case(base.path, body, f"edge: {kind}")


def completion_edge(rng: random.Random) -> Case:
    """Completions prompts at the edges of what vLLM takes: empty texts and lists, a batch mixing
    an empty text, token ids up to the model's last one (8255; past it vLLM refuses, and epp,
    which does not know the model's vocabulary size, cannot), `echo`."""
    prompt = rng.choice(
        [
            "", [""], ["", "x"], [], [[]], [[1, 2], []], [1], [8191, 8192, 8255], " ",
            "\u3000ideographic space", "\x00nul",
        ]
    )  # fmt: skip
    body: dict[str, Any] = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    if rng.random() < 0.3:
        body["echo"] = True
    return Case("/v1/completions", body, f"edge completion: {json.dumps(prompt)[:20]}")


def overlong_completion(rng: random.Random) -> Case:
    prompt = sentence_soup(rng, rng.randint(1800, 3000))
    return Case(
        "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1}, "over-long completion"
    )


def fixed_cases() -> list[Case]:
    """A few rule-by-rule requests in every style, whatever the seed: no messages, a message
    without content, a null assistant content, bare string parts, `reasoning_content`."""
    out: list[Case] = []
    user = {"role": "user", "content": "Hello there"}
    shapes: dict[str, list[dict[str, Any]]] = {
        "no messages": [],
        "user without content": [{"role": "user"}, user],
        "assistant content null": [user, {"role": "assistant", "content": None}, user],
        "string parts": [{"role": "user", "content": ["a", "b"]}],
        "string part beside a text part": [{"role": "user", "content": ["a", {"type": "text", "text": "b"}]}],
        "reasoning_content": [user, {"role": "assistant", "content": "4", "reasoning_content": "2+2"}, user],
    }
    for style, template in styles().items():
        for kind, messages in shapes.items():
            body: dict[str, Any] = {"model": style, "messages": messages, "max_tokens": 1}
            if template is not None:
                body["chat_template"] = template
            out.append(Case("/v1/chat/completions", body, f"fixed: {kind}"))
    return out


def varied(seed: int, n: int) -> list[Case]:
    """`n` cases from `seed`: completions, chat in every style, refusals, long and over-long."""
    rng = random.Random(seed)
    all_styles = list(styles().items())
    out: list[Case] = fixed_cases()[:n]
    while len(out) < n:
        roll = rng.random()
        style, template = rng.choice(all_styles)
        if roll < 0.12:
            out.append(completion_case(rng))
        elif roll < 0.2:
            out.append(refused_case(rng, style, template))
        elif roll < 0.215:
            out.append(edge_case(rng, style, template))
        elif roll < 0.22:
            out.append(completion_edge(rng))
        elif roll < 0.25:
            out.append(overlong_completion(rng))
        elif roll < 0.28:
            words = rng.choice([400, 900, 1500, 2200])
            out.append(chat_case(rng, style, template, long_words=words))
        else:
            out.append(chat_case(rng, style, template))
    return out


def boundary_cases(prompt_len: Callable[[Case], int | None], seed: int, n_chats: int = 6) -> list[Case]:
    """Requests right at the context limit, with `max_tokens`, `max_completion_tokens`, both, or
    neither: prompt tokens = max_model_len - max_tokens +-1 and prompt tokens = max_model_len +-1.
    Completions are given as token ids, so their length is exact. A chat is measured first
    (`prompt_len`: vLLM's count of its prompt tokens) and then padded to the length wanted with
    " x" words, one token each in every style's vocabulary."""
    rng = random.Random(seed)
    out: list[Case] = []
    sizes: set[tuple[int, int | None]] = set()
    for delta in (-1, 0, 1):
        for max_tokens in (None, 1, 16, 300):
            sizes.add((MAX_MODEL_LEN - (max_tokens or 0) + delta, max_tokens))
            sizes.add((MAX_MODEL_LEN + delta, max_tokens))
    for size, max_tokens in sorted(sizes, key=lambda s: (s[0], s[1] or 0)):
        body: dict[str, Any] = {"model": "tiny", "prompt": [rng.randrange(7, 8192) for _ in range(size)]}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens  # completions have no max_completion_tokens
        out.append(Case("/v1/completions", body, f"boundary completion {size} ids, max_tokens={max_tokens}"))
    all_styles = list(styles().items())
    for _ in range(n_chats):
        style, template = rng.choice(all_styles)
        base = chat_case(rng, style, template, long_words=rng.randint(1200, 1400))
        body = {
            k: v
            for k, v in base.body.items()
            if k not in ("max_tokens", "kv_transfer_params", "truncate_prompt_tokens")
        }
        measured = prompt_len(Case(base.path, {**body, "max_tokens": 1}))
        if measured is None or measured > MAX_MODEL_LEN - 64:
            continue
        # the longest text message gets the padding: its end is plain text in every template
        at = max(
            (i for i, m in enumerate(body["messages"]) if isinstance(m.get("content"), str)),
            key=lambda i: len(body["messages"][i]["content"]),
        )
        for size in (MAX_MODEL_LEN - 1, MAX_MODEL_LEN, MAX_MODEL_LEN + 1):
            messages = [dict(m) for m in body["messages"]]
            messages[at]["content"] += " x" * (size - measured)
            padded = {**body, "messages": messages}
            kind = f"boundary chat {style} prompt {size}"
            out.append(Case(base.path, padded, f"{kind} no max_tokens"))
            out.append(
                Case(base.path, {**padded, "max_completion_tokens": 1}, f"{kind} max_completion_tokens=1")
            )
        for delta in (-1, 0, 1):
            room = MAX_MODEL_LEN - measured + delta  # prompt + room = max_model_len + delta
            for key in ("max_tokens", "max_completion_tokens"):
                out.append(
                    Case(base.path, {**body, key: room}, f"boundary chat {style} {key}=limit{delta:+d}")
                )
            both = {**body, "max_tokens": room + 5, "max_completion_tokens": room}
            out.append(
                Case(base.path, both, f"boundary chat {style} both, max_completion_tokens=limit{delta:+d}")
            )
    return out


def cases(seed: int, n: int) -> list[Case]:
    """The CI mix: `n` varied cases from `seed`."""
    return varied(seed, n)
