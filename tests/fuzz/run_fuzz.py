"""The long fuzz run (a script, not a test): generated request bodies and header variants through
the Director and the ext-proc Stream, as tests/fuzz runs a seeded few hundred of each in CI.

    .venv/bin/python -m tests.fuzz.run_fuzz [--bodies 100000] [--headers 10000] [--seed 1]

Bodies: `tests.fuzz.strategies.bodies` (valid requests mutated, their bytes damaged) and the hand-
made corpus, routed by an in-process Director as `epp serve` builds it with KV events and the
shipped tokenizer; half of them also through body-parser processes. Headers: the hand-made header
cases and `tests.fuzz.headers.headers_strategy`, through a Stream in both body modes. Counts every
answer by status; a 5xx or an ERROR log line is a failure (printed, exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import sys
import time

from hypothesis import HealthCheck, given, seed, settings

from epp.extproc.stream import Stream
from epp.requestcontrol.offload import BodyParsers
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import load_shipped
from tests.extproc import helpers as h
from tests.fuzz.conftest import ErrorLog, build_director, route_once
from tests.fuzz.corpus import corpus
from tests.fuzz.headers import Headers, header_cases, headers_strategy
from tests.fuzz.strategies import bodies
from tests.fuzz.test_headers import answer_status


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--bodies", type=int, default=100_000)
    p.add_argument("--headers", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    errors = ErrorLog()
    logging.getLogger().addHandler(errors)
    toks = Tokenizers(default=load_shipped(), workers=1)
    parsers = BodyParsers(1, min_bytes=0)
    loop = asyncio.new_event_loop()
    here, there = build_director(toks), build_director(toks)
    there.prompts.body_parsers = parsers
    statuses: collections.Counter[int] = collections.Counter()
    failures: list[str] = []
    counter = iter(range(1 << 62))

    def judge(status: int, what: str) -> None:
        statuses[status] += 1
        logged = errors.take()
        if status >= 500 or status == 0 or logged:
            failures.append(f"{status} {logged} {what[:300]}")

    t0 = time.monotonic()
    try:
        for name, path, body in corpus():
            judge(loop.run_until_complete(route_once(here, path, body)), name)
        for name, headers, body in header_cases():
            for mode in (h.DUPLEX, h.BUFFERED):
                judge(loop.run_until_complete(answer_status(Stream(here), headers, body, mode)), name)

        @seed(args.seed)
        @settings(
            max_examples=args.bodies, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(bodies())
        def body_case(case: tuple[str, bytes]) -> None:
            path, body = case
            director = there if next(counter) % 2 else here
            judge(loop.run_until_complete(route_once(director, path, body)), repr(body))

        @seed(args.seed)
        @settings(
            max_examples=args.headers, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(headers_strategy())
        def header_case(case: tuple[Headers, bytes]) -> None:
            headers, body = case
            mode = h.DUPLEX if next(counter) % 2 else h.BUFFERED
            judge(loop.run_until_complete(answer_status(Stream(here), headers, body, mode)), repr(headers))

        body_case()
        header_case()
    finally:
        loop.close()
        parsers.close()
        toks.close()
    took = time.monotonic() - t0
    print(f"{sum(statuses.values())} requests in {took:.0f} s; statuses {dict(sorted(statuses.items()))}")
    print(f"failures (5xx, no answer or an ERROR line): {len(failures)}")
    for line in failures[:20]:
        print("  " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
