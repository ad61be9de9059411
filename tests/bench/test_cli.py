"""`epp bench` options: listing, errors that name the option and the allowed values, a tiny run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from epp.bench import cli
from epp.bench.workload import ClosedLoop


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_list_names_workloads_and_policies(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(parse("--list")) == 0
    out = capsys.readouterr().out
    for name in (
        "seed-stress",
        "llm-d",
        "hotspot",
        "unique",
        "chat",
        "trace:<path.jsonl>",
        "dynamo-cost",
        "epp",
    ):
        assert name in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "nope"], "--workload: unknown workload 'nope'; allowed: seed-stress, llm-d"),
        ([], "--workload is required; allowed:"),
        (
            ["--workload", "unique", "--policies", "random,best"],
            "--policies: unknown policy 'best'; allowed:",
        ),
        (["--workload", "unique", "--mode", "live", "--time-scale", "0"], "--time-scale must be > 0"),
        (["--workload", "unique", "--mode", "live", "--kv-delay", "0.1"], "--kv-delay is for --mode fast"),
        (
            ["--workload", "unique", "--gateway-config", "override", "--epp-arg=--workers=2"],
            "--epp-arg=--workers=2: fast mode runs no epp process; it takes only "
            "--response-sample-ratio=VALUE",
        ),
        (
            ["--workload", "unique", "--epp-arg=--response-sample-min-interval=0"],
            "fast mode needs --gateway-config override",
        ),
        (
            ["--workload", "unique", "--gateway-config", "override", "--epp-arg=--response-sample-ratio=2"],
            "--epp-arg: argument --response-sample-ratio:",
        ),
        (
            ["--workload", "unique", "--peer-arg=--cb-timeout-duration-secs=10"],
            "--peer-arg: the real peer routers run in --mode live only",
        ),
        (["--workload", "unique", "--mode", "slow"], "--mode: unknown mode 'slow'; allowed: fast, live"),
        (["--workload", "unique", "--profile", "h200"], "--profile: unknown profile 'h200'; allowed:"),
        (["--workload", "unique", "--scale", "0"], "--scale must be > 0"),
        (["--workload", "unique", "--pods", "0"], "--pods must be >= 1"),
        (["--workload", "trace:/nonexistent.jsonl"], "--workload: /nonexistent.jsonl: cannot read"),
        (["--workload", "unique", "--slo-tpot", "0"], "--slo-tpot must be a positive number of seconds"),
        (["--workload", "unique", "--slo-ttft", "inf"], "--slo-ttft must be a positive number of seconds"),
        (["--workload", "unique", "--load", "0"], "--load must be a finite number > 0"),
        (["--workload", "unique", "--load", "nan"], "--load must be a finite number > 0"),
    ],
)
def test_config_errors_name_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.run(parse(*argv)) == 2
    assert message in capsys.readouterr().err


def test_a_trace_through_two_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    system = list(range(1, 257))
    lines = [
        json.dumps({"t": i * 0.05, "prompt_token_ids": [*system, 1000 + i, 2000 + i], "max_tokens": 8})
        for i in range(60)
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines))
    out = tmp_path / "out"
    argv = ["--workload", f"trace:{path}", "--policies", "random,epp", "--profile", "tiny", "--pods", "2"]
    assert cli.run(parse(*argv, "--out", str(out), "--no-plots")) == 0
    doc = json.loads((out / "results.json").read_text())
    entry = doc["workloads"][f"trace:{path}"]
    assert entry["pods"] == 2 and entry["profile"] == "tiny"
    assert set(entry["policies"]) == {"random", "epp"}
    assert entry["policies"]["epp"]["served"] == 60
    # Every prompt shares the 256-token system prompt: epp keeps it on one pod.
    assert entry["policies"]["epp"]["prefix_hit_rate"] > 0.9
    assert entry["policies"]["epp"]["slo_ttft_s"] == 1.0  # the generic target (tiny has none)
    text = capsys.readouterr().out
    assert "| epp |" in text and "results:" in text


def test_records_lists_every_request_of_every_policy(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    lines = [
        json.dumps({"t": i * 0.1, "prompt_token_ids": [1, 2, 3, 100 + i], "max_tokens": 4}) for i in range(20)
    ]
    path.write_text("\n".join(lines))
    out = tmp_path / "out"
    argv = ["--workload", f"trace:{path}", "--policies", "random,epp", "--profile", "tiny", "--pods", "2"]
    assert cli.run(parse(*argv, "--out", str(out), "--no-plots", "--records")) == 0
    for policy in ("random", "epp"):
        rows = [
            json.loads(line)
            for line in (out / f"records-trace-trace-{policy}.jsonl").read_text().splitlines()
        ]
        assert len(rows) == 20
        assert {r["policy"] for r in rows} == {policy} and {r["workload"] for r in rows} == {f"trace:{path}"}
        assert [r["arrival"] for r in rows] == sorted(r["arrival"] for r in rows)
        assert all(
            r["status"] == 200 and r["first_token"] >= r["arrival"] and 0 <= r["pod"] < 2 for r in rows
        )


def test_duration_sets_the_scale() -> None:
    plan = cli._plan(parse("--workload", "unique", "--duration", "30"))
    assert plan[0][1]().duration == pytest.approx(30.0)


def test_load_compresses_time_with_the_same_requests() -> None:
    [(_, build1, *_)] = cli._plan(parse("--workload", "bursty", "--scale", "0.2"))
    [(_, build2, *_)] = cli._plan(parse("--workload", "bursty", "--scale", "0.2", "--load", "2.5"))
    base, loaded = build1(), build2()
    a, b = list(base.arrivals()), list(loaded.arrivals())
    assert len(a) == len(b) > 50
    for (t1, p1), (t2, p2) in zip(a, b, strict=True):
        assert t2 == pytest.approx(t1 / 2.5)
        assert list(p1.token_ids) == list(p2.token_ids) and p1.max_tokens == p2.max_tokens
    assert loaded.duration == pytest.approx(base.duration / 2.5)
    assert loaded.load == 2.5 and base.load == 1.0
    assert [s.label for s in loaded.stages] == [s.label for s in base.stages]


def test_load_with_duration_gives_that_many_seconds_at_the_higher_rate() -> None:
    [(_, build1, *_)] = cli._plan(parse("--workload", "mixed-fleet", "--duration", "30"))
    [(_, build2, *_)] = cli._plan(parse("--workload", "mixed-fleet", "--duration", "30", "--load", "1.5"))
    base, loaded = build1(), build2()
    assert loaded.duration == pytest.approx(30.0) == base.duration
    assert loaded.stages[0].qps == pytest.approx(1.5 * (base.stages[0].qps or 0))
    n1, n2 = sum(1 for _ in base.arrivals()), sum(1 for _ in loaded.arrivals())
    assert n2 == pytest.approx(1.5 * n1, rel=0.2)


def test_load_is_recorded_and_raises_the_offered_rate(tmp_path: Path) -> None:
    argv = ["--workload", "unique", "--policies", "round-robin", "--scale", "0.01", "--no-plots"]
    for load in ("1", "3"):
        assert cli.run(parse(*argv, "--out", str(tmp_path / load), "--load", load)) == 0
    docs = [json.loads((tmp_path / n / "results.json").read_text()) for n in "13"]
    one, three = (doc["workloads"]["unique"] for doc in docs)
    assert (one["load"], three["load"]) == (1.0, 3.0)
    assert three["duration_s"] == pytest.approx(one["duration_s"] / 3)
    assert three["stages"][0]["qps"] == pytest.approx(3 * one["stages"][0]["qps"])
    assert three["policies"]["round-robin"]["served"] == one["policies"]["round-robin"]["served"]


def test_load_on_a_closed_loop_runs_that_many_times_the_users(tmp_path: Path) -> None:
    """A closed loop's rate follows the fleet: --load scales its users. The first 32 agents are the
    same users as at load 1 (their own seeded streams), and the run records the load."""
    [(_, build1, *_)] = cli._plan(parse("--workload", "agentic", "--duration", "30"))
    [(_, build2, *_)] = cli._plan(parse("--workload", "agentic", "--duration", "30", "--load", "1.5"))
    base, loaded = build1(), build2()
    assert isinstance(base, ClosedLoop) and isinstance(loaded, ClosedLoop)
    assert (base.users, loaded.users) == (32, 48) and (base.load, loaded.load) == (1.0, 1.5)
    assert loaded.name == base.name == "agentic" and "48 users (1.5x)" in loaded.description
    assert loaded.duration == pytest.approx(base.duration)
    for user in range(base.users):
        t1, p1 = base.next_request(user, 0.0) or (None, None)
        t2, p2 = loaded.next_request(user, 0.0) or (None, None)
        assert t1 == t2 and p1 is not None and p2 is not None and list(p1.token_ids) == list(p2.token_ids)
    assert cli._plan(parse("--workload", "chat", "--load", "0.01"))[0][1]().users == 1
    argv = ["--workload", "chat", "--policies", "round-robin", "--scale", "0.02", "--no-plots"]
    for load in ("1", "2"):
        assert cli.run(parse(*argv, "--out", str(tmp_path / load), "--load", load)) == 0
    one, two = (json.loads((tmp_path / n / "results.json").read_text())["workloads"]["chat"] for n in "12")
    assert (one["load"], two["load"]) == (1.0, 2.0)
    assert two["policies"]["round-robin"]["served"] > 1.5 * one["policies"]["round-robin"]["served"]


def test_slo_flags_set_the_target(tmp_path: Path) -> None:
    argv = ["--workload", "unique", "--policies", "round-robin", "--scale", "0.01", "--no-plots"]
    assert cli.run(parse(*argv, "--out", str(tmp_path), "--slo-ttft", "0.25", "--slo-tpot", "0.5")) == 0
    s = json.loads((tmp_path / "results.json").read_text())["workloads"]["unique"]["policies"]["round-robin"]
    assert (s["slo_ttft_s"], s["slo_tpot_s"]) == (0.25, 0.5)


def test_load_raises_inference_perfs_rate_too() -> None:
    [(_, build1, *_)] = cli._plan(parse("--workload", "shared-prefix", "--duration", "60"))
    [(_, build2, *_)] = cli._plan(parse("--workload", "shared-prefix", "--duration", "60", "--load", "2"))
    [(rate1, seconds1)] = build1().inference_perf_form().stages
    [(rate2, seconds2)] = build2().inference_perf_form().stages
    assert (rate2, seconds2) == pytest.approx((2 * rate1, seconds1))
