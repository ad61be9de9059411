"""400, never 500: every client fault is answered 4xx by the Director, with no ERROR logged.

The corpus (tests/fuzz/corpus.py) holds the defects of issue 19 and hand-made nasty bodies;
hypothesis then mutates valid bodies (wrong types in any field, any nesting) and their bytes.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, seed, settings

from epp.api import errors
from epp.requestcontrol.offload import BodyParsers
from epp.tokenize.registry import Tokenizers
from tests.fuzz.conftest import ErrorLog, build_director, route_once
from tests.fuzz.corpus import CHAT, PATHS, corpus
from tests.fuzz.strategies import bodies


async def test_corpus_is_answered_without_5xx_or_error_logs(
    tokenizers: Tokenizers, error_log: ErrorLog
) -> None:
    director = build_director(tokenizers)
    failures = []
    for name, path, body in corpus():
        status = await route_once(director, path, body)
        logged = error_log.take()
        if status >= 500 or logged:
            failures.append(f"{name} ({path}): {status} {logged}")
    assert not failures, "\n".join(failures)
    assert all(ep.inflight_requests == 0 for ep in director.datastore.endpoints())


async def test_corpus_gets_the_same_answers_through_the_body_parsers(
    tokenizers: Tokenizers, error_log: ErrorLog
) -> None:
    # Every body parsed and every chat rendered in a body-parser process (min_bytes 0): the
    # answers must be the in-process ones, errors included (they cross a pickle).
    here, there = build_director(tokenizers), build_director(tokenizers)
    parsers = BodyParsers(1, min_bytes=0)
    there.prompts.body_parsers = parsers
    try:
        diffs = []
        for name, path, body in corpus():
            expected, got = await route_once(here, path, body), await route_once(there, path, body)
            logged = error_log.take()
            if got != expected or logged:
                diffs.append(f"{name} ({path}): in process {expected}, offloaded {got} {logged}")
        assert not diffs, "\n".join(diffs)
        assert parsers.restarts == 0
    finally:
        parsers.close()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"model":"m","prompt":[9223372036854775808]}', "<= 9223372036854775807"),
        (
            b'{"model":"m","messages":[{"role":"user","content":"x"}],"x":'
            + b"[" * 1000
            + b"]" * 1000
            + b"}",
            "nested",
        ),
    ],
)
async def test_issue_19_cases_are_400(tokenizers: Tokenizers, body: bytes, reason: str) -> None:
    director = build_director(tokenizers)
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    with pytest.raises(errors.BadRequest, match=reason):
        await director.route(path=path, headers={}, body=body, subset=None)


def test_generated_bodies_are_answered_without_5xx_or_error_logs(
    tokenizers: Tokenizers, error_log: ErrorLog
) -> None:
    loop = asyncio.new_event_loop()
    director = build_director(tokenizers)

    @seed(19)  # the seeded subset CI runs; python -m tests.fuzz.run_fuzz runs 100,000
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(bodies())
    def check(case: tuple[str, bytes]) -> None:
        path, body = case
        status = loop.run_until_complete(route_once(director, path, body))
        logged = error_log.take()
        assert status < 500 and not logged, (status, logged, body[:300])

    try:
        check()
    finally:
        loop.close()
    assert CHAT in PATHS
