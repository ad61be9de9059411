"""epp reads real vLLM 0.32's metrics through prometheus_client's `name[]` filter.

vLLM answers `/metrics` from prometheus-fastapi-instrumentator (the whole registry, any query) and
`/metrics/` from prometheus_client's own app, which keeps only the series asked for. The scraper
asks the second for what `promtext` reads (epp/datastore/scraper.py): these tests hold that the
filtered page parses to what the whole one does, that it is far smaller, and that epp's scraper
took it and never fell back to the whole page.
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from e2e.vllm.stack import VllmStack
from epp.datastore import promtext
from epp.datastore.engines import VLLM
from epp.datastore.scraper import filtered_path

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def get(url: str) -> tuple[bytes, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.status == 200
        return bytes(resp.read()), time.perf_counter() - started


def test_the_filtered_page_holds_everything_epp_reads(stack: VllmStack) -> None:
    pod = stack.pods[0]
    path = filtered_path("/metrics", VLLM)
    assert path is not None
    ignored, _ = get(pod.url + "/metrics?" + path.split("?", 1)[1])
    filtered, _ = get(pod.url + path)
    assert len(ignored) > 10 * len(filtered), (len(ignored), len(filtered))  # /metrics ignores name[]
    samples = {line.split(b"{")[0].split(b" ")[0] for line in filtered.splitlines() if line[:1] != b"#"}
    assert samples <= {n.encode() for n in promtext.series_read()}, samples
    # The same figures, read between two reads of the whole page that agree (an earlier test's
    # last request may still be reaching the counters).
    deadline = time.monotonic() + 30
    while True:
        before = promtext.parse(get(pod.url + "/metrics")[0])
        got = promtext.parse(get(pod.url + path)[0])
        after = promtext.parse(get(pod.url + "/metrics")[0])
        if before == after or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert before == after, "the pod's figures kept moving"
    assert got == before and got.latency is not None and got.block_size == 32, got


def test_epp_scrapes_the_filtered_page(stack: VllmStack) -> None:
    rows = stack.endpoints()
    for pod in stack.pods:
        row = rows[pod.address]
        assert row["routable"] and 0 <= row["metrics_age_seconds"] < 2, row
    log = stack.epp.process.log_path.read_text(errors="replace")
    assert "scraping /metrics of" in log  # INFO lines are logged: the next line's absence says something
    assert "filtered metrics path" not in log
