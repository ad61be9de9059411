"""epp.extproc.wire: a large request body taken apart by hand must read exactly as protobuf reads
the whole message, and anything else must be left to protobuf."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import message as pb_message
from google.protobuf import struct_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.extproc import messages as m
from epp.extproc.wire import LARGE_MESSAGE, RequestBody, decode_request


def _with_metadata(msg: pb.ProcessingRequest, subset: str) -> None:
    ns = msg.metadata_context.filter_metadata[m.SUBSET_NAMESPACE]
    ns.fields[m.SUBSET_KEY].string_value = subset


def _assert_same(raw: bytes) -> None:
    """decode_request(raw) reads as ProcessingRequest.FromString(raw)."""
    expected = pb.ProcessingRequest.FromString(raw)
    got = decode_request(raw)
    if isinstance(got, RequestBody):
        assert got.message.request_body.body == b""
        rebuilt = pb.ProcessingRequest()
        rebuilt.CopyFrom(got.message)
        rebuilt.request_body.body = bytes(got.body)
        assert rebuilt == expected
    else:
        assert got == expected


def test_a_large_body_is_a_view_and_the_rest_is_parsed() -> None:
    body = b"x" * (LARGE_MESSAGE * 2)
    msg = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
    _with_metadata(msg, "10.0.0.1:8000")
    msg.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.BUFFERED
    raw = msg.SerializeToString()
    got = decode_request(raw)
    assert isinstance(got, RequestBody)
    assert isinstance(got.body, memoryview) and got.body.obj is raw  # no copy of the body
    assert bytes(got.body) == body
    assert got.message.WhichOneof("request") == "request_body"
    assert got.message.request_body.end_of_stream
    assert m.subset_hint(got.message) == ["10.0.0.1:8000"]
    assert got.message.protocol_config.request_body_mode == processing_mode_pb2.ProcessingMode.BUFFERED
    _assert_same(raw)


def test_small_messages_and_other_kinds_go_to_protobuf() -> None:
    small = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True))
    assert isinstance(decode_request(small.SerializeToString()), pb.ProcessingRequest)
    big_response = pb.ProcessingRequest(response_body=pb.HttpBody(body=b"y" * LARGE_MESSAGE * 2))
    got = decode_request(big_response.SerializeToString())
    assert isinstance(got, pb.ProcessingRequest) and len(got.response_body.body) == LARGE_MESSAGE * 2
    headers = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key="k", raw_value=b"v" * LARGE_MESSAGE * 2)]
            )
        )
    )
    assert isinstance(decode_request(headers.SerializeToString()), pb.ProcessingRequest)


def test_shapes_protobuf_merges_are_left_to_it() -> None:
    """A body field sent twice (protobuf keeps the last), or request_body sent twice (merged), or a
    later oneof member that wins over request_body: protobuf's reading, not the walk's."""
    first = pb.HttpBody(body=b"a" * LARGE_MESSAGE).SerializeToString()
    second = pb.HttpBody(body=b"b" * LARGE_MESSAGE, end_of_stream=True).SerializeToString()
    twice_inside = pb.ProcessingRequest(request_body=pb.HttpBody.FromString(first + second))
    # Serializing re-normalizes; build the raw bytes by hand instead.
    raw_inner = first + second
    raw = _field(4, raw_inner)
    assert isinstance(decode_request(raw), pb.ProcessingRequest)
    _assert_same(raw)
    assert twice_inside.request_body.body == b"b" * LARGE_MESSAGE
    raw = _field(4, first) + _field(4, second)
    assert isinstance(decode_request(raw), pb.ProcessingRequest)
    _assert_same(raw)
    headers = pb.HttpHeaders(end_of_stream=True).SerializeToString()
    raw = _field(4, second) + _field(2, headers)  # request_headers after: the oneof is headers
    got = decode_request(raw)
    assert isinstance(got, pb.ProcessingRequest) and got.WhichOneof("request") == "request_headers"


def test_malformed_messages_fail_as_protobuf_fails() -> None:
    body = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"z" * LARGE_MESSAGE * 2)).SerializeToString()
    for raw in (body[:-10], body[:5] + b"\xff" * 12 + body[17:], b"\xff" * (LARGE_MESSAGE + 1)):
        with pytest.raises(pb_message.DecodeError):
            pb.ProcessingRequest.FromString(raw)
        with pytest.raises(pb_message.DecodeError):
            decode_request(raw)


@settings(max_examples=60, deadline=None)
@given(
    body_size=st.integers(min_value=0, max_value=LARGE_MESSAGE * 3),
    eos=st.booleans(),
    subset=st.one_of(st.none(), st.text(max_size=40)),
    mode=st.one_of(st.none(), st.sampled_from([1, 2, 3, 4, 5, 6])),
    extra=st.one_of(st.none(), st.text(max_size=200)),
)
def test_any_request_body_reads_as_protobuf_reads_it(
    body_size: int, eos: bool, subset: str | None, mode: int | None, extra: str | None
) -> None:
    msg = pb.ProcessingRequest(
        request_body=pb.HttpBody(body=bytes(range(256)) * (body_size // 256), end_of_stream=eos)
    )
    if subset is not None:
        _with_metadata(msg, subset)
    if mode is not None:
        msg.protocol_config.request_body_mode = mode
    if extra is not None:
        msg.attributes["envoy.filters.http.ext_proc"].fields["x"].CopyFrom(
            struct_pb2.Value(string_value=extra)
        )
    _assert_same(msg.SerializeToString())


def _field(number: int, payload: bytes) -> bytes:
    key = number << 3 | 2
    return bytes([key]) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
