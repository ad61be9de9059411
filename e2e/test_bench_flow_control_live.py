"""`scripts/bench_flow_control.py --mode live`, as docs/bench/flow-control.md#flow-control-live
gives it: the overload workloads through a real Envoy and `epp serve` over simulated pods, at a
small scale (a few seconds each). It checks that the command runs and its figures are whole, not
what they are (real time at this scale is noise): every arm served requests and wrote its table
and its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_flow_control.py"


def test_live_flow_control_bench_runs(e2e_prerequisites: None, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [sys.executable, str(SCRIPT), "--mode", "live", "--seeds", "1", "--scale", "0.03"]
    argv += ["--policies", "gie-approx,flow-control", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((out / "flow-control.json").read_text())
    for policy in ("gie-approx", "flow-control"):
        entry = data["figures"][policy]["seeds"]["1"]
        assert entry["priority"]["critical"]["served"] > 0, (policy, entry["priority"])
        assert entry["priority"]["critical_shed"] == 0, (policy, entry["priority"])
    assert "| flow-control |" in (out / "flow-control.md").read_text()
