"""results.json schema, summaries and tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from epp.bench import fast, records, report
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


def _record(**kw: object) -> records.RequestRecord:
    base: dict[str, object] = dict(
        arrival=0.0, stage=0, group="g", prompt_tokens=1000, shared_tokens=512, max_tokens=10, status=200
    )
    base.update(kw)
    return records.RequestRecord(**base)  # type: ignore[arg-type]


def _summary(rows: list[records.RequestRecord], slo: report.Slo | None = None) -> dict[str, object]:
    result = records.RunResult("w", "p", 1, 2, "tiny-bench", rows, [])
    return report.summarize(result, [], slo)


def test_request_hit_rate_splits_misses_by_what_the_pods_held() -> None:
    common = dict(first_token=1.0, finish=2.0, output_tokens=10, pod=0, prefix_need=512)
    rows = [
        _record(cached_tokens=512, held_best=512, held_chosen=512, **common),  # hit
        _record(cached_tokens=600, held_best=512, held_chosen=512, **common),  # hit
        _record(cached_tokens=0, held_best=0, held_chosen=0, **common),  # cold: nobody held it
        _record(cached_tokens=32, held_best=512, held_chosen=32, **common),  # routed away
        _record(cached_tokens=0, held_best=512, held_chosen=512, **common),  # lost after arrival
        _record(cached_tokens=0, shared_tokens=0, prefix_need=0, first_token=1.0, finish=2.0),  # unshared
    ]
    s = _summary(rows)
    assert s["request_hit_rate"] == 2 / 5
    assert (s["miss_cold"], s["miss_routed_away"], s["miss_lost"]) == (1 / 5, 1 / 5, 1 / 5)


def test_a_prewarm_is_used_by_the_later_requests_of_its_group_that_found_its_copy() -> None:
    common = dict(first_token=3.0, finish=4.0, output_tokens=10)
    rows = [
        _record(arrival=2.0, pod=1, cached_tokens=512, **common),  # found pre-warm 0's copy
        _record(arrival=2.5, pod=1, cached_tokens=768, **common),  # and again
        _record(arrival=0.5, pod=1, cached_tokens=512, **common),  # before it: not its copy
        _record(arrival=2.0, pod=2, cached_tokens=512, **common),  # another pod
        _record(arrival=2.0, pod=1, cached_tokens=256, **common),  # less than was warmed
        _record(arrival=2.0, pod=1, group="h", cached_tokens=512, **common),  # another group
    ]
    result = records.RunResult("w", "p", 1, 4, "tiny-bench", rows, [])
    result.prewarm_log = [records.PrewarmRecord(1.0, 1, 512, "g"), records.PrewarmRecord(1.0, 3, 512, "g")]
    s = report.summarize(result, [])
    assert s["prewarms_used"] == 1 / 2
    assert s["requests_per_prewarm"] == 2 / 2
    assert s["prewarm_token_share"] == 1024 / 6000
    # Live mode knows no pre-warms: nothing to say.
    live = report.summarize(records.RunResult("w", "p", 1, 4, "tiny-bench", rows, []), [])
    assert all(math.isnan(live[k]) for k in ("prewarm_token_share", "prewarms_used", "requests_per_prewarm"))


def test_tpot_queueing_and_slo_share() -> None:
    rows = [
        # TTFT 0.5 s of which 0.3 s its own prefill; 11 tokens over 1 s after the first: 0.1 s each
        _record(first_token=0.5, finish=1.5, output_tokens=11, isolated_prefill_s=0.3),
        # TTFT 2 s, TPOT 0.01 s
        _record(first_token=2.0, finish=2.1, output_tokens=11, isolated_prefill_s=0.5),
        # one token: no TPOT; TTFT 0.2 s
        _record(first_token=0.2, finish=0.2, output_tokens=1, isolated_prefill_s=0.2),
    ]
    s = _summary(rows, report.Slo(ttft_s=1.0, tpot_s=0.05))
    assert math.isclose(s["tpot_p50_s"], 0.055) and math.isclose(s["tpot_p99_s"], 0.0991)  # type: ignore[arg-type]
    assert math.isclose(s["e2e_p99_s"], 1.5 + 0.6 * 0.98)  # type: ignore[arg-type]
    # TTFT - own prefill: 0.2, 1.5 and 0.0 s
    assert math.isclose(s["queueing_p99_s"], 0.2 + 1.3 * 0.98)  # type: ignore[arg-type]
    # Only the one-token request meets both (the first is too slow per token, the second to start).
    assert s["slo_met"] == 1 / 3
    assert (s["slo_ttft_s"], s["slo_tpot_s"]) == (1.0, 0.05)


def test_the_ttft_p99_past_the_start_leaves_the_first_seconds_out() -> None:
    # 100 requests, one a second at 0.1 s; the first five (the cold start) at 2 s.
    rows = [
        _record(arrival=float(t), first_token=t + (2.0 if t < 5 else 0.1), finish=t + 3.0) for t in range(100)
    ]
    s = _summary(rows)
    assert s["ttft_p99_s"] == pytest.approx(2.0)
    assert s["ttft_p99_from_30s_s"] == pytest.approx(0.1)  # the 70 from the 30th second on
    late = _summary([_record(arrival=40.0, first_token=40.5, finish=41.0), *rows[:5]])
    assert late["ttft_p99_from_30s_s"] == pytest.approx(0.5)
    assert math.isnan(_summary(rows[:30])["ttft_p99_from_30s_s"])  # nothing arrived after: unknown


def test_isolated_prefill_is_the_engines_ttft_alone() -> None:
    from epp.sim import core

    profile = helpers.PROFILE.replace(max_num_batched_tokens=256)  # a 1,000-token prompt: 4 chunks
    engine = core.Engine(profile, name="p")
    ids = list(range(1000))

    def ttft(rid: str, prompt: list[int], now: float) -> tuple[float, float]:
        engine.add_request(core.EngineRequest(rid, prompt, 1), now)
        start, first = now, None
        while engine.has_unfinished():
            res = engine.step(now)
            now += res.duration
            if first is None and (res.first_tokens or res.finished):
                first = now
        assert first is not None
        return first - start, now

    cold, now = ttft("cold", ids, 0.0)
    assert math.isclose(profile.isolated_prefill_s(1000, 0), cold, rel_tol=1e-9)
    warm, _ = ttft("warm", [*ids[:640], *range(5000, 5360)], now)
    assert math.isclose(profile.isolated_prefill_s(1000, 640), warm, rel_tol=1e-9)
    assert warm < cold


def test_tables_show_tpot_e2e_queueing_slo_and_misses(entry: dict[str, object]) -> None:
    text = report.table("small", entry)
    for column in (
        "req hit",
        "cold / away",
        "queue p99",
        "TPOT p50",
        "TPOT p99",
        "E2E p50",
        "E2E p99",
        "SLO met",
    ):
        assert column in text
    assert "SLO: TTFT <= 1 s" in text
    for s in entry["policies"].values():  # type: ignore[attr-defined]
        assert 0 <= s["request_hit_rate"] <= 1 and s["tpot_p50_s"] > 0 and s["queueing_p99_s"] >= 0


def test_seeds_median_and_worst(tmp_path: Path, entry: dict[str, object]) -> None:
    from epp.bench import seeds

    paths = []
    for seed, scale in ((1, 1.0), (2, 2.0), (3, 4.0)):
        doc = json.loads(json.dumps(entry))
        for s in doc["policies"].values():
            s["e2e_p99_s"] *= scale
            s["output_tok_per_s"] /= scale
        path = tmp_path / f"{seed}.json"
        report.write_results(str(path), seed=seed, mode="fast", workloads={"small": doc})
        paths.append(str(path))
    docs = seeds.load(paths)
    e2e = seeds.values(docs, "small", "epp", "e2e_p99_s")
    assert seeds.median_worst(e2e, False) == (e2e[1], e2e[2])
    out = seeds.values(docs, "small", "epp", "output_tok_per_s")
    assert seeds.median_worst(out, True) == (out[1], out[2])
    assert "seeds 1, 2, 3" in seeds.table(docs, "small")
    assert len(seeds.targets(docs, "small")) == 3
    # epp against the best peer, per target: median (worst) ratio and on how many seeds it holds.
    got = seeds.ratios(docs[0], "small")
    assert got["e2e_p99_s"][1] == "random"
    text = seeds.target_table(docs, ["small"])
    assert text.count("/3") == len(seeds.TARGETS)


def test_seeds_against_gives_the_ratio_its_interval_and_the_seeds_worse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from epp.bench import seeds

    def doc(seed: int, mine: float, theirs: float | None) -> dict[str, object]:
        policies = {"epp": {"e2e_p99_s": mine, "slo_met": 0.99}}
        if theirs is not None:
            policies["peer"] = {"e2e_p99_s": theirs, "slo_met": 0.98}
        return {"seed": seed, "workloads": {"w": {"policies": policies}}}

    # epp 5% slower on four seeds, 10% faster on one; seed 6 did not run the peer.
    theirs = [10.0, 11.0, 12.0, 13.0, 14.0]
    mine = [1.05 * t for t in theirs[:4]] + [0.9 * theirs[4]]
    docs = [doc(i + 1, m, t) for i, (m, t) in enumerate(zip(mine, theirs, strict=True))] + [
        doc(6, 99.0, None)
    ]
    text = seeds.against_table(docs, "w", "peer")
    assert text.startswith("w: epp / peer, 5 seeds:")
    row = next(line for line in text.splitlines() if line.startswith("| E2E p99 |"))
    ratio = sum(mine) / sum(theirs)
    lo, hi = seeds.seed_interval([{"k": m} for m in mine], [{"k": t} for t in theirs], "k")
    assert row == f"| E2E p99 | {ratio:.3f}x | {lo:.3f}-{hi:.3f} | 4 of 5 |"
    assert lo < 1.0 < hi  # one seed the other way: the draw of seeds reaches both sides
    # Higher is better for the SLO share: epp's 0.99 over 0.98 is never the worse.
    assert "| SLO met | 1.010x | 1.010-1.010 | 0 of 5 |" in text
    assert "TTFT p99" not in text  # a figure no run has is left out
    assert seeds.against_table(docs, "w", "nobody") == "w: no seed ran both epp and nobody"
    # The command line: one results.json per seed.
    paths = []
    for d in docs:
        path = tmp_path / f"{d['seed']}.json"
        path.write_text(json.dumps(d))
        paths.append(str(path))
    seeds.main([*paths, "--against", "peer"])
    assert row in capsys.readouterr().out


def test_peer_table_sets_epp_against_the_best_real_router_of_each_seed() -> None:
    from epp.bench import seeds

    def run(
        ttft: float,
        goodput: float,
        hit: float,
        requests_hit: float | None = None,
        steady: float | None = None,
    ) -> dict[str, float | None]:
        return {
            "ttft_p99_s": ttft,
            "ttft_p99_from_30s_s": steady,  # null in results.json from before it was recorded
            "e2e_p99_s": 10.0,
            "goodput": goodput,
            "fleet_hit_rate": hit,
            "hit_rate": hit if requests_hit is None else requests_hit,
            "hit_rate_ceiling": 0.83,
            "router_cpu_ms_per_request": 4.0,
        }

    docs = [
        {"seed": 1, "workloads": {"w": {"policies": {
            "epp": run(0.8, 0.99, 0.80, 0.83, steady=0.3),
            "smg": run(1.0, 0.90, 0.82, steady=0.4), "vllm-router": run(2.0, 0.95, 0.81, steady=0.5),
            "random": run(0.1, 1.0, 0.99),  # not a real router: never the best
        }}}},
        {"seed": 2, "workloads": {"w": {"policies": {
            "epp": run(1.2, 0.99, 0.80), "smg": run(1.5, 0.90, 0.80), "vllm-router": run(1.0, 0.95, 0.79),
        }}}},
    ]  # fmt: skip
    row = seeds.peer_table(docs, ["w"], ["smg", "vllm-router"]).splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:2] == ["w", "2"]
    # TTFT p99: 0.8 / 1.0 (smg) and 1.2 / 1.0 (vllm-router), median 1.0.
    assert cells[2] == "1.00x (0.80-1.20) smg, vllm-router"
    assert cells[3] == "0.75x (0.75-0.75) smg"  # past the start: only the seed that recorded it
    assert cells[5] == "1.04x (1.04-1.04) vllm-router"  # goodput: the highest is the best
    assert cells[6] == "-1.0 (-2.0 to +0.0) smg"  # hit rate in points: -2 against 82%, 0 against 80%
    # The requests' own hit rate (the answers' cached tokens): epp's pre-warms are misses in its
    # pods' counters on seed 1, not in its requests' (+1 against 82%), 0 on seed 2.
    assert cells[7] == "+0.5 (+0.0 to +1.0) smg"
    # The best router's pods' counters below the ceiling (83%): 1 point on seed 1, 3 on seed 2.
    assert cells[8] == "2.0 (1.0-3.0) smg"
    assert cells[9] == "1.00x (1.00-1.00) smg"  # CPU: a tie goes to the first by name


def test_seeds_cli_answers_help_and_bad_files_with_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from epp.bench import seeds

    with pytest.raises(SystemExit) as done:
        seeds.main(["--help"])
    assert done.value.code == 0 and "RESULTS.json" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        seeds.main([str(tmp_path / "missing.json")])
    assert done.value.code == 2 and "cannot read the results" in capsys.readouterr().err
