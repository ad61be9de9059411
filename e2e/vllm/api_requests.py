"""Generated requests for the differential tests of the routes beyond chat and completions:
Anthropic's `/v1/messages` and `count_tokens`, OpenAI's Responses, vLLM's tokens-in
`/inference/v1/generate`, and the four `/render` routes (e2e/vllm/differential.py sends each to
vLLM and to epp).

vLLM renders Anthropic and Responses bodies with its *server's* chat template (neither API can
carry one in the body), so a case's `model` names a server whose template is the style's: the CI
stack's pods serve `tiny` with epp-tiny's template; `scripts/differential_tokenize.py` starts one
server per template style (`--chat-template`) for the full run.

What varies, per route:
- messages (and count_tokens, messages/render): system prompts (a string, text blocks, Claude
  Code's billing header, inline system messages, which templates that want the system first have
  merged), text blocks (empty ones too), thinking and redacted thinking, tool_use with inputs,
  tool_result from the user (a string, text blocks joined, tool references) and from the
  assistant (Python's str() of its content), tools (with and without description, `strict`,
  `defer_loading`, a schema without "type"), tool_addition / tool_removal, `tools: []`,
  tool_choice (auto, any, none, a named tool, with or without tools), thinking (enabled, disabled,
  adaptive; budgets), output_config.effort, chat_template_kwargs, stop_sequences, budgets spelled
  the lax ways, salts, long and over-long prompts, and requests vLLM refuses (its request model:
  missing or mistyped fields, an unknown block type or role, a tool change outside a system
  message, a budget at or over max_tokens; later: the chat salt rule, an undeclared tool
  reference, a non-string text in a tool result, over-long prompts).
- responses: a string input, or items (user, system and developer messages with strings or
  input_text parts, assistant strings and output messages, function_call / function_call_output,
  reasoning items; merged into the assistant message before them as vLLM merges them),
  instructions, function tools, tool_choice, reasoning.effort, chat_template_kwargs, partial final
  messages (continued), truncation, and refusals (missing input, a bad tool choice, encrypted
  reasoning, `prompt`, `background`, a bad salt, a budget over the context).
- generate: token ids (spelled the lax ways too), lengths around the context, and refusals.
- render: the chat (with its refusals) and completions (with its edges and over-long prompts)
  cases of e2e/vllm/chat_requests.py, and the messages and responses cases above, sent to the
  /render route.
Every body's output budget is 1 token unless a case is about budgets.
"""

from __future__ import annotations

import json
import random
from typing import Any

from e2e.vllm.chat_requests import (
    BILLING,
    MAX_MODEL_LEN,
    Case,
    _text,
    chat_case,
    completion_case,
    completion_edge,
    overlong_completion,
    refused_case,
)
from e2e.vllm.texts import sentence_soup

# Styles whose template renders tools, reasoning and the request's kwargs (the others ignore them).
RICH = ("probe", "chatml-tools")


# --- Anthropic's Messages ---------------------------------------------------------------------


def _blocks(rng: random.Random, style: str, role: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.5:
            block: dict[str, Any] = {"type": "text", "text": _text(rng, style, 15)}
            if rng.random() < 0.1:
                block["cache_control"] = {"type": "ephemeral"}  # Anthropic's: vLLM ignores it
        elif roll < 0.56:
            block = {"type": "text", "text": ""}  # dropped by vLLM
        elif roll < 0.7 and role == "assistant":
            block = {"type": "thinking", "thinking": sentence_soup(rng, 5), "signature": "sig"}
        elif roll < 0.74 and role == "assistant":
            block = {"type": "redacted_thinking", "data": "b64"}
        elif roll < 0.88 and role == "assistant":
            name = rng.choice(tools)["name"] if tools else "lookup"
            arguments = rng.choice(
                [{"q": sentence_soup(rng, 2)}, {}, None, {"n": 3, "nested": {"a": [1, 2.5, True]}}]
            )
            block = {"type": "tool_use", "id": f"toolu_{rng.randrange(10**6)}", "name": name}
            if arguments is not None:
                block["input"] = arguments
        elif roll < 0.95 and role == "user":
            block = {"type": "tool_result", "tool_use_id": f"toolu_{rng.randrange(10**6)}"}
            kind = rng.random()
            if kind < 0.5:
                block["content"] = sentence_soup(rng, 4)
            elif kind < 0.8:
                block["content"] = [
                    {"type": "text", "text": sentence_soup(rng, 3)} for _ in range(rng.randint(1, 3))
                ]
                if rng.random() < 0.3:
                    block["content"].append({"type": "tool_reference", "tool_name": "lookup"})
            elif kind < 0.9:
                block["content"] = ""
            if rng.random() < 0.2:
                block["is_error"] = rng.choice([True, False, "true"])
        elif role == "assistant":
            # an assistant's tool_result becomes "Tool result: " + Python's str() of its content
            block = {
                "type": "tool_result",
                "tool_use_id": "t",
                "content": rng.choice(["x", [{"type": "text", "text": "y"}]]),
            }
        else:
            block = {"type": "text", "text": _text(rng, style, 6)}
        out.append(block)
    return out


def _anthropic_tool(rng: random.Random, i: int) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": f"tool_{i}_{rng.choice(['lookup', 'weather', 'search'])}"}
    if rng.random() < 0.7:
        tool["description"] = sentence_soup(rng, rng.randint(3, 9))
    schema: dict[str, Any] = {"properties": {"q": {"type": "string"}}, "required": ["q"]}
    if rng.random() < 0.7:
        schema = {"type": "object", **schema}  # vLLM adds "type" when absent
    tool["input_schema"] = schema
    if rng.random() < 0.15:
        tool["strict"] = rng.choice([True, False, "true"])
    if rng.random() < 0.1:
        tool["defer_loading"] = rng.choice([True, False])
    return tool


def _system(rng: random.Random, style: str) -> Any:
    roll = rng.random()
    if roll < 0.5:
        return _text(rng, style, 20)
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": _text(rng, style, 10)} for _ in range(rng.randint(1, 3))
    ]
    if rng.random() < 0.3:
        blocks.insert(0, {"type": "text", "text": BILLING % rng.randrange(100000)})
    if rng.random() < 0.1:
        blocks.append({"type": "text", "text": ""})
    return blocks


def messages_body(
    rng: random.Random, style: str, *, count_tokens: bool = False, long_words: int = 0
) -> dict[str, Any]:
    tools = [_anthropic_tool(rng, i) for i in range(rng.randint(1, 3))] if rng.random() < 0.3 else []
    messages: list[dict[str, Any]] = []
    for turn in range(rng.randint(1, 4)):
        user: dict[str, Any] = {"role": "user"}
        user["content"] = _blocks(rng, style, "user", tools) if rng.random() < 0.35 else _text(rng, style, 25)
        messages.append(user)
        if rng.random() < 0.07:
            inline = rng.choice(
                [_text(rng, style, 8), [{"type": "text", "text": _text(rng, style, 8)}], BILLING % 7]
            )
            messages.append({"role": "system", "content": inline})
        if turn < 3 and rng.random() < 0.8:
            content = _blocks(rng, style, "assistant", tools) if rng.random() < 0.4 else _text(rng, style, 20)
            messages.append({"role": "assistant", "content": content})
    if messages[-1]["role"] != "user" and rng.random() < 0.7:
        messages.append({"role": "user", "content": _text(rng, style, 10)})
    if long_words:
        messages[0] = {"role": "user", "content": sentence_soup(rng, long_words)}
    body: dict[str, Any] = {"model": style, "messages": messages}
    if not count_tokens:
        body["max_tokens"] = rng.choice([1, 1, 1, 1, "1", 1.0, True])
    if rng.random() < 0.5:
        body["system"] = _system(rng, style)
    if tools:
        body["tools"] = tools
        if rng.random() < 0.15 and style in RICH:
            body["messages"].insert(
                0,
                {
                    "role": "system",
                    "content": [
                        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": tools[0]["name"]}}
                    ],
                },
            )
        if rng.random() < 0.1:
            definition = {"type": "tool_definition", "definition": _anthropic_tool(rng, 8)}
            body["messages"].insert(
                0, {"role": "system", "content": [{"type": "tool_addition", "tool": definition}]}
            )
    elif rng.random() < 0.05:
        body["tools"] = []  # set after vLLM's chat checks: reaches the template as []
    if rng.random() < 0.25:
        choice: dict[str, Any] = {"type": rng.choice(["auto", "any", "none", "tool"])}
        if choice["type"] == "tool":
            choice["name"] = tools[0]["name"] if tools else "lookup"
        if rng.random() < 0.2:
            choice["disable_parallel_tool_use"] = True
        body["tool_choice"] = choice
    if rng.random() < 0.12:
        body["thinking"] = rng.choice(
            [{"type": "disabled"}, {"type": "adaptive"}, {"type": "adaptive", "display": "omitted"}]
        )
    if rng.random() < 0.08:
        body["output_config"] = {"effort": rng.choice(["low", "medium", "high", "xhigh", "max"])}
    if style in RICH and rng.random() < 0.15:
        body["chat_template_kwargs"] = rng.choice([{"enable_thinking": False}, {"custom": "v"}, {}])
    if not count_tokens:
        if rng.random() < 0.05:
            body["stop_sequences"] = ["\n\nHuman:"]
        if rng.random() < 0.05:
            body["metadata"] = {"user_id": "u-1"}
        if rng.random() < 0.05:
            body["temperature"], body["top_p"], body["top_k"] = 0.5, "0.9", 40
        if rng.random() < 0.04:
            body["cache_salt"] = rng.choice(["tenant-a", "x" * 128])
    return body


def messages_refused(
    rng: random.Random, style: str, *, count_tokens: bool = False
) -> tuple[dict[str, Any], str]:
    body = messages_body(rng, style, count_tokens=count_tokens)
    kinds = [
        "model missing", "model empty", "model a number", "messages missing", "messages not a list",
        "role tool", "content missing", "content a number", "block type unknown", "block not an object",
        "tool_use input a list", "tool without input_schema", "tool name missing",
        "tool_choice tool without name", "tool change outside system",
        "tool removal of an undeclared tool", "tool_result text a number",
        "thinking budget small", "thinking type unknown", "effort unknown", "no messages",
        "chat_template_kwargs a list",
    ]  # fmt: skip
    if not count_tokens:
        kinds += ["max_tokens missing", "max_tokens zero", "max_tokens a word", "max_tokens fraction",
                  "budget over max_tokens", "stop_sequences five", "salt with slash",
                  "salt too long for chat", "salt empty", "temperature a word", "stream a word"]  # fmt: skip
    kind = rng.choice(kinds)
    msgs = body["messages"]
    if kind == "model missing":
        body.pop("model")
    elif kind == "model empty":
        body["model"] = ""
    elif kind == "model a number":
        body["model"] = 3
    elif kind == "messages missing":
        body.pop("messages")
    elif kind == "messages not a list":
        body["messages"] = {"role": "user", "content": "x"}
    elif kind == "role tool":
        msgs.append({"role": "tool", "content": "x"})
    elif kind == "content missing":
        msgs.append({"role": "user"})
    elif kind == "content a number":
        msgs.append({"role": "user", "content": 5})
    elif kind == "block type unknown":
        msgs.append({"role": "user", "content": [{"type": "bogus", "text": "x"}]})
    elif kind == "block not an object":
        msgs.append({"role": "user", "content": ["x"]})
    elif kind == "tool_use input a list":
        msgs.append(
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}]}
        )
    elif kind == "tool without input_schema":
        body["tools"] = [{"name": "f"}]
    elif kind == "tool name missing":
        body["tools"] = [{"input_schema": {"type": "object"}}]
    elif kind == "tool_choice tool without name":
        body["tool_choice"] = {"type": "tool"}
    elif kind == "tool change outside system":
        msgs.append(
            {
                "role": "user",
                "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "f"}}],
            }
        )
    elif kind == "tool removal of an undeclared tool":
        body.pop("tools", None)
        msgs.insert(
            0,
            {
                "role": "system",
                "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "ghost"}}],
            },
        )
    elif kind == "tool_result text a number":
        msgs.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": 5}]}
                ],
            }
        )
    elif kind == "thinking budget small":
        body["thinking"] = {"type": "enabled", "budget_tokens": 100}
    elif kind == "thinking type unknown":
        body["thinking"] = {"type": "sometimes"}
    elif kind == "effort unknown":
        body["output_config"] = {"effort": "extreme"}
    elif kind == "no messages":
        body["messages"] = []
    elif kind == "chat_template_kwargs a list":
        body["chat_template_kwargs"] = [1]
    elif kind == "max_tokens missing":
        body.pop("max_tokens")
    elif kind == "max_tokens zero":
        body["max_tokens"] = rng.choice([0, -1])
    elif kind == "max_tokens a word":
        body["max_tokens"] = "one"
    elif kind == "max_tokens fraction":
        body["max_tokens"] = 1.5
    elif kind == "budget over max_tokens":
        body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
        body["max_tokens"] = rng.choice([1, 1024])
    elif kind == "stop_sequences five":
        body["stop_sequences"] = ["a", "b", "c", "d", "e"]
    elif kind == "salt with slash":
        body["cache_salt"] = "a/b"
    elif kind == "salt too long for chat":
        body["cache_salt"] = "x" * 129
    elif kind == "salt empty":
        body["cache_salt"] = ""
    elif kind == "temperature a word":
        body["temperature"] = "warm"
    else:
        body["stream"] = "maybe"
    return body, kind


def messages_cases(rng: random.Random, styles: list[str], n: int, path: str = "/v1/messages") -> list[Case]:
    count = path.endswith("/count_tokens")
    out: list[Case] = []
    while len(out) < n:
        style = rng.choice(styles)
        roll = rng.random()
        if roll < 0.22:
            body, kind = messages_refused(rng, style, count_tokens=count)
            out.append(Case(path, body, f"refused: {kind}"))
        elif roll < 0.27:
            words = rng.choice([600, 1300, 1900, 2500])
            out.append(Case(path, messages_body(rng, style, count_tokens=count, long_words=words), "long"))
        elif roll < 0.29 and path != "/v1/messages":
            # on /v1/messages itself a thinking budget needs a server started with a reasoning
            # parser (vLLM's to answer, and generating past 1,024 tokens): render and count only
            body = messages_body(rng, style, count_tokens=count)
            body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
            if not count:
                body["max_tokens"] = 1025
            out.append(Case(path, body, "thinking enabled"))
        else:
            out.append(Case(path, messages_body(rng, style, count_tokens=count), "messages"))
    return out


# --- OpenAI's Responses ---------------------------------------------------------------------------


def _responses_tool(rng: random.Random, i: int) -> dict[str, Any]:
    tool: dict[str, Any] = {"type": "function", "name": f"fn_{i}_{rng.choice(['lookup', 'order'])}"}
    tool["parameters"] = rng.choice([{"type": "object", "properties": {"q": {"type": "string"}}}, None])
    if rng.random() < 0.6:
        tool["description"] = sentence_soup(rng, 4)
    tool["strict"] = rng.choice([None, True, False])
    return tool


def _responses_items(rng: random.Random, style: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for turn in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.5:
            items.append({"role": "user", "content": _text(rng, style, 20)})
        elif roll < 0.7:
            parts = [{"type": "input_text", "text": _text(rng, style, 8)} for _ in range(rng.randint(1, 3))]
            items.append({"type": "message", "role": "user", "content": parts})
        else:
            items.append({"role": rng.choice(["system", "developer"]), "content": _text(rng, style, 10)})
        if turn == 3:
            break
        roll = rng.random()
        if roll < 0.2:
            items.append(
                {
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": sentence_soup(rng, 4)}],
                }
            )
        elif roll < 0.25:
            items.append(
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": sentence_soup(rng, 3)}]}
            )
        if tools and rng.random() < 0.4:
            call_id = f"call_{rng.randrange(10**5)}"
            items.append(
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": tools[0]["name"],
                    "arguments": json.dumps({"q": "x"}),
                }
            )
            items.append(
                {"type": "function_call_output", "call_id": call_id, "output": sentence_soup(rng, 3)}
            )
        roll = rng.random()
        if roll < 0.45:
            items.append({"role": "assistant", "content": _text(rng, style, 15)})
        elif roll < 0.6:
            text_parts = [{"type": "output_text", "text": _text(rng, style, 10), "annotations": []}]
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "id": f"msg_{turn}",
                    "status": "completed",
                    "content": text_parts,
                }
            )
    return items


def responses_body(rng: random.Random, style: str, *, long_words: int = 0) -> dict[str, Any]:
    tools = [_responses_tool(rng, i) for i in range(rng.randint(1, 2))] if rng.random() < 0.3 else []
    body: dict[str, Any] = {"model": style, "max_output_tokens": 1}
    if rng.random() < 0.3:
        body["input"] = _text(rng, style, 30)
    else:
        body["input"] = _responses_items(rng, style, tools)
        if rng.random() < 0.06:
            last: dict[str, Any] = {
                "type": "message",
                "role": "assistant",
                "id": "m",
                "status": rng.choice(["in_progress", "incomplete"]),
            }
            last["content"] = [{"type": "output_text", "text": _text(rng, style, 6), "annotations": []}]
            body["input"].append(last)  # continued, not answered
    if long_words:
        body["input"] = sentence_soup(rng, long_words)
    if rng.random() < 0.4:
        body["instructions"] = _text(rng, style, 15)
    if tools:
        body["tools"] = tools
        if rng.random() < 0.3:
            body["tool_choice"] = rng.choice(
                ["auto", "none", "required", {"type": "function", "name": tools[0]["name"]}]
            )
    elif rng.random() < 0.1:
        body["tool_choice"] = rng.choice(["auto", "none"])
    if rng.random() < 0.12:
        body["reasoning"] = {"effort": rng.choice(["none", "minimal", "low", "medium", "high"])}
    if style in RICH and rng.random() < 0.12:
        body["chat_template_kwargs"] = rng.choice([{"enable_thinking": False}, {"custom": 1}])
    if rng.random() < 0.1:
        body["truncation"] = rng.choice(["auto", "disabled", None])
    if rng.random() < 0.04:
        body["cache_salt"] = "tenant-b"
    if style == "tiny" and rng.random() < 0.05:
        # vLLM serves its default model (the first served name; `tiny` on the servers here,
        # whose template epp's default tokenizer has)
        body.pop("model")
    if rng.random() < 0.05:
        body["max_output_tokens"] = rng.choice(["1", None])
    return body


def responses_refused(rng: random.Random, style: str, *, render: bool) -> tuple[dict[str, Any], str]:
    body = responses_body(rng, style)
    kinds = [
        "input missing", "input a number", "required without tools", "named tool missing",
        "encrypted reasoning", "prompt template", "background", "salt with slash", "salt empty",
        "budget over context",
        "effort unknown", "truncation unknown", "empty input",
    ]  # fmt: skip
    if render:
        kinds.append("previous response")
    kind = rng.choice(kinds)
    if kind == "input missing":
        body.pop("input")
    elif kind == "input a number":
        body["input"] = 5
    elif kind == "required without tools":
        body.pop("tools", None)
        body["tool_choice"] = "required"
    elif kind == "named tool missing":
        body["tools"] = [_responses_tool(rng, 0)]
        body["tool_choice"] = {"type": "function", "name": "ghost"}
    elif kind == "encrypted reasoning":
        body["input"] = [
            {"role": "user", "content": "x"},
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"},
        ]
    elif kind == "prompt template":
        body["prompt"] = {"id": "pmpt_1"}
    elif kind == "background":
        body["background"] = True
    elif kind == "salt with slash":
        body["cache_salt"] = "a/b"
    elif kind == "salt empty":
        body["cache_salt"] = ""
    elif kind == "budget over context":
        body["max_output_tokens"] = MAX_MODEL_LEN + rng.choice([1, 500])
    elif kind == "effort unknown":
        body["reasoning"] = {"effort": "extreme"}
    elif kind == "truncation unknown":
        body["truncation"] = "sometimes"
    elif kind == "empty input":
        body["input"] = []
        body.pop("instructions", None)
    else:
        body["previous_response_id"] = "resp_123"
    return body, kind


def responses_cases(rng: random.Random, styles: list[str], n: int, path: str = "/v1/responses") -> list[Case]:
    render = path.endswith("/render")
    out: list[Case] = []
    while len(out) < n:
        style = rng.choice(styles)
        roll = rng.random()
        if roll < 0.18:
            body, kind = responses_refused(rng, style, render=render)
            out.append(Case(path, body, f"refused: {kind}"))
        elif roll < 0.24:
            body = responses_body(rng, style, long_words=rng.choice([600, 1300, 1900, 2500]))
            if rng.random() < 0.5:
                body["truncation"] = "auto"
            out.append(Case(path, body, "long"))
        else:
            out.append(Case(path, responses_body(rng, style), "responses"))
    return out


# --- vLLM's /inference/v1/generate ---------------------------------------------------------------


def generate_cases(rng: random.Random, n: int, model: str = "tiny") -> list[Case]:
    path = "/inference/v1/generate"
    out: list[Case] = []
    while len(out) < n:
        roll = rng.random()
        size = (
            rng.choice([1, 5, 40, 300])
            if roll < 0.7
            else rng.choice([MAX_MODEL_LEN - 1, MAX_MODEL_LEN, MAX_MODEL_LEN + 1, 3000])
        )
        ids: list[Any] = [rng.randrange(0, 8255) for _ in range(size)]
        body: dict[str, Any] = {"token_ids": ids, "sampling_params": {"max_tokens": 1}}
        if rng.random() < 0.8:
            body["model"] = model
        kind = f"{size} ids"
        if rng.random() < 0.1:
            ids[0] = rng.choice(["7", True, 9.0])  # pydantic reads these as integers
            kind += ", lax"
        if rng.random() < 0.05:
            body["cache_salt"] = "tenant-c"
        if rng.random() < 0.05:
            body["stream"] = True
        if rng.random() < 0.15:
            bad = rng.choice(
                [
                    "empty",
                    "negative",
                    "word",
                    "no sampling_params",
                    "sampling_params null",
                    "no ids",
                    "salt",
                    "model a number",
                ]
            )
            kind = f"refused: {bad}"
            if bad == "empty":
                body["token_ids"] = []
            elif bad == "negative":
                ids[-1] = -1
            elif bad == "word":
                ids[-1] = "seven"
            elif bad == "no sampling_params":
                body.pop("sampling_params")
            elif bad == "sampling_params null":
                body["sampling_params"] = None
            elif bad == "no ids":
                body.pop("token_ids")
            elif bad == "salt":
                body["cache_salt"] = rng.choice(["", "a/b", "x" * 129])
            else:
                body["model"] = 3
        out.append(Case(path, body, kind))
    return out


# --- the /render routes --------------------------------------------------------------------------


def render_cases(rng: random.Random, route: str, styles: list[str], n: int) -> list[Case]:
    """`n` cases of one render route: chat and completions render the chat suite's cases (the
    chat ones in the `tiny` style, which the render server's requests name), messages and
    responses their API's."""
    if route == "/v1/messages/render":
        return messages_cases(rng, styles, n, route)
    if route == "/v1/responses/render":
        return responses_cases(rng, styles, n, route)
    out: list[Case] = []
    while len(out) < n:
        roll = rng.random()
        if route == "/v1/completions/render":
            if roll < 0.85:
                case = completion_case(rng)
            elif roll < 0.95:
                case = completion_edge(rng)  # empty prompts and batches, ids at the vocabulary's end
            else:
                case = overlong_completion(rng)
        elif roll < 0.15:
            case = refused_case(rng, "tiny", None)
        else:
            case = chat_case(rng, "tiny", None)
        body = {k: v for k, v in case.body.items() if k != "chat_template"}
        out.append(Case(route, body, case.kind))
    return out


ROUTES = (
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/inference/v1/generate",
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/messages/render",
    "/v1/responses/render",
)


def route_cases(seed: int, route: str, n: int, styles: list[str]) -> list[Case]:
    """`n` generated cases of `route` from `seed`, in `styles` (served model names; each set of
    styles draws its own cases)."""
    rng = random.Random(f"{seed}-{route}-{','.join(styles)}")
    if route in ("/v1/messages", "/v1/messages/count_tokens"):
        return messages_cases(rng, styles, n, route)
    if route == "/v1/responses":
        return responses_cases(rng, styles, n, route)
    if route == "/inference/v1/generate":
        return generate_cases(rng, n)
    return render_cases(rng, route, styles, n)
