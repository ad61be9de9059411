# ruff: noqa: E501  (a table of bodies: one per line reads best)
"""Nasty request bodies: each a client fault (or an odd request vLLM serves), never epp's.

Every entry is (name, path, body bytes). The first ones are the defects found by the stress test
of issue 19 (500s with an ERROR traceback before): a token id of 2^63 with KV events on, JSON
nested ~1,000 deep. The rest cover wrong types in every field epp reads, huge and special
numbers, invalid UTF-8, lone surrogates, empty and duplicate keys, and giant strings.
"""

from __future__ import annotations

import json
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
PATHS = (CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS, "/v1/unknown")

HUGE = "1" + "0" * 400  # a 401-digit integer
USER = '[{"role":"user","content":"hi"}]'


def _deep(n: int, open_: str = "[", close: str = "]") -> str:
    return open_ * n + close * n


def _deep_objects(n: int) -> str:
    return '{"a":' * n + "1" + "}" * n


def _raw() -> list[tuple[str, str, bytes]]:
    """Bodies that are not json.dumps output (numbers, escapes and bytes spelled by hand)."""
    out: list[tuple[str, str, str | bytes]] = [
        # issue 19's defects
        ("token id 2^63", COMPLETIONS, '{"model":"m","prompt":[9223372036854775808]}'),
        ("token id 2^64 in a batch", COMPLETIONS, '{"model":"m","prompt":[[1],[18446744073709551616]]}'),
        ("token id -2^63-1", COMPLETIONS, '{"model":"m","prompt":[-9223372036854775809]}'),
        ("huge token id", EMBEDDINGS, '{"model":"m","input":[' + HUGE + "]}"),
        ("forwarded id 2^63", CHAT,
         '{"model":"m","messages":' + USER + ',"kv_transfer_params":{"prompt_token_ids":[9223372036854775808]}}'),
        ("1000 deep array", CHAT, '{"model":"m","messages":' + USER + ',"x":' + _deep(1000) + "}"),
        ("1000 deep objects", COMPLETIONS, '{"model":"m","prompt":"x","x":' + _deep_objects(1000) + "}"),
        ("100000 deep", CHAT, '{"model":"m","messages":' + USER + ',"x":' + _deep(100_000) + "}"),
        ("65 deep kwargs", CHAT, '{"model":"m","messages":' + USER + ',"chat_template_kwargs":{"a":' + _deep(63) + "}}"),
        ("deep messages", CHAT, '{"model":"m","messages":' + _deep(2000) + "}"),
        ("deep content parts", CHAT, '{"model":"m","messages":[{"role":"user","content":' + _deep(900) + "}]}"),
        ("deep tool-call arguments", CHAT,
         '{"model":"m","messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"a","type":"function",'
         '"function":{"name":"f","arguments":"' + "[" * 5000 + '"}}]},{"role":"user","content":"go"}]}'),
        ("deep tool-call arguments, closed", CHAT,
         '{"model":"m","messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"a","type":"function",'
         '"function":{"name":"f","arguments":"' + _deep(990) + '"}}]},{"role":"user","content":"go"}]}'),
        # numbers
        ("huge max_tokens", COMPLETIONS, '{"model":"m","prompt":"x","max_tokens":' + HUGE + "}"),
        ("huge max_completion_tokens", CHAT, '{"model":"m","messages":' + USER + ',"max_completion_tokens":' + HUGE + "}"),
        ("negative huge max_tokens", CHAT, '{"model":"m","messages":' + USER + ',"max_tokens":-' + HUGE + "}"),
        ("huge truncate", COMPLETIONS, '{"model":"m","prompt":"hello there","truncate_prompt_tokens":' + HUGE + "}"),
        ("negative huge truncate", CHAT, '{"model":"m","messages":' + USER + ',"truncate_prompt_tokens":-' + HUGE + "}"),
        ("float max_tokens 1e300", COMPLETIONS, '{"model":"m","prompt":"x","max_tokens":1e300}'),
        ("float max_tokens 1e400", COMPLETIONS, '{"model":"m","prompt":"x","max_tokens":1e400}'),
        ("1e400 in an unread field", CHAT, '{"model":"m","messages":' + USER + ',"temperature":1e400}'),
        ("-1e400 in kwargs", CHAT, '{"model":"m","messages":' + USER + ',"chat_template_kwargs":{"x":-1e400}}'),
        ("1e400 with truncation", CHAT,
         '{"model":"m","messages":' + USER + ',"truncate_prompt_tokens":1,"top_p":1e400}'),
        ("NaN", COMPLETIONS, '{"model":"m","prompt":"x","temperature":NaN}'),
        ("Infinity", CHAT, '{"model":"m","messages":' + USER + ',"temperature":Infinity}'),
        ("huge float token id", COMPLETIONS, '{"model":"m","prompt":[1e400]}'),
        ("float token ids", COMPLETIONS, '{"model":"m","prompt":[1.5,2]}'),
        ("huge exponent", COMPLETIONS, '{"model":"m","prompt":"x","n":1e99999999999}'),
        ("long number", COMPLETIONS, '{"model":"m","prompt":"x","seed":' + "9" * 100_000 + "}"),
        # strings and encodings
        ("lone surrogate in content", CHAT, '{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}'),
        ("lone low surrogate in prompt", COMPLETIONS, '{"model":"m","prompt":"a\\udc00b"}'),
        ("surrogate in model", COMPLETIONS, '{"model":"\\ud83d","prompt":"x"}'),
        ("surrogate in role", CHAT, '{"model":"m","messages":[{"role":"\\udfff","content":"x"}]}'),
        ("NUL in content", CHAT, '{"model":"m","messages":[{"role":"user","content":"a\\u0000b"}]}'),
        ("bad escape", COMPLETIONS, '{"model":"m","prompt":"\\x41"}'),
        ("truncated escape", COMPLETIONS, '{"model":"m","prompt":"\\u12'),
        # keys
        ("empty key", COMPLETIONS, '{"":1,"model":"m","prompt":"x"}'),
        ("duplicate model", COMPLETIONS, '{"model":"m","model":5,"prompt":"x"}'),
        ("duplicate messages", CHAT, '{"model":"m","messages":' + USER + ',"messages":7}'),
        ("duplicate role", CHAT, '{"model":"m","messages":[{"role":"user","role":"tool","content":"x"}]}'),
        # framing
        ("empty", COMPLETIONS, ""),
        ("whitespace", CHAT, "   \n"),
        ("null", CHAT, "null"),
        ("array", CHAT, "[]"),
        ("string", COMPLETIONS, '"hello"'),
        ("number", COMPLETIONS, "42"),
        ("trailing garbage", COMPLETIONS, '{"model":"m","prompt":"x"} {}'),
        ("unterminated", CHAT, '{"model":"m","messages":[{"role":"user","content":"x"'),
        ("BOM", COMPLETIONS, '\ufeff{"model":"m","prompt":"x"}'),
        ("comments", COMPLETIONS, '{"model":"m", /* c */ "prompt":"x"}'),
        ("single quotes", COMPLETIONS, "{'model':'m','prompt':'x'}"),
    ]  # fmt: skip
    raw: list[tuple[str, str, bytes]] = [
        (name, path, body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body)
        for name, path, body in out
    ]
    raw += [
        ("invalid UTF-8 in content", CHAT, b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe"}]}'),
        ("invalid UTF-8 in a key", COMPLETIONS, b'{"model":"m","pr\xc3ompt":"x"}'),
        ("invalid UTF-8 outside strings", COMPLETIONS, b'{"model":"m",\xff"prompt":"x"}'),
        ("CESU surrogate bytes", COMPLETIONS, b'{"model":"m","prompt":"\xed\xa0\x80"}'),
        ("overlong UTF-8", CHAT, b'{"model":"m","messages":[{"role":"user","content":"\xc0\xaf"}]}'),
        ("NUL bytes", COMPLETIONS, b'{"model":"m","prompt":"x"}\x00\x00'),
        ("binary", COMPLETIONS, bytes(range(256))),
        ("invalid UTF-8 in responses output", RESPONSES,
         b'{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":"\xff"}]}'),
    ]  # fmt: skip
    return raw


def _typed() -> list[tuple[str, str, Any]]:
    """Bodies json.dumps can spell: wrong types in every field epp reads, odd shapes."""
    wrong: list[Any] = [None, True, 0, -1, 1.5, "", "x", [], [None], {}, {"a": None}, [[[]]]]
    out: list[tuple[str, str, Any]] = []
    chat_fields = (
        "model", "messages", "stream", "cache_salt", "max_tokens", "max_completion_tokens",
        "truncate_prompt_tokens", "truncation_side", "tools", "tool_choice", "chat_template_kwargs",
        "documents", "reasoning_effort", "add_generation_prompt", "continue_final_message",
        "add_special_tokens", "kv_transfer_params", "echo", "stream_options",
    )  # fmt: skip
    base_chat = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    for field in chat_fields:
        for i, value in enumerate(wrong):
            out.append((f"chat {field}={i}", CHAT, {**base_chat, field: value}))
    message_fields = (
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "reasoning",
        "reasoning_content",
        "tools",
        "task",
    )
    for field in message_fields:
        for i, value in enumerate(wrong):
            for role in ("user", "assistant", "tool", "developer", "system"):
                msg = {"role": role, "content": "x", field: value}
                out.append((f"message {role}.{field}={i}", CHAT, {"model": "m", "messages": [msg]}))
    part_shapes: list[Any] = [
        {"type": None}, {"type": 5}, {"type": "text"}, {"type": "text", "text": 5}, {"type": "text", "text": None},
        {"type": "image_url"}, {"type": "image_url", "image_url": 5}, {"image_url": {"url": "x"}},
        {"type": "input_audio", "input_audio": None}, {"type": "tool_reference", "name": 5}, {"type": "thinking"},
        {"type": "refusal", "refusal": ["x"]}, {"uuid": "u"}, {"uuid": "u", "image_url": "x"}, "bare", 5, None, [],
        {"type": ["text"], "text": "x"}, {"type": {"text": 1}, "text": "x"}, {"type": ["image_url"]},
    ]  # fmt: skip
    for i, part in enumerate(part_shapes):
        for role in ("user", "assistant", "system", "tool"):
            out.append(
                (f"part {role} {i}", CHAT, {"model": "m", "messages": [{"role": role, "content": [part]}]})
            )
    tool_shapes: list[Any] = [
        {"type": "function"}, {"type": "function", "function": None}, {"type": "function", "function": {"name": 5}},
        {"type": "x", "function": {"name": "f"}}, {"function": {"name": "f", "parameters": "x"}},
        {"function": {"name": "f", "description": 5}}, {"function": {"name": "f", "strict": "maybe"}},
        {"function": {"name": "f"}, "defer_loading": []}, "tool", None,
    ]  # fmt: skip
    for i, tool in enumerate(tool_shapes):
        out.append((f"tool {i}", CHAT, {**base_chat, "tools": [tool]}))
        out.append(
            (
                f"tool {i} chosen",
                CHAT,
                {**base_chat, "tools": [tool], "tool_choice": {"function": {"name": "f"}}},
            )
        )
    function = {"type": "function", "function": {"name": "f"}}
    for i, choice in enumerate([*wrong, ["auto"], {"function": {"name": ["f"]}}, {"type": ["function"]}]):
        out.append(
            (f"tool_choice {i} with tools", CHAT, {**base_chat, "tools": [function], "tool_choice": choice})
        )
    call_shapes: list[Any] = [
        None, 5, {}, {"type": "function"}, {"id": 5, "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": 5}},
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{not json"}},
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}},
    ]  # fmt: skip
    for i, call in enumerate(call_shapes):
        msgs = [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "user", "content": "x"},
        ]
        out.append((f"tool call {i}", CHAT, {"model": "m", "messages": msgs}))
    for field in ("prompt", "input"):
        path = COMPLETIONS if field == "prompt" else EMBEDDINGS
        for i, value in enumerate([*wrong, [1, "a"], ["a", 1], [[1], 2], [[1], ["a"]], [[]], [-5], [True]]):
            out.append((f"{field}={i}", path, {"model": "m", field: value}))
        out.append((f"{field} with prompt_embeds", path, {"model": "m", field: "x", "prompt_embeds": "AAAA"}))
    for i, value in enumerate(
        [
            *wrong,
            [{"content": 5}],
            [{"type": "message", "content": [{"text": 5}]}],
            [{"output": 5}],
            # unhashable roles and statuses: a set lookup raised TypeError (an ERROR line)
            [{"role": [], "content": "x"}],
            [{"role": {"W": True}}],
            [{"role": "user", "content": "x"}, {"type": "reasoning", "status": ["in_progress"]}],
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "status": {}}],
        ]
    ):
        out.append((f"responses input={i}", RESPONSES, {"model": "m", "input": value}))
        out.append(
            (f"responses instructions={i}", RESPONSES, {"model": "m", "input": "x", "instructions": value})
        )
    # giant strings and lists (within the default 16 MiB body limit)
    out.append(
        ("giant content", CHAT, {"model": "m", "messages": [{"role": "user", "content": "a" * (4 << 20)}]})
    )
    out.append(("giant model name", COMPLETIONS, {"model": "m" * (1 << 20), "prompt": "x"}))
    out.append(("giant cache_salt", COMPLETIONS, {"model": "m", "prompt": "x", "cache_salt": "s" * 100_000}))
    out.append(("giant header-like key", COMPLETIONS, {"model": "m", "prompt": "x", "k" * 100_000: 1}))
    out.append(
        ("many messages", CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}] * 10_001})
    )
    out.append(
        (
            "many parts",
            CHAT,
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 20_001}],
            },
        )
    )
    out.append(
        ("many tools", CHAT, {**base_chat, "tools": [{"type": "function", "function": {"name": "f"}}] * 2001})
    )
    out.append(
        ("many input items", RESPONSES, {"model": "m", "input": [{"role": "user", "content": "x"}] * 10_001})
    )
    out.append(("many token ids", COMPLETIONS, {"model": "m", "prompt": list(range(200_000))}))
    out.append(("many prompts", COMPLETIONS, {"model": "m", "prompt": ["x"] * 100_000}))
    return out


def corpus() -> list[tuple[str, str, bytes]]:
    typed = [(name, path, json.dumps(body).encode()) for name, path, body in _typed()]
    return [*_raw(), *typed]
