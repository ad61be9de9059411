"""`scripts/bench_flow_control.py` in fast mode: its runs pace booked load as `epp serve` does
unless `--booked-scrape-interval` says otherwise (docs/bench/flow-control.md#flow-control)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from epp.bench import fast
from epp.flags.serve import BOOKED_METRICS_INTERVAL_S

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_flow_control.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_flow_control_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("flag", "pace"), [([], BOOKED_METRICS_INTERVAL_S), (["--booked-scrape-interval", "0"], 0.0)]
)
def test_the_runs_pace_booked_load_as_epp_serve_or_as_the_flag_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flag: list[str], pace: float
) -> None:
    paces: list[float] = []
    init = fast.FastRun.__init__

    def spy(self: fast.FastRun, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        paces.append(self.scrapes.booked_interval_s)

    monkeypatch.setattr(fast.FastRun, "__init__", spy)
    argv = ["--seeds", "1", "--scale", "0.02", "--policies", "flow-control", "--out", str(tmp_path), *flag]
    assert _script().main(argv) == 0
    assert paces and set(paces) == {pace}
    assert json.loads((tmp_path / "flow-control.json").read_text())["booked_scrape_interval_s"] == pace


def test_the_flag_is_for_fast_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        _script().main(["--mode", "live", "--booked-scrape-interval", "0"])
    assert done.value.code == 2
    assert "--booked-scrape-interval is for fast mode" in capsys.readouterr().err
