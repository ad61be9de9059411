"""Parse time of a realistic vLLM /metrics page: epp's promtext vs prometheus_client's parser.

Run: .venv/bin/python tests/datastore/bench_promtext.py
Not a test (timings are machine-dependent); the numbers back the design note in
epp/datastore/promtext.py.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `epp`

from prometheus_client.parser import text_string_to_metric_families

from epp.datastore import promtext
from tests.datastore.vllm_sample import vllm_metrics_page


def bench(fn: Callable[[], object], runs: int) -> tuple[float, float, float]:
    """Median, average and p99 in microseconds, after a warm-up, with the GC collected beforehand."""
    for _ in range(min(runs, 20)):
        fn()
    gc.collect()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return (
        statistics.median(times) * 1e6,
        statistics.fmean(times) * 1e6,
        times[int(len(times) * 0.99) - 1] * 1e6,
    )


def main() -> None:
    for engines in (1, 2):
        page = vllm_metrics_page(engines=engines)
        text = page.decode()
        fast = bench(lambda: promtext.parse(page), 2000)  # noqa: B023
        slow = bench(lambda: list(text_string_to_metric_families(text)), 100)  # noqa: B023
        lines = page.count(b"\n")
        print(
            f"page {len(page) / 1024:.1f} KiB, {lines} lines, engines={engines}:\n"
            f"  epp promtext.parse(bytes)                          median {fast[0]:8.1f} us"
            f"  avg {fast[1]:8.1f} us  p99 {fast[2]:8.1f} us\n"
            f"  prometheus_client text_string_to_metric_families  median {slow[0]:8.1f} us"
            f"  avg {slow[1]:8.1f} us  p99 {slow[2]:8.1f} us\n"
            f"  ratio of medians {slow[0] / fast[0]:.0f}x"
        )


if __name__ == "__main__":
    main()
