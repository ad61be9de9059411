"""Which requests make a run's first-token tail: `python -m epp.bench.tails DIR/records-*.jsonl`.

`epp bench --records` writes every request's record; this reads one or more of those files and
prints, per run (workload, policy, seed), the TTFT p50 and p99, then the slowest 1% of first
tokens (the requests at and above the p99): how many arrived in the run's first `--early` seconds
and how many were the first request of a shared prefix its pod computed cold (a request of a
shared-prefix group that got no cached token), and the TTFT p99 of the requests that arrived from
the `--after`-th second on. A short run's p99 is a dozen requests; when most of them are its first
seconds' cold prefills, the p99 from `--after` on is the figure that compares routing.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from epp.bench.report import STEADY_FROM_S, percentile


def load(path: str) -> list[dict[str, Any]]:
    """The records of one `records-*.jsonl` file; a line that is not a record is an error naming
    the file and the line."""
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                float(row["arrival"])
                if row.get("first_token") is not None:
                    float(row["first_token"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not an `epp bench --records` line ({exc})") from None
            rows.append(row)
    return rows


def anatomy(rows: Iterable[Mapping[str, Any]], *, early: float, after: float) -> dict[str, Any]:
    """The tail of one run's served requests (status 200 with a first token)."""
    served: list[tuple[float, float, Mapping[str, Any]]] = []  # (arrival, TTFT, record)
    for r in rows:
        if r.get("status") == 200 and r.get("first_token") is not None:
            arrival = float(r["arrival"])
            served.append((arrival, float(r["first_token"]) - arrival, r))
    ttft = sorted(t for _, t, _ in served)
    p99 = percentile(ttft, 99)
    tail = [(a, r) for a, t, r in served if t >= p99]
    return {
        "served": len(served),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": p99,
        "tail": len(tail),
        "tail_early": sum(1 for a, _ in tail if a < early),
        "tail_cold_shared": sum(1 for _, r in tail if r.get("group") and not r.get("cached_tokens")),
        "ttft_p99_after_s": percentile(sorted(t for a, t, _ in served if a >= after), 99),
    }


def _s(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def table(runs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], *, early: float, after: float) -> str:
    lines = [
        f"| workload | policy | seed | served | TTFT p50 s | TTFT p99 s | slowest 1% | of them before "
        f"{early:g} s | of them cold first of a shared prefix | TTFT p99 from {after:g} s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for head, a in runs:
        lines.append(
            f"| {head.get('workload', '?')} | {head.get('policy', '?')} | {head.get('seed', '?')} "
            f"| {a['served']} | {_s(a['ttft_p50_s'])} | {_s(a['ttft_p99_s'])} | {a['tail']} "
            f"| {a['tail_early']} | {a['tail_cold_shared']} | {_s(a['ttft_p99_after_s'])} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m epp.bench.tails",
        description="Which requests make each run's first-token tail, from `epp bench --records` files.",
    )
    ap.add_argument("records", nargs="+", metavar="RECORDS.jsonl")
    ap.add_argument("--early", type=float, default=15.0, help="the run's first seconds (default 15)")
    ap.add_argument(
        "--after",
        type=float,
        default=STEADY_FROM_S,
        help=f"the p99 of arrivals from here on (default {STEADY_FROM_S:g}, as results.json's "
        "ttft_p99_from_30s_s)",
    )
    args = ap.parse_args(argv)
    runs: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
    for path in args.records:
        try:
            rows = load(path)
        except (OSError, ValueError) as exc:
            ap.error(f"cannot read the records: {exc}")
        if rows:
            runs.append((rows[0], anatomy(rows, early=args.early, after=args.after)))
    print(table(runs, early=args.early, after=args.after))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
