"""Response tracking: usage from JSON and SSE (split anywhere), model rewrite back, garbage tolerance."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.api.responses import ResponseTracker, Usage

JSON_HEADERS = {":status": "200", "content-type": "application/json"}
SSE_HEADERS = {":status": "200", "content-type": "text/event-stream; charset=utf-8"}


def _tracker(
    headers: dict[str, str] = JSON_HEADERS, incoming: str = "m", target: str = "m", cap: int = 8 << 20
) -> ResponseTracker:
    t = ResponseTracker(incoming_model=incoming, target_model=target, max_buffer_bytes=cap)
    t.on_headers(headers)
    return t


def _run(t: ResponseTracker, chunks: list[bytes], eos_empty: bool = False) -> bytes:
    """Feed chunks (end_of_stream on the last, or on an extra empty chunk); return all forwarded bytes."""
    out = []
    for i, chunk in enumerate(chunks):
        out.append(t.on_chunk(chunk, end_of_stream=not eos_empty and i == len(chunks) - 1))
    if eos_empty or not chunks:
        out.append(t.on_chunk(b"", end_of_stream=True))
    return b"".join(out)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)] or [b""]


# --- fixtures: realistic bodies ------------------------------------------------------------------------


def _chunk(
    content: str, model: str = "tgt", sep: str = ":", usage: Any = None, with_usage_key: bool = True
) -> str:
    obj: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    if with_usage_key:
        obj["usage"] = usage
    return json.dumps(obj, separators=(",", sep))


USAGE_WIRE = {
    "prompt_tokens": 12,
    "completion_tokens": 5,
    "total_tokens": 17,
    "prompt_tokens_details": {"cached_tokens": 8},
}
USAGE = Usage(prompt_tokens=12, completion_tokens=5, cached_tokens=8)

SSE_EVENTS = [
    _chunk("Hel"),
    _chunk('lo "usage": not a key', sep=": "),  # the word in content is escaped: never a match
    _chunk("!", with_usage_key=False),
    json.dumps({"id": "chatcmpl-1", "model": "tgt", "choices": [], "usage": USAGE_WIRE}),
    "[DONE]",
]
SSE_STREAM = "".join(f"data: {e}\n\n" for e in SSE_EVENTS).encode()
SSE_STREAM_CRLF = SSE_STREAM.replace(b"\n", b"\r\n")

RESPONSES_SSE = (
    b"event: response.created\n"
    b'data: {"type":"response.created","response":{"id":"r1","model":"tgt","usage":null}}\n\n'
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","delta":"Hi"}\n\n'
    b": keep-alive comment\n\n"
    b"event: response.completed\n"
    b'data: {"type":"response.completed","response":{"id":"r1","model":"tgt","usage":'
    b'{"input_tokens":30,"output_tokens":7,"input_tokens_details":{"cached_tokens":16},"total_tokens":37}}}\n\n'
)
RESPONSES_USAGE = Usage(prompt_tokens=30, completion_tokens=7, cached_tokens=16)


# --- headers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "streaming"),
    [
        ({":status": "200", "content-type": "application/json"}, 200, False),
        ({":status": "200", "content-type": "text/event-stream"}, 200, True),
        ({":status": "200", "content-type": "Text/Event-Stream; charset=utf-8"}, 200, True),
        ({":status": "503"}, 503, False),
        ({":status": "oops", "content-type": "text/event-stream"}, 0, True),
        ({}, 0, False),
    ],
)
def test_on_headers(headers: dict[str, str], status: int, streaming: bool) -> None:
    t = ResponseTracker(incoming_model="m", target_model="m")
    assert t.status == 0 and t.streaming is False and t.usage is None and t.first_chunk_at is None
    t.on_headers(headers)
    assert t.status == status
    assert t.streaming is streaming


def test_first_chunk_at() -> None:
    t = _tracker(SSE_HEADERS)
    t.on_chunk(b"", end_of_stream=False)
    assert t.first_chunk_at is None  # empty chunks do not count
    t.on_chunk(b"data: {}\n\n", end_of_stream=False)
    first = t.first_chunk_at
    assert first is not None
    t.on_chunk(b"data: {}\n\n", end_of_stream=True)
    assert t.first_chunk_at == first


# --- non-streaming JSON ------------------------------------------------------------------------------

CHAT_JSON = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "model": "tgt",
        "choices": [{"message": {"content": "x"}}],
        "usage": USAGE_WIRE,
    }
).encode()


@pytest.mark.parametrize(
    ("body", "usage"),
    [
        (CHAT_JSON, USAGE),
        (b'{"usage":{"prompt_tokens":3,"completion_tokens":4}}', Usage(3, 4, None)),
        (
            b'{"usage":{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":null}}',
            Usage(3, 4, None),
        ),
        (
            b'{"object":"response","usage":{"input_tokens":9,"output_tokens":2,"input_tokens_details":{"cached_tokens":0}}}',
            Usage(9, 2, 0),
        ),
        (
            b'{"object":"list","data":[{"embedding":[0.1]}],"usage":{"prompt_tokens":4,"total_tokens":4}}',
            Usage(4, None, None),
        ),
        (b'{"usage":null}', None),
        (b'{"choices":[]}', None),
        (b'{"error":{"message":"bad","type":"invalid_request_error"}}', None),
        # garbage never raises
        (b"", None),
        (b"not json", None),
        (b'{"usage":{"prompt_tokens":"many"}}', None),
        (b'{"usage":{"prompt_tokens":3', None),  # truncated
        (b'{"usage":{"prompt_tokens":"\xff\xfe"}}', None),  # not UTF-8
        # msgspec skips unknown fields without UTF-8 checks: bad bytes elsewhere cost nothing
        (b'{"usage":{"prompt_tokens":3},"x":"\xff\xfe"}', Usage(3, None, None)),
        (b"[1,2,3]", None),
        (b"\x00\x01\x02", None),
    ],
)
def test_json_usage(body: bytes, usage: Usage | None) -> None:
    t = _tracker()
    assert _run(t, [body]) == body
    assert t.usage == usage


def test_json_usage_across_chunks_and_empty_final_chunk() -> None:
    t = _tracker()
    chunks = _split(CHAT_JSON, [7, 50, 51, 120])
    forwarded = [t.on_chunk(c, end_of_stream=False) for c in chunks]
    assert t.usage is None  # only known at end of stream
    assert all(f is c for f, c in zip(forwarded, chunks, strict=True))  # no rewrite: same objects
    assert t.on_chunk(b"", end_of_stream=True) == b""
    assert t.usage == USAGE


@pytest.mark.parametrize(("cap", "usage"), [(len(CHAT_JSON), USAGE), (len(CHAT_JSON) - 1, None)])
def test_json_buffer_cap(cap: int, usage: Usage | None) -> None:
    t = _tracker(cap=cap)
    assert _run(t, _split(CHAT_JSON, [10, 100])) == CHAT_JSON  # forwarding is unaffected
    assert t.usage == usage


def test_headers_never_seen_is_treated_as_json() -> None:
    t = ResponseTracker(incoming_model="m", target_model="m")
    _run(t, [CHAT_JSON])
    assert t.usage == USAGE


# --- SSE -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [SSE_STREAM, SSE_STREAM_CRLF])
@pytest.mark.parametrize("eos_empty", [False, True])
def test_sse_usage_split_at_every_boundary(stream: bytes, eos_empty: bool) -> None:
    for cut in range(len(stream) + 1):
        t = _tracker(SSE_HEADERS)
        assert _run(t, [stream[:cut], stream[cut:]], eos_empty) == stream
        assert t.usage == USAGE, cut


@pytest.mark.parametrize("stream", [SSE_STREAM, SSE_STREAM_CRLF, RESPONSES_SSE])
def test_sse_one_byte_chunks(stream: bytes) -> None:
    t = _tracker(SSE_HEADERS)
    _run(t, [stream[i : i + 1] for i in range(len(stream))])
    assert t.usage == (RESPONSES_USAGE if stream is RESPONSES_SSE else USAGE)


@settings(max_examples=300, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
    crlf=st.booleans(),
    responses_api=st.booleans(),
    eos_empty=st.booleans(),
)
def test_sse_usage_any_chunking(cuts: list[int], crlf: bool, responses_api: bool, eos_empty: bool) -> None:
    stream = RESPONSES_SSE if responses_api else SSE_STREAM
    if crlf:
        stream = stream.replace(b"\n", b"\r\n")
    t = _tracker(SSE_HEADERS)
    assert _run(t, _split(stream, cuts), eos_empty) == stream
    assert t.usage == (RESPONSES_USAGE if responses_api else USAGE)


def test_sse_usage_is_known_as_soon_as_its_event_ends() -> None:
    t = _tracker(SSE_HEADERS)
    usage_event = SSE_STREAM.index(b'"choices": []')
    end = SSE_STREAM.index(b"\n\n", usage_event)
    t.on_chunk(SSE_STREAM[: end + 1], end_of_stream=False)
    assert t.usage is None  # the blank line has not arrived yet
    t.on_chunk(SSE_STREAM[end + 1 : end + 2], end_of_stream=False)
    assert t.usage == USAGE


@pytest.mark.parametrize(
    ("stream", "usage"),
    [
        # last non-null usage wins
        (
            b'data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
            b'data: {"usage":{"prompt_tokens":2,"completion_tokens":3}}\n\n'
            b'data: {"usage":null}\n\n'
            b"data: [DONE]\n\n",
            Usage(2, 3, None),
        ),
        # "usage": null everywhere, and no usage at all
        (("".join(f"data: {_chunk('x')}\n\n" for _ in range(3)) + "data: [DONE]\n\n").encode(), None),
        (b'data: {"choices":[]}\n\ndata: [DONE]\n\n', None),
        # no space after "data:"
        (b'data:{"usage":{"prompt_tokens":4,"completion_tokens":5}}\n\n', Usage(4, 5, None)),
        # a JSON document split over two data lines of one event (joined with "\n")
        (b'data: {"usage":\ndata: {"prompt_tokens":6,"completion_tokens":7}}\n\n', Usage(6, 7, None)),
        # id/event/retry fields and comments are ignored
        (b': hi\nid: 1\nretry: 10\nevent: x\ndata: {"usage":{"prompt_tokens":1}}\n\n', Usage(1, None, None)),
        # final event without its blank line (truncated stream) still counts
        (b'data: {"usage":{"prompt_tokens":8,"completion_tokens":9}}', Usage(8, 9, None)),
        (b'data: {"usage":{"prompt_tokens":8,"completion_tokens":9}}\n', Usage(8, 9, None)),
        # truncated inside the event: nothing, no error
        (b'data: {"usage":{"prompt_tokens":8,"compl', None),
        # garbage
        (b'data: {not json, "usage"}\n\n', None),
        (b'data: {"usage":{"prompt_tokens":"x"}}\n\n', None),
        (b'data: {"usage":{"prompt_tokens":1,"completion_tokens":"\xff"}}\n\n', None),
        (b"\xff\xfe\x00garbage\n\n\r\r\n", None),
        # bare-CR line endings are not recognised (no server sends them): no usage, no error
        (b'data: {"usage":{"prompt_tokens":1}}\r\rdata: 1\r\r', None),
        (b"data: [DONE]\n\n", None),
        (b"", None),
        # a JSON body wrongly sent as SSE: no data lines, nothing
        (CHAT_JSON, None),
    ],
)
def test_sse_cases(stream: bytes, usage: Usage | None) -> None:
    t = _tracker(SSE_HEADERS)
    assert _run(t, [stream]) == stream
    assert t.usage == usage


def test_sse_truncated_anywhere_never_raises() -> None:
    for cut in range(len(SSE_STREAM)):
        t = _tracker(SSE_HEADERS)
        _run(t, [SSE_STREAM[:cut]])
        assert t.usage in (None, USAGE)
    # Cut after the usage event's data line: lenient end-of-stream handling still gets it.
    t = _tracker(SSE_HEADERS)
    _run(t, [SSE_STREAM[: SSE_STREAM.index(b"data: [DONE]")]])
    assert t.usage == USAGE


def test_sse_endless_line_stops_parsing_but_keeps_forwarding() -> None:
    t = _tracker(SSE_HEADERS, cap=100)
    long_chunk = b"x" * 80
    assert t.on_chunk(b"data: " + long_chunk, False) == b"data: " + long_chunk
    assert t.on_chunk(long_chunk, False) is long_chunk
    tail = b'\n\ndata: {"usage":{"prompt_tokens":1}}\n\n'
    assert t.on_chunk(tail, True) is tail
    assert t.usage is None  # parsing stopped for good after the cap


def test_sse_endless_event_stops_parsing() -> None:
    t = _tracker(SSE_HEADERS, cap=100)
    many_lines = b"data: 0123456789\n" * 20  # one event, never ended by a blank line
    t.on_chunk(many_lines, False)
    t.on_chunk(b'data: {"usage":{"prompt_tokens":1}}\n\n', True)
    assert t.usage is None


def test_sse_chunks_are_forwarded_unchanged_and_at_once() -> None:
    t = _tracker(SSE_HEADERS)
    chunks = _split(SSE_STREAM, [3, 100, 101, 300])
    for chunk in chunks:
        assert t.on_chunk(chunk, end_of_stream=False) is chunk
    assert t.usage == USAGE


@pytest.mark.parametrize("sse", [False, True])
@pytest.mark.parametrize("depth", [990, 1000, 5000, 100_000])
def test_a_response_nested_past_the_recursion_limit_is_no_usage_and_no_error(sse: bool, depth: int) -> None:
    """A pod's body nested ~1,000 deep broke epp's stream (RecursionError in the usage decode)."""
    doc = b'{"x":' + b"[" * depth + b"]" * depth + b',"usage":{"prompt_tokens":1}}'
    body = b"data: " + doc + b"\n\n" if sse else doc
    t = _tracker(SSE_HEADERS if sse else JSON_HEADERS, incoming="in", target="tgt")
    assert _run(t, [body[: len(body) // 2], body[len(body) // 2 :]]) == body
    assert t.usage in (None, Usage(prompt_tokens=1))


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=64), max_size=12), sse=st.booleans())
def test_garbage_never_raises(chunks: list[bytes], sse: bool) -> None:
    t = _tracker(SSE_HEADERS if sse else JSON_HEADERS, incoming="in", target="tgt")
    out = _run(t, chunks)
    assert out == _expected_rewrite(b"".join(chunks), "in", "tgt")
    assert t.usage is None or isinstance(t.usage, Usage)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(
        st.sampled_from(
            [b"data: ", b"data:", b"\n", b"\r\n", b"\r", b'{"usage":', b"null", b"}", b"[DONE]", b'"', b"x"]
        ),
        max_size=40,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
)
def test_sse_fuzz_with_syntax_fragments(lines: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(lines)
    whole = _tracker(SSE_HEADERS)
    _run(whole, [stream])
    split = _tracker(SSE_HEADERS)
    assert _run(split, _split(stream, cuts)) == stream
    assert split.usage == whole.usage  # chunking never changes what is parsed


# --- model name rewrite back -----------------------------------------------------------------------


def _unescape(data: bytes, name: str) -> bytes:
    return data.replace(json.dumps(name).encode(), json.dumps(name, ensure_ascii=False).encode())


def _expected_rewrite(data: bytes, incoming: str, target: str, ascii_only: bool = False) -> bytes:
    inc = json.dumps(incoming, ensure_ascii=ascii_only).encode()
    tgt = json.dumps(target, ensure_ascii=ascii_only).encode()
    return data.replace(b'"model":' + tgt, b'"model":' + inc).replace(b'"model": ' + tgt, b'"model": ' + inc)


REWRITE_SSE = "".join(
    f"data: {e}\n\n"
    for e in [_chunk("a", model="tgt"), _chunk("b", model="tgt", sep=": "), _chunk('"model":"tgt"'), "[DONE]"]
).encode()
REWRITE_JSON = b'{"id":"c","model":"tgt","choices":[],"usage":{"prompt_tokens":1},"extra":{"model": "tgt"}}'


def test_rewrite_json_body() -> None:
    t = _tracker(incoming="public", target="tgt")
    out = _run(t, [REWRITE_JSON])
    assert out == REWRITE_JSON.replace(b'"tgt"', b'"public"')
    assert t.usage == Usage(1, None, None)  # usage is read from the original bytes


def test_rewrite_sse_does_not_touch_escaped_content() -> None:
    t = _tracker(SSE_HEADERS, incoming="public", target="tgt")
    out = _run(t, [REWRITE_SSE])
    assert out.count(b'"model":"public"') == 2
    assert out.count(b'"model": "public"') == 1
    assert b'\\"model\\":\\"tgt\\"' in out  # inside a string the quotes are escaped: left alone
    assert b'"model":"tgt"' not in out and b'"model": "tgt"' not in out


@pytest.mark.parametrize(
    ("incoming", "target"),
    [
        ("public", "tgt"),
        ("t", "tgt"),
        ("tgt-long-name", "tgt"),
        ("tg", "tgt"),
        ("ünï", 'q"uo\\te'),
        ("public", "modèle-😀"),
    ],
)
@pytest.mark.parametrize("sse", [True, False])
@pytest.mark.parametrize("ascii_only", [False, True])  # how the server spells non-ASCII names
def test_rewrite_split_at_every_boundary(incoming: str, target: str, sse: bool, ascii_only: bool) -> None:
    data = REWRITE_SSE if sse else REWRITE_JSON
    data = _expected_rewrite(data, target, "tgt", ascii_only)  # put the target name in
    expected = _expected_rewrite(data, incoming, target, ascii_only)
    assert expected != data
    for cut in range(len(data) + 1):
        for eos_empty in (False, True):
            t = _tracker(SSE_HEADERS if sse else JSON_HEADERS, incoming=incoming, target=target)
            out = _run(t, [data[:cut], data[cut:]], eos_empty)
            # An ASCII target has one spelling, so the incoming name may come back as raw UTF-8
            # where the server would have escaped it: the same JSON, compare it unescaped.
            assert _unescape(out, incoming) == _unescape(expected, incoming), (cut, eos_empty)


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=2_000), max_size=40), sse=st.booleans())
def test_rewrite_any_chunking(cuts: list[int], sse: bool) -> None:
    data = REWRITE_SSE if sse else REWRITE_JSON
    t = _tracker(SSE_HEADERS if sse else JSON_HEADERS, incoming="public", target="tgt")
    held_max = len(b'"model": "tgt"') - 1
    out = []
    sent = 0
    for chunk in _split(data, cuts):
        piece = t.on_chunk(chunk, end_of_stream=False)
        out.append(piece)
        sent += len(chunk)
        # Never more than a pattern's length minus one is held back.
        assert len(_expected_rewrite(data[:sent], "public", "tgt")) - len(b"".join(out)) <= held_max
    out.append(t.on_chunk(b"", end_of_stream=True))
    assert b"".join(out) == _expected_rewrite(data, "public", "tgt")


def test_rewrite_holds_nothing_at_sse_event_boundaries() -> None:
    t = _tracker(SSE_HEADERS, incoming="public", target="tgt")
    for event in re.findall(rb"data: .*?\n\n", REWRITE_SSE, flags=re.S):
        assert t.on_chunk(event, end_of_stream=False) == _expected_rewrite(event, "public", "tgt")


def test_rewrite_holds_a_pattern_prefix_until_the_next_chunk() -> None:
    t = _tracker(incoming="public", target="tgt")
    assert t.on_chunk(b'{"id":"x","model":"tg', end_of_stream=False) == b'{"id":"x",'
    assert t.on_chunk(b't","n":1}', end_of_stream=True) == b'"model":"public","n":1}'
    # A prefix that turns out not to be the pattern is released unchanged.
    t = _tracker(incoming="public", target="tgt")
    assert t.on_chunk(b'{"model":"tg', end_of_stream=False) == b"{"
    assert t.on_chunk(b"x", end_of_stream=False) == b'"model":"tgx'
    # End of stream flushes whatever is held.
    t = _tracker(incoming="public", target="tgt")
    assert t.on_chunk(b'{"model"', end_of_stream=False) == b"{"
    assert t.on_chunk(b"", end_of_stream=True) == b'"model"'


def test_equal_names_are_zero_copy() -> None:
    t = _tracker(SSE_HEADERS, incoming="tgt", target="tgt")
    for chunk in _split(REWRITE_SSE, [5, 17, 200]):
        assert t.on_chunk(chunk, end_of_stream=False) is chunk


def test_rewrite_without_a_match_returns_the_same_object() -> None:
    t = _tracker(SSE_HEADERS, incoming="public", target="tgt")
    chunk = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    assert t.on_chunk(chunk, end_of_stream=False) is chunk


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_sse_multiline_event_split_at_every_boundary(newline: bytes) -> None:
    # A CRLF split between chunks must not read as a blank line that ends the event early.
    stream = newline.join(
        [b'data: {"usage":', b'data: {"prompt_tokens":6,', b'data: "completion_tokens":7}}', b"", b""]
    )
    for cut in range(len(stream) + 1):
        t = _tracker(SSE_HEADERS)
        _run(t, [stream[:cut], stream[cut:]])
        assert t.usage == Usage(6, 7, None), cut


# --- Anthropic's Messages (vLLM's /v1/messages) ------------------------------------------------------

ANTHROPIC_JSON = (
    b'{"id":"chatcmpl-1","type":"message","role":"assistant","content":[{"type":"text","text":"x"}],'
    b'"model":"m","stop_reason":"max_tokens","usage":{"input_tokens":9,"output_tokens":1,'
    b'"cache_creation_input_tokens":0,"cache_read_input_tokens":32}}'
)
ANTHROPIC_SSE = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"m1","type":"message","role":"assistant","content":[],'
    b'"model":"m","usage":{"input_tokens":9,"output_tokens":0,"cache_read_input_tokens":32}}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":5}}\n\n'
    b"event: message_stop\n"
    b'data: {"type":"message_stop"}\n\n'
)


def test_anthropic_usage_counts_the_cached_prompt() -> None:
    t = _tracker({":status": "200", "content-type": "application/json"})
    _run(t, [ANTHROPIC_JSON])
    assert t.usage == Usage(prompt_tokens=41, completion_tokens=1, cached_tokens=32)
    streamed = _tracker(SSE_HEADERS)
    _run(streamed, [ANTHROPIC_SSE[i : i + 7] for i in range(0, len(ANTHROPIC_SSE), 7)])
    # message_start has the prompt, message_delta only the output: both are kept
    assert streamed.usage == Usage(prompt_tokens=41, completion_tokens=5, cached_tokens=32)
