"""`python -m epp.bench.tails`: which requests make a run's first-token tail, from the records
`epp bench --records` writes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from epp.bench import records, tails
from epp.bench.records import RequestRecord, RunResult


def record(
    arrival: float, ttft: float, *, group: str = "", cached: int = 0, status: int = 200
) -> RequestRecord:
    r = RequestRecord(arrival, 0, group, 4096, 4096 if group else 0, 16, pod=0, status=status)
    if status == 200:
        r.first_token, r.finish, r.cached_tokens = arrival + ttft, arrival + ttft + 1.0, cached
    return r


def run(tmp_path: Path) -> Path:
    # 200 requests over 100 s at 0.1 s, four cold first requests of shared prefixes in the first
    # 10 s at 0.60-0.63 s and three slow hits after the 30th second (0.5 s), one refused.
    rs = [record(0.5 * i, 0.1, group="p" if i % 2 else "", cached=4096 if i % 2 else 0) for i in range(200)]
    for i, t in enumerate((1.0, 3.0, 5.0, 7.0)):
        rs[int(t * 2)] = record(t, 0.6 + 0.01 * i, group=f"g{i}")
    for i in (81, 121, 161):
        rs[i] = record(i / 2, 0.5, group="p", cached=4096)
    rs.append(record(99.0, 0.0, status=503))
    path = tmp_path / "records-w-epp.jsonl"
    records.write_jsonl(str(path), RunResult("w", "epp", 3, 8, "tiny", rs, []))
    return path


def test_the_tail_is_told_apart_from_the_rest(tmp_path: Path) -> None:
    rows = tails.load(str(run(tmp_path)))
    assert len(rows) == 201 and rows[0]["workload"] == "w" and rows[0]["seed"] == 3
    a = tails.anatomy(rows, early=15.0, after=30.0)
    assert a["served"] == 200
    assert a["ttft_p50_s"] == pytest.approx(0.1)
    # The p99 of the 200 (interpolated between the 198th and 199th in ascending order) falls
    # between 0.61 and 0.62 s: the two slowest are at or above it, both cold first requests of
    # the run's first seconds.
    assert (a["tail"], a["tail_early"], a["tail_cold_shared"]) == (2, 2, 2)
    assert a["ttft_p99_after_s"] == pytest.approx(0.5)  # the three slow hits, 3 of 140
    assert tails.anatomy(rows, early=1.0, after=30.0)["tail_early"] == 0
    assert math.isnan(tails.anatomy(rows, early=15.0, after=100.0)["ttft_p99_after_s"])  # none after


def test_the_command_prints_a_row_per_file_and_names_a_bad_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = run(tmp_path)
    assert tails.main([str(path), "--early", "5"]) == 0
    out = capsys.readouterr().out
    assert "| w | epp | 3 | 200 | 0.100 |" in out and "before 5 s" in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(SystemExit):
        tails.main([str(bad)])
    assert f"{bad}:2: not an `epp bench --records` line" in capsys.readouterr().err
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"arrival": 1.0, "first_token": "soon"}\n')
    with pytest.raises(ValueError, match=r"odd\.jsonl:1: not an"):
        tails.load(str(odd))
