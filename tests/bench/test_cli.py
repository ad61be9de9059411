"""`epp bench` options: listing, errors that name the option and the allowed values, a tiny run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from epp.bench import cli


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
        (["--workload", "unique", "--mode", "slow"], "--mode: unknown mode 'slow'; allowed: fast, live"),
        (["--workload", "unique", "--profile", "h200"], "--profile: unknown profile 'h200'; allowed:"),
        (["--workload", "unique", "--scale", "0"], "--scale must be > 0"),
        (["--workload", "unique", "--pods", "0"], "--pods must be >= 1"),
        (["--workload", "trace:/nonexistent.jsonl"], "--workload: /nonexistent.jsonl: cannot read"),
        (["--workload", "unique", "--slo-tpot", "0"], "--slo-tpot must be a positive number of seconds"),
        (["--workload", "unique", "--slo-ttft", "inf"], "--slo-ttft must be a positive number of seconds"),
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


def test_duration_sets_the_scale() -> None:
    plan = cli._plan(parse("--workload", "unique", "--duration", "30"))
    assert plan[0][1]().duration == pytest.approx(30.0)


def test_slo_flags_set_the_target(tmp_path: Path) -> None:
    argv = ["--workload", "unique", "--policies", "round-robin", "--scale", "0.01", "--no-plots"]
    assert cli.run(parse(*argv, "--out", str(tmp_path), "--slo-ttft", "0.25", "--slo-tpot", "0.5")) == 0
    s = json.loads((tmp_path / "results.json").read_text())["workloads"]["unique"]["policies"]["round-robin"]
    assert (s["slo_ttft_s"], s["slo_tpot_s"]) == (0.25, 0.5)
