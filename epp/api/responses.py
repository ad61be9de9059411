"""The response path: forward model-server bytes at once, learn token usage, undo the model rewrite.

Role: one `ResponseTracker` per request sees the response headers and every body chunk on its way
back to the client. It returns the bytes to forward (never holding a chunk back), records the status,
whether the response streams (SSE), when the first body byte arrived, and the token `Usage` the
server reported, for metrics and load accounting.

Design:
  * Usage, non-streaming: chunks are kept (references to the immutable chunks, no copy) up to
    `max_buffer_bytes` and decoded once at end of stream into a tiny Struct (`usage` only; msgspec
    skips the rest of the body in C). Over the cap the copy is dropped: no usage, no error.
  * Usage, SSE: an incremental line parser that survives events, lines and even CRLF pairs split
    across chunks (lines end in LF or CRLF; a bare CR, which no model server sends, is not a line
    break: recognising it would cost a second scan of every chunk). Data lines are gathered per
    event (the SSE rule: several `data:` lines join with "\\n"), and an event is JSON-decoded only
    if its bytes contain `"usage"` followed by something other than `null` (OpenAI sends
    `"usage":null` in every chunk once include_usage is on): a C-level bytes search per event, so
    ordinary token chunks are never decoded. The last non-null usage wins, field by field; the
    Responses API's `response.usage` (response.completed) and Anthropic's `message.usage`
    (message_start) are read the same way. Anthropic's input_tokens excludes the cached prompt:
    its prompt is input + cache read + cache creation, its cached tokens the cache read.
  * Model rewrite back (GIE behaviour): `"model":"<target>"` and `"model": "<target>"` become the
    incoming name in forwarded bytes (names spelled as raw UTF-8 or, if non-ASCII, \\u-escaped).
    A pattern split over two chunks is caught by holding back the longest chunk tail that is a
    proper prefix of a pattern: at most len(pattern)-1 bytes, and only when the chunk really ends
    in such a prefix, which an SSE chunk ending in "\\n" never does (checked in O(1) on the last
    byte). Delivery is thus delayed only in that case and only until the next chunk; end of stream
    flushes it. Usage parsing reads the original chunks, so it is independent of the rewrite. With
    equal names the chunk object itself is returned (zero copy); bytes.replace also returns the
    same object when nothing matched.
  * Nothing here raises on garbage (bad JSON, truncated streams, non-UTF-8): it yields no usage.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

import msgspec

from epp import clock


@dataclasses.dataclass(slots=True, frozen=True)
class Usage:
    """Token counts the model server reported (None when it did not say)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


# --- Wire shapes: chat/completions name the fields prompt_/completion_tokens, the Responses API
# input_/output_tokens; both are declared so one decoder serves every API. -------------------------


class _TokenDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _WireUsage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _TokenDetails | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_tokens_details: _TokenDetails | None = None
    # Anthropic's Messages: input_tokens is what the cache did not serve
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _WireResponse(msgspec.Struct):
    usage: _WireUsage | None = None


class _WireBody(msgspec.Struct):
    usage: _WireUsage | None = None
    response: _WireResponse | None = None  # Responses API streaming events (response.completed)
    message: _WireResponse | None = None  # Anthropic's message_start event


_BODY_DECODER = msgspec.json.Decoder(_WireBody)

_USAGE_KEY = b'"usage"'
_NULL_USAGE = (b'"usage":null', b'"usage": null')


def _to_usage(w: _WireUsage) -> Usage:
    if w.cache_read_input_tokens is not None or w.cache_creation_input_tokens is not None:
        # Anthropic's: the prompt is what was read from the cache, written to it, and the rest
        read = w.cache_read_input_tokens
        parts = (w.input_tokens, read, w.cache_creation_input_tokens)
        prompt = sum(n or 0 for n in parts) if w.input_tokens is not None else None
        return Usage(prompt, w.output_tokens, read)
    prompt = w.prompt_tokens if w.prompt_tokens is not None else w.input_tokens
    completion = w.completion_tokens if w.completion_tokens is not None else w.output_tokens
    details = w.prompt_tokens_details if w.prompt_tokens_details is not None else w.input_tokens_details
    return Usage(prompt, completion, details.cached_tokens if details is not None else None)


def _decode_usage(data: bytes) -> Usage | None:
    """Usage from one JSON document (a whole body or one SSE event), or None on anything odd."""
    try:
        body = _BODY_DECODER.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):  # ValidationError is a DecodeError
        return None
    except RecursionError:  # skipping a field nested ~1,000 deep (a pod's garbage): no usage
        return None
    wire = body.usage
    if wire is None and body.response is not None:
        wire = body.response.usage
    if wire is None and body.message is not None:
        wire = body.message.usage
    return _to_usage(wire) if wire is not None else None


class ResponseTracker:
    """Per-request response state. Not thread-safe: one ext-proc stream drives it in order."""

    __slots__ = (
        "_buf_len",
        "_buffer",
        "_event",
        "_event_len",
        "_held",
        "_line",
        "_longest",
        "_max_buffer",
        "_pattern_bytes",
        "_patterns",
        "_sse_broken",
        "first_chunk_at",
        "status",
        "streaming",
        "usage",
    )

    def __init__(self, *, incoming_model: str, target_model: str, max_buffer_bytes: int = 8 << 20) -> None:
        self.status = 0
        self.streaming = False
        self.usage: Usage | None = None
        self.first_chunk_at: float | None = None
        self._max_buffer = max_buffer_bytes
        # Non-streaming body copy; None once over the cap.
        self._buffer: list[bytes] | None = []
        self._buf_len = 0
        # SSE parser: the unterminated last line and the current event's data lines.
        self._line = bytearray()
        self._event: list[bytes] = []
        self._event_len = 0
        self._sse_broken = False  # a line or event longer than the cap: stop parsing, keep forwarding
        # Rewrite-back patterns, (search, replacement), and the held-back possible pattern prefix.
        self._patterns: tuple[tuple[bytes, bytes], ...] = ()
        self._pattern_bytes: frozenset[int] = frozenset()
        self._longest = 0
        self._held = b""
        if incoming_model != target_model:
            # The names as JSON spells them (quotes, escapes): raw UTF-8 as msgspec, pydantic and
            # our own request rewrite write them, and, for a non-ASCII target, also the \uXXXX form
            # of Python's json.dumps default, replaced in the same style. (An ASCII target has one
            # spelling; the incoming name then goes in as raw UTF-8, equally valid JSON.)
            names = [(msgspec.json.encode(target_model), msgspec.json.encode(incoming_model))]
            if not target_model.isascii():
                names.append((json.dumps(target_model).encode(), json.dumps(incoming_model).encode()))
            self._patterns = tuple(
                (key + tgt, key + inc) for tgt, inc in names for key in (b'"model":', b'"model": ')
            )
            self._pattern_bytes = frozenset(b"".join(p for p, _ in self._patterns))
            self._longest = max(len(p) for p, _ in self._patterns)

    # --- headers -------------------------------------------------------------------------------

    def on_headers(self, headers: Mapping[str, str]) -> None:
        """Record `:status` and whether the body is an SSE stream (content-type text/event-stream)."""
        try:
            self.status = int(headers.get(":status", "0"))
        except ValueError:
            self.status = 0
        self.streaming = "text/event-stream" in headers.get("content-type", "").lower()

    # --- body ------------------------------------------------------------------------------------

    def on_chunk(self, chunk: bytes, end_of_stream: bool) -> bytes:
        """Account for one body chunk and return the bytes to forward now (possibly b"")."""
        if chunk and self.first_chunk_at is None:
            self.first_chunk_at = clock.now()
        if self.streaming:
            if chunk and not self._sse_broken:
                self._feed_sse(chunk)
            if end_of_stream:
                self._finish_sse()
        elif self._buffer is not None:
            self._feed_json(self._buffer, chunk, end_of_stream)
        if not self._patterns:
            return chunk
        return self._rewrite(chunk, end_of_stream)

    # --- non-streaming JSON ----------------------------------------------------------------------

    def _feed_json(self, buf: list[bytes], chunk: bytes, end_of_stream: bool) -> None:
        if chunk:
            self._buf_len += len(chunk)
            if self._buf_len > self._max_buffer:
                self._buffer = None  # too big to be worth it: forward only
                return
            buf.append(chunk)
        if end_of_stream:
            self._buffer = None
            if buf:
                usage = _decode_usage(buf[0] if len(buf) == 1 else b"".join(buf))
                if usage is not None:
                    self.usage = usage

    # --- SSE -------------------------------------------------------------------------------------
    # Lines end in "\n" or "\r\n" (a CR is stripped from the lines we look at, so a CRLF split
    # between chunks needs no state). A bare-CR line ending, legal in SSE but emitted by no model
    # server, is not recognised: it would cost a second scan of every chunk.

    def _feed_sse(self, chunk: bytes) -> None:
        # rfind: a chunk normally ends in "\n", so this is O(1) where `in` would scan it all.
        if chunk.rfind(b"\n") == -1:
            # The middle of a long line: just accumulate (bytearray append is amortised O(1)).
            self._line += chunk
            if len(self._line) > self._max_buffer:
                self._break_sse()
            return
        if self._line:
            self._line += chunk
            data = bytes(self._line)
            self._line = bytearray()
        else:
            data = chunk
        lines = data.split(b"\n")
        tail = lines.pop()  # after the last "\n": b"" or an unterminated line
        if tail:
            self._line += tail
        event = self._event
        for line in lines:
            if not line or line == b"\r":
                if event:
                    self._dispatch(event)
                    event.clear()
                    self._event_len = 0
            elif line.startswith(b"data:"):
                self._event_len += len(line)
                event.append(_data_value(line))
            # event:, id:, retry: and ":" comments carry nothing we need.
        if self._event_len > self._max_buffer:  # an endless event: same cap as a JSON body
            self._break_sse()

    def _break_sse(self) -> None:
        self._sse_broken = True
        self._line = bytearray()
        self._event.clear()
        self._event_len = 0

    def _finish_sse(self) -> None:
        # Be lenient at end of stream: a final event without its blank line still counts.
        if self._line.startswith(b"data:"):
            self._event.append(_data_value(bytes(self._line)))
        self._line = bytearray()
        if self._event:
            self._dispatch(self._event)
            self._event.clear()
            self._event_len = 0

    def _dispatch(self, event: list[bytes]) -> None:
        data = event[0] if len(event) == 1 else b"\n".join(event)
        # Cheap filters first: most events are token deltas without usage, or with "usage":null.
        # ("[DONE]" has no usage key, so it is skipped here too.)
        i = data.find(_USAGE_KEY)
        if i == -1:
            return
        after = i + len(_USAGE_KEY)
        if (data.startswith(b":null", after) or data.startswith(b": null", after)) and data.find(
            _USAGE_KEY, after
        ) == -1:
            return
        usage = _decode_usage(data)
        if usage is not None:
            # A later event may report only some counts (Anthropic's message_delta: the output;
            # message_start had the input): the fields it leaves out keep their earlier values.
            earlier = self.usage
            if earlier is not None:
                usage = Usage(
                    usage.prompt_tokens if usage.prompt_tokens is not None else earlier.prompt_tokens,
                    usage.completion_tokens
                    if usage.completion_tokens is not None
                    else earlier.completion_tokens,
                    usage.cached_tokens if usage.cached_tokens is not None else earlier.cached_tokens,
                )
            self.usage = usage

    # --- model name rewrite back -------------------------------------------------------------

    def _rewrite(self, chunk: bytes, end_of_stream: bool) -> bytes:
        data = self._held + chunk if self._held else chunk
        self._held = b""
        for pattern, replacement in self._patterns:
            data = data.replace(pattern, replacement)
        # A byte that occurs in no pattern (an SSE chunk's final "\n", a JSON "}") ends no prefix.
        if end_of_stream or not data or data[-1] not in self._pattern_bytes:
            return data
        # Hold back the longest tail that could still grow into a pattern. Every pattern starts
        # with '"', so only the quotes among the last len(pattern)-1 bytes are candidates.
        i = data.find(b'"', max(0, len(data) - self._longest + 1))
        while i != -1:
            tail = data[i:]
            for pattern, _ in self._patterns:
                if pattern.startswith(tail):
                    self._held = tail
                    return data[:i]
            i = data.find(b'"', i + 1)
        return data


def _data_value(line: bytes) -> bytes:
    """The value of a `data:` line: one optional space after the colon and a CR before the LF dropped."""
    start = 6 if line[5:6] == b" " else 5
    return line[start:-1] if line.endswith(b"\r") else line[start:]
