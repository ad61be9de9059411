"""Decoding ext-proc requests without copying a large request body.

Protobuf copies a bytes field twice on its way to Python: once when upb parses the message
(into its arena) and once when the field is read (into a new `bytes`). For a 16 MiB body that
is ~1.6 ms each, with the GIL held, in the step of the stream that reads it: other streams wait
(issue 19, `tests/api/bench_big_bodies.py`). A large message whose payload is a request body is
therefore taken apart by hand: the body stays a view into the bytes gRPC delivered, and protobuf
parses only the rest of the message (a few bytes: end_of_stream, metadata, protocol_config).
The stream then copies the body once, when it is complete.

Anything this walk does not expect (a field repeated, a wire type it does not know, a length
that does not fit) goes to protobuf whole: the result is then exactly what protobuf says.
"""

from __future__ import annotations

import dataclasses

from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest

# Below this a message is parsed by protobuf as it comes: the copies cost microseconds.
LARGE_MESSAGE = 64 << 10

_LEN = 2  # wire type: length-delimited
_REQUEST_BODY = 4  # ProcessingRequest.request_body (HttpBody)
_BODY = 1  # HttpBody.body


@dataclasses.dataclass(frozen=True, slots=True)
class RequestBody:
    """A request_body message taken apart: `message` is the message with an empty body (every
    other field as sent), `body` the body, a view into the bytes gRPC delivered."""

    message: ProcessingRequest
    body: memoryview


def decode_request(raw: bytes) -> ProcessingRequest | RequestBody:
    """The gRPC request deserializer of epp's ext-proc service."""
    if len(raw) >= LARGE_MESSAGE:
        split = _split_body(raw)
        if split is not None:
            return split
    return ProcessingRequest.FromString(raw)


def _split_body(raw: bytes) -> RequestBody | None:
    """`raw` as a RequestBody, or None when it is not a request body or not a shape handled
    here (protobuf then parses it whole)."""
    found = _only_field(raw, 0, len(raw), _REQUEST_BODY)
    if found is None:
        return None
    start, end, payload_start = found  # the request_body field, and where its HttpBody begins
    inner = _only_field(raw, payload_start, end, _BODY)
    if inner is None:
        return None
    body_start, body_end, data_start = inner
    # The message without the body field: protobuf parses that (a few bytes), and the HttpBody's
    # length prefix is rewritten for what is left of it.
    rest_of_http_body = raw[payload_start:body_start] + raw[body_end:end]
    rest = b"".join(
        (raw[:start], _key(_REQUEST_BODY), _varint(len(rest_of_http_body)), rest_of_http_body, raw[end:])
    )
    try:
        message = ProcessingRequest.FromString(rest)
    except Exception:  # protobuf's DecodeError: let it judge the whole message
        return None
    if message.WhichOneof("request") != "request_body":  # a later oneof field won
        return None
    return RequestBody(message, memoryview(raw)[data_start:body_end])


def _only_field(buf: bytes, pos: int, end: int, number: int) -> tuple[int, int, int] | None:
    """The single length-delimited occurrence of field `number` in buf[pos:end]: its start, its
    end and where its payload starts. None if absent, repeated (protobuf would merge or pick the
    last), or if anything in the range is malformed."""
    found: tuple[int, int, int] | None = None
    while pos < end:
        field_start = pos
        key, pos = _read_varint(buf, pos, end)
        if key < 0:
            return None
        wire_type, field = key & 7, key >> 3
        if wire_type == 0:
            _, pos = _read_varint(buf, pos, end)
            if pos < 0:
                return None
        elif wire_type == _LEN:
            length, pos = _read_varint(buf, pos, end)
            if length < 0 or pos + length > end:
                return None
            if field == number:
                if found is not None:
                    return None
                found = (field_start, pos + length, pos)
            pos += length
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:  # groups, or garbage
            return None
    if pos != end:
        return None
    return found


def request_body_answer(chunk: bytes | memoryview, end_of_stream: bool) -> bytes:
    """The serialized ProcessingResponse that sends `chunk` back as the request body in
    FULL_DUPLEX_STREAMED mode: request_body.response.body_mutation.streamed_response
    {body, end_of_stream}. Built by hand from a view, one copy of the chunk, where building the
    message copied it twice (the same bytes: tests/extproc/test_response_path.py); ~1.5 us for
    a 4 KB body against ~2.3 us through a kept message. (The response path, one small chunk per
    token, keeps its message: 0.4 us there against 1.2.)"""
    n = len(chunk)
    body_field = 1 + _varint_size(n) + n if n else 0  # proto3: an empty body is not sent
    inner = body_field + (2 if end_of_stream else 0)  # StreamedBodyResponse
    mutation = 1 + _varint_size(inner) + inner  # BodyMutation.streamed_response
    common = 1 + _varint_size(mutation) + mutation  # CommonResponse.body_mutation
    response = 1 + _varint_size(common) + common  # BodyResponse.response
    header = b"".join(
        (
            b"\x1a",  # ProcessingResponse.request_body (3, length-delimited)
            _varint(response),
            b"\x0a",  # BodyResponse.response (1)
            _varint(common),
            b"\x1a",  # CommonResponse.body_mutation (3)
            _varint(mutation),
            b"\x1a",  # BodyMutation.streamed_response (3)
            _varint(inner),
            b"\x0a" + _varint(n) if n else b"",  # StreamedBodyResponse.body (1)
        )
    )
    return b"".join((header, chunk, b"\x10\x01" if end_of_stream else b""))  # end_of_stream (2)


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, next position), or (-1, -1) if the varint runs past `end` or past 10 bytes."""
    value = 0
    shift = 0
    while pos < end and shift < 70:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return -1, -1


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(number: int) -> bytes:
    return _varint(number << 3 | _LEN)
