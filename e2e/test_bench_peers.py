"""`epp bench --mode live` with the real peer routers as arms, on the same simulated fleet.

Needs the peers' venvs that `bash scripts/peers-env` builds (.venv-peers, or $EPP_PEERS_DIR).
Without them the test is skipped with that instruction, except under CI (CI=true), where
scripts/test builds them first and missing ones are an error, never a silent skip.

A small trace (4 tenants, each a 1,024-token prompt prefix, 40 requests over 4 s, 4 output tokens)
on 2 pods, through smg and vllm-router's kv_aware (the two peers with different inputs: request
text, and the fleet's KV events) beside epp. Each arm must serve every request, report its
router's CPU, and take its hit rate from the pods' own counters.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from epp import cli
from epp.bench import inference_perf
from epp.bench.peers import PEERS, peers_dir

pytestmark = pytest.mark.e2e


def _trace(path: Path) -> None:
    rng = random.Random(11)
    prefixes = [[rng.randrange(32_000) for _ in range(1024)] for _ in range(4)]
    with path.open("w") as f:
        for i in range(40):
            g = rng.randrange(4)
            ids = prefixes[g] + [rng.randrange(32_000) for _ in range(32)]
            line = {"t": round(i * 0.1, 3), "prompt_token_ids": ids, "max_tokens": 4, "group": f"t{g}"}
            f.write(json.dumps(line) + "\n")


def test_live_bench_runs_real_peer_routers(
    e2e_prerequisites: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = peers_dir()
    arms = ["smg", "vllm-router-kv"]
    missing = [a for a in arms if not PEERS[a].installed(where)]
    if missing:
        message = f"no peer venvs for {', '.join(missing)} at {where}: run `bash scripts/peers-env` first"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    trace = tmp_path / "trace.jsonl"
    _trace(trace)
    out = tmp_path / "out"
    status = cli.main([
        "bench", "--mode", "live", "--workload", f"trace:{trace}", "--policies", ",".join(["epp", *arms]),
        "--pods", "2", "--profile", "codellama-13b-a100", "--out", str(out), "--no-plots",
        # A flag each peer knows (a peer refusing one fails to start): its breaker's timeout.
        "--peer-arg=--cb-timeout-duration-secs=10",
    ])  # fmt: skip
    printed = capsys.readouterr()
    assert status == 0, printed.err[-3000:]
    (entry,) = json.loads((out / "results.json").read_text())["workloads"].values()
    runs = entry["policies"]
    assert set(runs) == {"epp", *arms}
    assert [runs[a]["peer_args"] for a in arms] == [["--cb-timeout-duration-secs=10"]] * 2
    assert "peer_args" not in runs["epp"]
    for name, run in runs.items():
        assert run["requests"] == 40 and run["failed"] == 0 and run["unfinished"] == 0, (name, run)
        assert sum(run["requests_per_pod"]) == 40, (name, run)
        # Every tenant's prefix is computed at least once: at most 36 of 40 requests hit.
        assert 0 < run["fleet_hit_rate"] < 0.95, (name, run)
        assert run["router_cpu_ms_per_request"] > 0, (name, run)
    assert (out / "logs" / "trace-smg.log").exists() or any((out / "logs").glob("*smg*.log"))


def test_inference_perf_sends_the_load(
    e2e_prerequisites: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kubernetes-sigs' inference-perf as the client: its own shared-prefix prompts through epp and
    smg, its per-request report as the records."""
    where = peers_dir()
    if not (PEERS["smg"].installed(where) and inference_perf.installed(where)):
        message = f"no smg or inference-perf venv at {where}: run `bash scripts/peers-env` first"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    out = tmp_path / "out"
    status = cli.main([
        "bench", "--mode", "live", "--workload", "shared-prefix", "--client", "inference-perf",
        "--policies", "epp,smg", "--pods", "2", "--duration", "2", "--out", str(out), "--no-plots",
    ])  # fmt: skip
    printed = capsys.readouterr()
    assert status == 0, printed.err[-3000:]
    (entry,) = json.loads((out / "results.json").read_text())["workloads"].values()
    for name, run in entry["policies"].items():
        # ~20 req/s for 2 s, Poisson: over 20 requests, every one answered.
        assert run["requests"] > 20 and run["served"] == run["requests"], (name, run)
        assert 0 < run["ttft_p50_s"] <= run["ttft_p99_s"], (name, run)
        # The pods' prefix-cache counters were read: some system prompts were reused.
        assert run["fleet_hit_rate"] > 0, (name, run)
    # epp sends a tenant back to the pod holding its system prompt: most prompt tokens hit (smg
    # spread them here, ~0.2, which is its routing, not this test's subject).
    assert entry["policies"]["epp"]["fleet_hit_rate"] > 0.3, entry["policies"]["epp"]
