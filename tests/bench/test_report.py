"""results.json schema, summaries and tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from epp.bench import fast, report
from epp.bench.policies import POLICIES

from . import helpers

REQUIRED = ("hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "req_per_s", "output_tok_per_s")


@pytest.fixture(scope="module")
def entry() -> dict[str, object]:
    wl = helpers.small()
    runs = {}
    for name in ("random", "epp"):
        r = fast.FastRun(
            helpers.small(), POLICIES[name], profile=helpers.PROFILE, pods=helpers.PODS, seed=7
        ).run()
        runs[name] = report.summarize(r, wl.stages)
    return report.workload_entry(wl, helpers.PROFILE.name, helpers.PODS, runs)


def test_results_json_schema(tmp_path: Path, entry: dict[str, object]) -> None:
    path = tmp_path / "results.json"
    report.write_results(str(path), seed=7, mode="fast", workloads={"small": entry})
    doc = json.loads(path.read_text())
    assert doc["schema"] == report.SCHEMA and doc["mode"] == "fast" and doc["seed"] == 7
    w = doc["workloads"]["small"]
    assert w["pods"] == 4 and w["profile"] == "tiny-bench" and len(w["stages"]) == 3
    for policy in ("random", "epp"):
        s = w["policies"][policy]
        for key in REQUIRED:
            assert isinstance(s[key], float) and s[key] >= 0, key
        assert 0 <= s["hit_rate"] <= 1 and 0 <= s["prefix_hit_rate"] <= 1
        assert s["ttft_p50_s"] <= s["ttft_p90_s"] <= s["ttft_p99_s"]
        assert len(s["points"]) == 3
        for point in s["points"]:
            assert {"stage", "sharing", "hit_rate", "ttft_p90_s", "output_tok_per_s", "req_per_s"} <= set(
                point
            )
        assert sum(s["requests_per_pod"]) == s["served"]


def test_nothing_measured_is_null_not_nan(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    report.write_results(
        str(path), seed=1, mode="fast", workloads={"w": {"x": math.nan, "y": [math.nan, 1.0]}}
    )
    assert json.loads(path.read_text())["workloads"]["w"] == {"x": None, "y": [None, 1.0]}


def test_percentile_interpolates() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert report.percentile(values, 50) == 2.5
    assert report.percentile(values, 0) == 1.0 and report.percentile(values, 100) == 4.0
    assert math.isnan(report.percentile([], 90))


def test_table_has_a_row_per_policy_and_a_stage_breakdown(entry: dict[str, object]) -> None:
    text = report.table("small", entry)
    assert "| random |" in text and "| epp |" in text
    assert "| share=0.9 |" in text


def test_plots_are_written(tmp_path: Path, entry: dict[str, object]) -> None:
    pytest.importorskip("matplotlib")
    ttfts = {"random": [0.1, 0.2, 0.5], "epp": [0.05, 0.1]}
    written = report.plot(str(tmp_path), "small", entry, ttfts)
    assert [Path(p).name for p in written] == ["small-ttft-cdf.png", "small-sweep.png"]
    assert all(Path(p).stat().st_size > 1000 for p in written)
