"""epp.garbage: a serving process freezes its start-up objects, collects its young generation
less often, and times every collection (`epp_gc_pause_seconds`)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from epp.gateway.processes import EppServer

_SETTLE = """
import gc
from epp import garbage
from epp.observability import metrics
kept = [[i] for i in range(50_000)]  # start-up objects that live as long as the process
before = gc.get_freeze_count()
frozen = garbage.settle()
assert frozen == gc.get_freeze_count() >= before + 50_000, (before, frozen)
assert gc.get_threshold()[0] == garbage.YOUNG_THRESHOLD
assert all(gc.is_tracked(k) for k in kept[:10])
# A full collection walks none of the frozen objects any more.
assert not any(o is kept for o in gc.get_objects(2))
young = metrics.REGISTRY.get_sample_value("epp_gc_pause_seconds_count", {"generation": "0"})
gc.collect(0)
gc.collect(2)
got = metrics.REGISTRY.get_sample_value
assert got("epp_gc_pause_seconds_count", {"generation": "0"}) == (young or 0) + 1
assert got("epp_gc_pause_seconds_count", {"generation": "2"}) == 1
assert 0 < got("epp_gc_pause_seconds_sum", {"generation": "2"}) < 1
garbage.settle()  # twice: one callback still
gc.collect(1)
assert got("epp_gc_pause_seconds_count", {"generation": "1"}) == 1
print("ok")
"""


def test_settle_freezes_start_up_objects_and_times_each_collection() -> None:
    out = subprocess.run([sys.executable, "-c", _SETTLE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_serving_epp_has_settled(tmp_path: Path) -> None:
    epp = EppServer(tmp_path / "epp.log", endpoints=["127.0.0.1:1"])
    try:
        epp.start(wait="listening")
        deadline = time.monotonic() + 20
        while "start-up objects frozen" not in epp.process.log_text():
            assert time.monotonic() < deadline, epp.process.log_text()[-3000:]
            time.sleep(0.1)
    finally:
        epp.stop()
