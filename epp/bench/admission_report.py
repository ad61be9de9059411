"""What the overload workloads measure, per priority class and per tenant (`epp.bench.overload`).

Over every request a stage's arrivals sent, served or not:

- `served`, `shed_429`, `shed_503`: how each ended (shed: answered 429/503 by epp);
- `ttft_p50_s`, `ttft_p99_s`: over the served ones, from arrival (time held in epp included);
- `shed_wait_max_s`: the longest a shed request waited for its answer (a queue-wait budget of
  60 s must show as <= 60 s: a clear answer, not a client timeout);
- `goodput`: the share of the stage's requests served within both latency targets (`Slo`);
  a shed request counts as missed.

Tenants: a tenant's TTFT p99 per stage, and Jain's fairness index over the tenants' served
requests in a window: (sum x)^2 / (n * sum x^2), 1.0 when every tenant was served alike.

`queue_plot` draws the requests flow control held per band over time, from the scrape ticks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from epp.bench.records import RequestRecord, RunResult
from epp.bench.report import Slo, percentile, tpot
from epp.bench.workload import Stage


def met(r: RequestRecord, slo: Slo) -> bool:
    if r.status != 200 or r.first_token is None:
        return False
    t = tpot(r)
    return r.first_token - r.arrival <= slo.ttft_s and (t is None or t <= slo.tpot_s)


def group_stats(records: Sequence[RequestRecord], slo: Slo) -> dict[str, Any]:
    served = [r for r in records if r.status == 200]
    ttft = sorted(r.first_token - r.arrival for r in served if r.first_token is not None)
    shed = [r for r in records if r.status in (429, 503)]
    return {
        "requests": len(records),
        "served": len(served),
        "shed_429": sum(1 for r in shed if r.status == 429),
        "shed_503": sum(1 for r in shed if r.status == 503),
        "dropped_reasons": sorted({r.dropped for r in shed if r.dropped}),
        "unfinished": sum(1 for r in records if r.status == 0),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "shed_wait_max_s": max((r.finish - r.arrival for r in shed if r.finish is not None), default=0.0),
        "goodput": sum(1 for r in records if met(r, slo)) / len(records) if records else math.nan,
    }


def in_stage(records: Iterable[RequestRecord], stage: int) -> list[RequestRecord]:
    return [r for r in records if r.stage == stage]


def by_priority(result: RunResult, stages: Sequence[Stage], slo: Slo) -> dict[str, Any]:
    """{stage label: {"all": stats, priority: stats}}."""
    out: dict[str, Any] = {}
    for i, stage in enumerate(stages):
        records = in_stage(result.records, i)
        entry = {"all": group_stats(records, slo)}
        for priority in sorted({r.priority for r in records}, reverse=True):
            entry[str(priority)] = group_stats([r for r in records if r.priority == priority], slo)
        out[stage.label] = entry
    return out


def jains_index(values: Sequence[float]) -> float:
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else math.nan


def by_tenant(
    result: RunResult, stages: Sequence[Stage], slo: Slo, *, settle_s: float = 5.0
) -> dict[str, Any]:
    """{stage label: {"tenants": {tenant: stats}, "jains_served": index}}: Jain's index over the
    requests each tenant had routed in the stage, from `settle_s` into it (queues formed)."""
    out: dict[str, Any] = {}
    tenants = sorted({r.fairness_id for r in result.records if r.fairness_id})
    for i, stage in enumerate(stages):
        records = in_stage(result.records, i)
        start = stage.start + min(settle_s, stage.duration / 2)
        routed = {t: 0 for t in tenants}
        for r in result.records:
            if r.fairness_id and r.routed is not None and start <= r.routed < stage.end:
                routed[r.fairness_id] += 1
        out[stage.label] = {
            "tenants": {t: group_stats([r for r in records if r.fairness_id == t], slo) for t in tenants},
            "routed": routed,
            "jains_served": jains_index(list(routed.values())) if routed else math.nan,
        }
    return out


def queue_plot(path: str, title: str, runs: dict[str, RunResult], stages: Sequence[Stage]) -> bool:
    """One panel per run: requests held per priority band over time. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs)), sharex=True, squeeze=False)
    for ax, (name, result) in zip(axes[:, 0], runs.items(), strict=True):
        bands = sorted({p for s in result.samples for p in s.queued}, reverse=True)
        t = [s.t for s in result.samples]
        for band in bands:
            ax.plot(t, [s.queued.get(band, 0) for s in result.samples], label=f"priority {band}")
        waiting = [sum(s.waiting) for s in result.samples]
        ax.plot(t, waiting, color="0.6", linestyle=":", label="waiting in vLLM (all pods)")
        for stage in stages[1:]:
            ax.axvline(stage.start, color="0.8", linewidth=0.8)
        ax.set_ylabel("requests")
        ax.set_title(name, fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
    axes[-1, 0].set_xlabel("seconds")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
