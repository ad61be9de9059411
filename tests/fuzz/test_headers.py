"""Header abuse through the ext-proc layer (Stream, then the Director with KV events and
tokenization on): giant, repeated and malformed headers, every control and routing header epp
reads, odd paths and content types. Never a 5xx, never an ERROR line (header-abuse requests
logged 90 ERROR tracebacks before).

The hand-made cases and a seeded hypothesis sample run here; `scripts/fuzz_requests.py` runs
10,000 header variants (and 100,000 bodies) per run.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import HealthCheck, given, seed, settings

from epp.extproc.stream import Stream
from epp.tokenize.registry import Tokenizers
from tests.extproc import helpers as h
from tests.fuzz.conftest import ErrorLog, build_director
from tests.fuzz.headers import Headers, header_cases, headers_strategy


def headers_message(headers: Headers, mode: int) -> pb.ProcessingRequest:
    """The request-headers message Envoy sends: one entry per value, raw bytes."""
    raw = [base_pb2.HeaderValue(key=k, raw_value=v.encode("utf-8", "surrogatepass")) for k, v in headers]
    hm = base_pb2.HeaderMap(headers=raw)
    msg = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm))
    msg.protocol_config.request_body_mode = mode
    msg.protocol_config.response_body_mode = mode
    return msg


async def answer_status(stream: Stream, headers: Headers, body: bytes, mode: int) -> int:
    """What epp answers the request: its ImmediateResponse's status, or 200 when it routes it."""
    try:
        for msg in (headers_message(headers, mode), h.body_msg(body)):
            for response in await stream.handle(msg):
                resp = h.message(response)
                if resp.HasField("immediate_response"):
                    return int(resp.immediate_response.status.code)
                if resp.HasField("request_body") or (
                    resp.HasField("request_headers") and h.set_headers(resp)
                ):
                    return 200
        return 0  # not answered yet: never the case for a whole body
    finally:
        stream.close()


@pytest.mark.parametrize("trusted", [False, True])
async def test_header_cases_get_no_5xx_and_no_error_log(
    tokenizers: Tokenizers, error_log: ErrorLog, trusted: bool
) -> None:
    director = build_director(tokenizers)
    director.settings = dataclasses.replace(director.settings, trust_model_rewrite_header=trusted)
    failures = []
    for name, headers, body in header_cases():
        for mode in (h.DUPLEX, h.BUFFERED):
            status = await answer_status(Stream(director), headers, body, mode)
            logged = error_log.take()
            if status >= 500 or status == 0 or logged:
                failures.append(f"{name} (mode {mode}): {status} {logged}")
    assert not failures, "\n".join(failures[:30])
    assert all(ep.inflight_requests == 0 for ep in director.datastore.endpoints())


def test_generated_headers_get_no_5xx_and_no_error_log(tokenizers: Tokenizers, error_log: ErrorLog) -> None:
    loop = asyncio.new_event_loop()
    director = build_director(tokenizers)
    director.settings = dataclasses.replace(director.settings, trust_model_rewrite_header=True)

    @seed(30)
    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(headers_strategy())
    def check(case: tuple[Headers, bytes]) -> None:
        headers, body = case
        status = loop.run_until_complete(answer_status(Stream(director), headers, body, h.DUPLEX))
        logged = error_log.take()
        assert 0 < status < 500 and not logged, (status, logged, headers[:6])

    try:
        check()
    finally:
        loop.close()
