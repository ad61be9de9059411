"""The latency-target headers x-slo-ttft-ms / x-slo-tpot-ms: milliseconds in, seconds on the
request; absent or 0 is no target; anything else that is not a target is a 400 naming the header."""

from __future__ import annotations

import json

import pytest

from epp.api import slo
from epp.api.errors import BadRequest
from epp.api.limits import RequestLimits
from epp.api.requests import parse_request
from epp.requestcontrol.offload import BodyParsers

BODY = json.dumps({"model": "m", "prompt": "hello"}).encode()


def _parse(headers: dict[str, str]) -> tuple[float | None, float | None]:
    req = parse_request(path="/v1/completions", headers=headers, body=BODY, request_id="r")
    return req.slo_ttft, req.slo_tpot


def test_absent_headers_mean_no_target() -> None:
    assert _parse({}) == (None, None)
    assert _parse({"x-other": "5"}) == (None, None)


@pytest.mark.parametrize(
    ("ttft", "tpot", "expected"),
    [
        ("500", "50", (0.5, 0.05)),
        ("250.5", None, (0.2505, None)),
        (None, "12.5", (None, 0.0125)),
        (" 1e3 ", ".5", (1.0, 0.0005)),
        ("1.", "2E1", (0.001, 0.02)),
        ("0", "0.0", (None, None)),  # 0 is no target, as llm-d reads it
        ("3600000", None, (3600.0, None)),  # one hour, the largest accepted
    ],
)
def test_targets_in_milliseconds_become_seconds(
    ttft: str | None, tpot: str | None, expected: tuple[float | None, float | None]
) -> None:
    headers = {k: v for k, v in ((slo.TTFT_HEADER, ttft), (slo.TPOT_HEADER, tpot)) if v is not None}
    got = _parse(headers)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "number of milliseconds"),
        ("  ", "number of milliseconds"),
        ("abc", "number of milliseconds"),
        ("nan", "number of milliseconds"),
        ("inf", "number of milliseconds"),
        ("-5", "must not be negative"),
        ("-0.5", "must not be negative"),
        ("+5", "number of milliseconds"),
        ("1_000", "number of milliseconds"),
        ("0x10", "number of milliseconds"),
        ("250ms", "number of milliseconds"),
        ("5,5", "number of milliseconds"),
        ("3600000.5", "at most 3600000 ms"),
        ("1e999", "at most 3600000 ms"),  # a float overflow is a bad value, not an infinite target
        ("9" * 400, "at most 3600000 ms"),
    ],
)
@pytest.mark.parametrize("header", [slo.TTFT_HEADER, slo.TPOT_HEADER])
def test_a_bad_value_is_a_400_naming_the_header(header: str, value: str, says: str) -> None:
    with pytest.raises(BadRequest) as err:
        _parse({header: value})
    reason = err.value.reason
    assert err.value.status == 400
    assert header in reason and says in reason
    assert "\n" not in reason and len(reason) < 160  # one short line, even for a 400-digit value


def test_the_other_header_is_checked_too() -> None:
    with pytest.raises(BadRequest, match=slo.TPOT_HEADER):
        _parse({slo.TTFT_HEADER: "500", slo.TPOT_HEADER: "fast"})


async def test_a_body_parsed_in_a_worker_process_carries_the_targets_and_the_400() -> None:
    """Large bodies are parsed in body-parser processes (epp.requestcontrol.offload): the targets
    and the refusal cross the process boundary as parsed here."""
    parsers = BodyParsers(1, min_bytes=0)
    big = json.dumps({"model": "m", "prompt": "p " * 3000}).encode()
    try:
        req = await parsers.parse(
            path="/v1/completions",
            headers={slo.TTFT_HEADER: "250", slo.TPOT_HEADER: "40"},
            body=big,
            request_id="r",
            subset_ips=None,
            limits=RequestLimits(),
        )
        assert (req.slo_ttft, req.slo_tpot) == (0.25, 0.04)
        with pytest.raises(BadRequest, match=slo.TTFT_HEADER):
            await parsers.parse(
                path="/v1/completions",
                headers={slo.TTFT_HEADER: "nan"},
                body=big,
                request_id="r",
                subset_ips=None,
                limits=RequestLimits(),
            )
    finally:
        parsers.close()
