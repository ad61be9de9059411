"""Fast mode's scrapes: what epp's scraper would read of each simulated pod, tick by tick.

Every `interval_s` (GIE's 50 ms) every pod's `ModelServerMetrics` is refreshed from its engine
(waiting, running, KV usage, block size and count, requests finished, the sums and counts of the
decode-latency histograms), as the scraper would parse vLLM's /metrics; all pods on the same
tick. With `booked_interval_s` (`epp serve --booked-metrics-interval`; 0 turns it off) a pod whose
load at its last refresh was all epp's own bookings, none of it waiting
(`epp.datastore.pacing.booked`), is refreshed on the first tick that long after its last, or on
the first tick half an interval after epp books another request on it, as the scraper paces it.
Every fast run (`epp bench`, `epp bench pd`, scripts/bench_flow_control.py) paces epp's own
policies as `epp serve` does by default (`Policy.paced`; the peers' rules keep their routers' fixed
interval); `--booked-scrape-interval` sets another pace.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from epp.datastore import pacing
from epp.datastore.endpoints import Endpoint, LatencyTotals, ModelServerMetrics
from epp.flags.serve import BOOKED_METRICS_INTERVAL_S
from epp.sim import core


class Scrapes:
    """The pods' metrics as epp reads them, refreshed at each scrape tick (`refresh`)."""

    def __init__(
        self, interval_s: float, booked_interval_s: float, *, paced: bool, now: Callable[[], float]
    ) -> None:
        """`paced`: whether booked load is paced at all (for epp's own policies, and not where
        flow control dispatches on the scrapes); `now`: the run's virtual clock."""
        self.interval_s = interval_s
        self.booked_interval_s = booked_interval_s
        self.paced = paced and booked_interval_s > interval_s
        self._now = now
        self._booked_at: dict[Endpoint, float] = {}  # each pod's last booking

    def hooked(self, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        """`endpoints`, each booking on them noted where booked load is paced."""
        if self.paced:
            for ep in endpoints:
                ep.on_book = self._on_book
        return list(endpoints)

    def _on_book(self, ep: Endpoint) -> None:
        self._booked_at[ep] = self._now()

    def refresh(
        self, now: float, pods: Sequence[Endpoint], engines: Sequence[core.Engine], finished: Sequence[int]
    ) -> tuple[list[int], list[int], list[float]]:
        """Refresh every pod due at `now`; returns the pods' own waiting, running and KV usage
        figures (whatever epp last read), for the run's samples."""
        waiting, running, usage = [], [], []
        paced = self.paced
        half = self.interval_s / 2 - 1e-6
        for ep, engine, done in zip(pods, engines, finished, strict=False):
            waiting.append(engine.num_waiting)
            running.append(engine.num_running)
            usage.append(engine.kv_usage)
            last = ep.metrics
            if (
                paced
                and pacing.booked(ep)
                and now - last.updated_at < self.booked_interval_s - 1e-9
                and not (
                    self._booked_at.get(ep, -1.0) > last.updated_at and now - self._booked_at[ep] >= half
                )
            ):
                continue  # not due, and no booking since the last refresh that ends the pause
            m = ModelServerMetrics(
                waiting=engine.num_waiting,
                running=engine.num_running,
                kv_usage=engine.kv_usage,
                block_size=engine.profile.block_size,
                num_gpu_blocks=engine.profile.num_gpu_blocks,
                updated_at=now,
                requests_total=float(done),
                latency=LatencyTotals(
                    engine.token_seconds_total,
                    float(engine.later_tokens_total),
                    engine.decode_seconds_total,
                    float(engine.requests_finished),
                    engine.ttft_seconds_total,
                    float(engine.first_tokens_total),
                ),
            )
            ep.metrics = m
            if paced and pacing.booked(ep):  # the scraper's grace for its longer interval
                m.grace = self.booked_interval_s - self.interval_s
        return waiting, running, usage


def add_booked_scrape_argument(parser: argparse.ArgumentParser, *, default: float | None) -> None:
    """`--booked-scrape-interval`, as every fast-mode benchmark takes it (`epp bench`, `epp bench
    pd`, scripts/bench_flow_control.py); None: epp serve's."""
    parser.add_argument(
        "--booked-scrape-interval",
        type=float,
        default=default,
        help="fast mode, epp's own policies (the peers' keep their routers' fixed interval): "
        "seconds between scrapes of a pod whose load at its last scrape was all epp's own "
        "bookings, none of it waiting, and half a scrape interval after each booking there (epp "
        f"serve's --booked-metrics-interval; default {BOOKED_METRICS_INTERVAL_S:g}, as epp "
        "serve's; 0: every scrape)",
    )


def booked_interval_problem(value: float | None) -> str | None:
    """Why `--booked-scrape-interval` cannot be `value` (None: not given), or None."""
    if value is not None and not 0 <= value <= 60:
        return f"--booked-scrape-interval must be in [0, 60] s, got {value}"
    return None
