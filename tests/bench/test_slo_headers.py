"""`epp bench --slo-headers`: fast mode sends the latency target as x-slo-* headers, which reach
epp's default scorer; a target every candidate meets changes no decision."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from epp.bench import cli, fast
from epp.bench.policies import POLICIES

from . import helpers


def outcome(headers: Mapping[str, str] | None, seed: int = 7) -> list[tuple[object, ...]]:
    run = fast.FastRun(
        helpers.small(seed),
        POLICIES["epp"],
        profile=helpers.PROFILE,
        pods=helpers.PODS,
        seed=seed,
        request_headers=headers,
    )
    result = run.run()
    assert not result.stopped_early
    return [(r.arrival, r.pod, r.status, r.cached_tokens, r.first_token, r.finish) for r in result.records]


def test_targets_reach_the_scorer_and_easy_ones_change_nothing() -> None:
    plain = outcome(None)
    # Every candidate meets an hour: the same decisions, request by request.
    assert outcome({"x-slo-ttft-ms": "3600000", "x-slo-tpot-ms": "3600000"}) == plain
    # On this tiny fleet TTFTs are 10-25 ms (p50 13, p90 21): a 15 ms target moves some picks.
    tight = outcome({"x-slo-ttft-ms": "15"})
    # (a closed loop: other picks may change how many requests fit in the run)
    assert sum(a[1] != b[1] for a, b in zip(tight, plain, strict=False)) > 50


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_flag_is_recorded_and_is_for_fast_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--workload", "unique", "--policies", "epp", "--scale", "0.01", "--no-plots", "--slo-headers"]
    assert cli.run(parse(*argv, "--out", str(tmp_path), "--slo-ttft", "0.25")) == 0
    s = json.loads((tmp_path / "results.json").read_text())["workloads"]["unique"]["policies"]["epp"]
    assert s["slo_headers"] is True and s["slo_ttft_s"] == 0.25
    assert cli.run(parse("--workload", "unique", "--mode", "live", "--slo-headers")) == 2
    assert "--slo-headers is for --mode fast" in capsys.readouterr().err
