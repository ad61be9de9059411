"""Varied OpenAI request bodies for the tokenization-agreement test, generated from a seed.

Each `Case` is one request: its API path and body. The styles are the served aliases of the suite's
model (e2e/vllm/build_model.py): `tiny` (epp-tiny's own template, string content) and one per
template in templates/. A style's body carries its template as `chat_template` (vLLM renders it
under --trust-request-chat-template; epp renders the same template from `--tokenizer STYLE=DIR`).

What varies, as the issue asks: completions (text, token ids), chat with and
without a system (or developer) message, multi-turn, content given as parts (empty parts too),
tools (with and without description or parameters, an unknown key, `strict`), assistant tool calls
(arguments as valid JSON, invalid JSON, a JSON array, an empty string) and tool results,
assistant `reasoning`, `name` on user messages, `add_generation_prompt`/`continue_final_message`,
`chat_template_kwargs`, `reasoning_effort`, `add_special_tokens`, and text with whitespace runs,
digits, Unicode and the style's own control-token strings. Requests a template refuses
(raise_exception) are part of the mix: then vLLM answers 400 and epp must not claim token ids.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

from e2e.vllm.texts import mixed_text, sentence_soup

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Control strings of each style, spliced into content now and then: both sides must split them
# off as single ids. Not for `tiny`: epp-tiny (what epp uses for it) does not have them.
CONTROL = {
    "llama3-tools": ["<|eot_id|>", "<|start_header_id|>user<|end_header_id|>"],
    "chatml-tools": ["<|im_end|>", "<tool_call>"],
    "mistral-tools": ["[INST]", "[/INST]"],
    "parts": [],
    "tiny": ["<|user|>", "</s>"],
}
TOOL_STYLES = ("tiny", "llama3-tools", "chatml-tools", "mistral-tools")


@dataclasses.dataclass(frozen=True)
class Case:
    path: str
    body: dict[str, Any]

    def describe(self) -> str:
        return f"{self.path} {json.dumps(self.body, ensure_ascii=False)[:600]}"


def templates() -> dict[str, str]:
    return {p.stem.replace("_", "-"): p.read_text() for p in sorted(TEMPLATES.glob("*.jinja"))}


def _text(rng: random.Random, style: str, max_words: int = 30) -> str:
    text = mixed_text(rng, max_words)
    if CONTROL[style] and rng.random() < 0.15:
        cut = rng.randint(0, len(text))
        text = text[:cut] + rng.choice(CONTROL[style]) + text[cut:]
    return text


def _content(rng: random.Random, style: str) -> str | list[dict[str, Any]]:
    if rng.random() < 0.25:
        parts: list[dict[str, Any]] = [
            {"type": "text", "text": _text(rng, style, 12)} for _ in range(rng.randint(1, 3))
        ]
        if rng.random() < 0.3:
            parts.insert(rng.randint(0, len(parts)), {"type": "text", "text": ""})
        return parts
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
        fn["strict"] = rng.random() < 0.5
    tool: dict[str, Any] = {"type": "function", "function": fn}
    if rng.random() < 0.15:
        tool["x-unknown"] = "dropped by vLLM"
    return tool


def _arguments(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.7:
        return json.dumps({"query": sentence_soup(rng, 3), "limit": rng.randint(1, 9)})
    if roll < 0.8:
        return '{"query": "unterminated'
    if roll < 0.9:
        return "[1, 2]"
    return ""


def _tool_turn(
    rng: random.Random, style: str, tools: list[dict[str, Any]], turn: int
) -> list[dict[str, Any]]:
    """An assistant message calling 1-2 tools, then one tool message per call."""
    calls = []
    for k in range(rng.randint(1, 2)):
        name = rng.choice(tools)["function"]["name"] if tools else "tool_x"
        # Mistral-style ids are 9 alphanumerics; any string works for the others.
        calls.append(
            {
                "id": f"call{turn}x{k}ab"[:9],
                "type": "function",
                "function": {"name": name, "arguments": _arguments(rng)},
            }
        )
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": rng.choice([None, "", "Let me check."]),
        "tool_calls": calls,
    }
    results: list[dict[str, Any]] = []
    for call in calls:
        content: Any = sentence_soup(rng, rng.randint(2, 10))
        if rng.random() < 0.2:
            content = [
                {"type": "text", "text": sentence_soup(rng, 3)},
                {"type": "text", "text": sentence_soup(rng, 3)},
            ]
        results.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    return [assistant, *results]


def chat_case(rng: random.Random, style: str, template: str | None) -> Case:
    messages: list[dict[str, Any]] = []
    roll = rng.random()
    if roll < 0.45:
        messages.append({"role": "system", "content": _content(rng, style)})
    elif roll < 0.55:
        messages.append({"role": "developer", "content": _text(rng, style)})
    tools = (
        [_tool(rng, i) for i in range(rng.randint(1, 3))]
        if style in TOOL_STYLES and rng.random() < 0.4
        else []
    )
    for turn in range(rng.randint(1, 4)):
        user: dict[str, Any] = {"role": "user", "content": _content(rng, style)}
        if rng.random() < 0.1:
            user["name"] = "alice"
        messages.append(user)
        if tools and rng.random() < 0.5:
            messages += _tool_turn(rng, style, tools, turn)
            messages.append({"role": "assistant", "content": _text(rng, style)})
        elif rng.random() < 0.85:
            assistant: dict[str, Any] = {"role": "assistant", "content": _content(rng, style)}
            if style == "chatml-tools" and rng.random() < 0.3:
                assistant["reasoning"] = sentence_soup(rng, 8)
            messages.append(assistant)
    if messages[-1]["role"] == "assistant" and rng.random() < 0.6:
        messages.append({"role": "user", "content": _content(rng, style)})
    body: dict[str, Any] = {"model": style, "messages": messages}
    if template is not None:
        body["chat_template"] = template
    if tools:
        body["tools"] = tools
        if rng.random() < 0.4:
            body["tool_choice"] = rng.choice(["none", "auto"])
    if messages[-1]["role"] == "assistant" and rng.random() < 0.5:
        body["add_generation_prompt"] = False
        body["continue_final_message"] = True
    elif rng.random() < 0.1:
        body["add_generation_prompt"] = False
    if style == "chatml-tools" and rng.random() < 0.25:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    if style == "chatml-tools" and rng.random() < 0.1:
        body["reasoning_effort"] = "none"  # vLLM passes enable_thinking=False to the template
    if style == "llama3-tools" and rng.random() < 0.25:
        body["chat_template_kwargs"] = {"date_string": "01 Jan 2026"}
    if rng.random() < 0.05:
        body["add_special_tokens"] = True  # the rendered text then gets the post-processor's BOS too
    return Case("/v1/chat/completions", body)


def completion_case(rng: random.Random) -> Case:
    roll = rng.random()
    prompt: Any
    if roll < 0.15:
        prompt = [rng.randrange(7, 8192) for _ in range(rng.randint(1, 80))]
    elif roll < 0.3:
        prompt = sentence_soup(rng, rng.randint(100, 400))
    else:
        prompt = _text(rng, "tiny", 60)
        if not prompt:
            prompt = "x"
    return Case("/v1/completions", {"model": "tiny", "prompt": prompt})


# Requests vLLM refuses with 400 (reference notes, vllm-chat-preprocessing.md): epp must not
# claim token ids for them.
REFUSED = (
    Case(
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
    ),
    Case(
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": []},
    ),
)


def cases(seed: int, per_style: int, completions: int) -> list[Case]:
    rng = random.Random(seed)
    out = [*REFUSED, *(completion_case(rng) for _ in range(completions))]
    styles: dict[str, str | None] = {"tiny": None, **templates()}
    for style, template in styles.items():
        out += [chat_case(rng, style, template) for _ in range(per_style)]
    return out
