"""The Director's debug line per decision: what each scorer found per endpoint, so that why a live
request went where it did can be read after the fact (explain answers only for a request scored
now)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import msgspec
import pytest

from epp.requestcontrol.director import _json
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import load_shipped
from tests.requestcontrol.test_director_tokens import director  # the precise default over two pods

BODY = msgspec.json.encode({"model": "m", "prompt": "a prompt of a few words " * 20, "max_tokens": 4})


@pytest.fixture
async def tokenizers() -> AsyncIterator[Tokenizers]:
    toks = Tokenizers(default=load_shipped(), workers=1)
    yield toks
    toks.close()


def decisions(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "epp.director" and r.msg == "routed %s to %s"]


async def test_the_debug_line_carries_every_endpoints_terms(
    tokenizers: Tokenizers, caplog: pytest.LogCaptureFixture
) -> None:
    d = director(tokenizers)
    with caplog.at_level(logging.DEBUG, logger="epp.director"):
        ctx = await d.route(path="/v1/completions", headers={}, body=BODY, subset=None)
    d.finish(ctx, complete=True)
    (line,) = decisions(caplog)
    assert vars(line)["pick"] == ctx.booked.name
    endpoints = msgspec.json.decode(vars(line)["endpoints"])
    assert set(endpoints) == {"pod-0", "pod-1"}
    for terms in endpoints.values():
        # request-latency-scorer's whole-request objective and the first-token terms under it
        assert {"objective_s", "predicted_ttft_s", "queue_s", "uncached_tokens", "e2e_s"} <= set(terms)
    # the pick is the least objective (max-score-picker over min/objective)
    assert endpoints[ctx.booked.name]["objective_s"] == min(t["objective_s"] for t in endpoints.values())
    facts = msgspec.json.decode(vars(line)["facts"])
    assert "miss_penalty" in facts  # the request's own facts: the miss penalty it was priced at


async def test_no_line_above_debug(tokenizers: Tokenizers, caplog: pytest.LogCaptureFixture) -> None:
    d = director(tokenizers)
    with caplog.at_level(logging.INFO, logger="epp.director"):
        ctx = await d.route(path="/v1/completions", headers={}, body=BODY, subset=None)
    d.finish(ctx, complete=True)
    assert decisions(caplog) == []


def test_a_value_json_cannot_hold_is_logged_as_text() -> None:
    class Odd:
        def __str__(self) -> str:
            return "odd"

    assert msgspec.json.decode(_json({"x": Odd(), "s": {3}})) == {"x": "odd", "s": [3]}
