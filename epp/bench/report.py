"""Benchmark results: per-policy summaries, the comparison tables, results.json and the plots.

Definitions (all from the requests served, status 200):

- `hit_rate`: cached prompt tokens / prompt tokens, as the engine reports them (vLLM's
  `usage.prompt_tokens_details.cached_tokens`). Ceiling below 1: the first request of each prefix
  misses, vLLM caches only full blocks and always computes a prompt's last token.
- `hit_rate_ceiling`: the most of the same prompt tokens any router could find cached: what an
  earlier request's prompt or reply computed, over one cache without limits (`epp.bench.reuse`).
  It bounds every router's `hit_rate`, and the `fleet_hit_rate` of a router that makes no copies.
- `prefix_hit_rate`: over requests that carry a shared prefix, the share of the shared tokens
  found cached (min(cached, shared) / shared): the hit rate on what routing can make hit, the
  figure routers publish (Ranvier's "cache hit rate"); unshared requests do not dilute it.
- `request_hit_rate`: over requests that carry a shared prefix, the share whose cached tokens
  covered the prefix's full blocks (Ranvier's request-level measure; `prefix_hit_rate` weighs by
  tokens). Each miss is one of: `miss_cold` (no pod held the prefix when the request arrived),
  `miss_routed_away` (a pod held it, the request went elsewhere), `miss_lost` (its pod held it at
  arrival but not by admission: evicted meanwhile, or preempted); the three are shares of the same
  requests, so hit + the three = 1.
- TTFT: first token - arrival; end-to-end latency (E2E): finish - arrival; TPOT (time per output
  token): (finish - first token) / (output tokens - 1), for requests of 2 tokens or more (seconds).
- `queueing_p90_s` / `_p99_s`: TTFT minus the request's own isolated prefill (its uncached prompt
  alone on an idle pod, `Profile.isolated_prefill_s`): the wait and sharing of steps that routing
  decides. Unavoidable cold prefills do not count in it, unlike TTFT p99.
- `slo_met`: the share of requests meeting both latency targets, TTFT <= `slo_ttft_s` and TPOT <=
  `slo_tpot_s` (`Slo`: per profile, `--slo-ttft` / `--slo-tpot`).
- `goodput`: the share of all requests sent (refused and failed ones included) served within both
  targets; `goodput_req_per_s` the same requests per second of the makespan.
- `req_per_s`, `output_tok_per_s`: over the makespan, from the start to the last finish.
- `fleet_hit_rate`: the pods' own prefix-cache hits over queries (tokens), summed over the fleet:
  the same counters for every arm, a peer's included.
- `prewarm_token_share` (fast mode): the prompt tokens epp's pre-warms computed, over the served
  requests' prompt tokens: what they add to the pods' prefix-cache queries (`fleet_hit_rate`
  counts each as a miss) beyond the requests' own. `prewarms_used`: the share of pre-warms whose
  copy a later request of the same prefix group found on that pod (cached tokens at least the
  warmed ones); `requests_per_prewarm`: such requests per pre-warm (a request counts for every
  earlier pre-warm of its group on its pod).
- `router_cpu_ms_per_request` (live mode): CPU milliseconds the router's processes used from the
  fleet's reset to the drain's end (epp's workers and its Envoy for epp; the peer's process tree
  for a peer), over the requests sent.
- `mean_queue`: vLLM's waiting requests per pod, averaged over the scrape ticks (every 50 ms).
- `load_spread`: requests served by the busiest pod / the mean per pod (1.0 = even).
- `points`: the same per stage (a QPS step, a sharing ratio), for requests arriving in it;
  throughput per stage counts requests finishing and tokens generated within the stage's window
  (a request's tokens spread evenly from its first token to its finish).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

from epp.bench.records import RequestRecord, RunResult, Sample
from epp.bench.workload import Stage, Workload

SCHEMA = 1
"""results.json format version."""


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of ascending `sorted_values`, linearly interpolated; NaN if empty."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclasses.dataclass(frozen=True, slots=True)
class Slo:
    """A latency target a request meets when its TTFT and its TPOT are both within."""

    ttft_s: float = 1.0
    tpot_s: float = 0.08


SLOS: Mapping[str, Slo] = {
    # TTFT 1 s (interactive); TPOT 4x a lone 4k-context sequence's decode step on an idle pod
    # (profiles' step_time: codellama 20 ms, qwen3 17 ms, llama-70b 20 ms): a pod's batch may
    # slow a sequence four-fold before the target is missed.
    "codellama-13b-a100": Slo(1.0, 0.08),
    "qwen3-32b-tp2-h100": Slo(1.0, 0.066),
    "llama-3.1-70b-h100": Slo(1.0, 0.08),
}


def slo_for(profile: str) -> Slo:
    """The default latency target of a profile (a generic one for the others)."""
    return SLOS.get(profile, Slo())


def tpot(r: RequestRecord) -> float | None:
    """Seconds per output token after the first; None for fewer than 2 tokens or unfinished."""
    if r.first_token is None or r.finish is None or r.output_tokens < 2:
        return None
    return (r.finish - r.first_token) / (r.output_tokens - 1)


def _hits(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Request-level hit rate and the three kinds of miss (see the module)."""
    hit = cold = away = lost = 0
    for r in records:
        need = r.prefix_need
        if need <= 0:
            continue
        if r.cached_tokens >= need:
            hit += 1
        elif r.held_best < need:
            cold += 1
        elif r.held_chosen < need:
            away += 1
        else:
            lost += 1
    n = hit + cold + away + lost
    share = (lambda k: k / n) if n else (lambda k: math.nan)
    return {
        "request_hit_rate": share(hit),
        "miss_cold": share(cold),
        "miss_routed_away": share(away),
        "miss_lost": share(lost),
    }


def _ceiling(records: Sequence[RequestRecord], prompt: int) -> float:
    """`hit_rate_ceiling` (module docstring); NaN when a record does not know its reuse."""
    reusable = [r.reusable_tokens for r in records]
    if not prompt or any(n is None for n in reusable):
        return math.nan
    return sum(n for n in reusable if n is not None) / prompt


def _rates(records: Sequence[RequestRecord], slo: Slo | None = None) -> dict[str, float]:
    prompt = sum(r.prompt_tokens for r in records)
    shared = sum(r.shared_tokens for r in records)
    ttft = sorted(r.first_token - r.arrival for r in records if r.first_token is not None)
    e2e = sorted(r.finish - r.arrival for r in records if r.finish is not None)
    tpots = sorted(t for r in records if (t := tpot(r)) is not None)
    queueing = sorted(
        r.first_token - r.arrival - r.isolated_prefill_s for r in records if r.first_token is not None
    )
    slo = slo or Slo()
    met = sum(
        1
        for r in records
        if r.first_token is not None
        and r.first_token - r.arrival <= slo.ttft_s
        and ((t := tpot(r)) is None or t <= slo.tpot_s)
    )
    return {
        "hit_rate": sum(r.cached_tokens for r in records) / prompt if prompt else math.nan,
        "hit_rate_ceiling": _ceiling(records, prompt),
        "prefix_hit_rate": (
            sum(min(r.cached_tokens, r.shared_tokens) for r in records) / shared if shared else math.nan
        ),
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else math.nan,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p90_s": percentile(ttft, 90),
        "ttft_p99_s": percentile(ttft, 99),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p90_s": percentile(e2e, 90),
        "e2e_p99_s": percentile(e2e, 99),
        "tpot_p50_s": percentile(tpots, 50),
        "tpot_p90_s": percentile(tpots, 90),
        "tpot_p99_s": percentile(tpots, 99),
        "queueing_p90_s": percentile(queueing, 90),
        "queueing_p99_s": percentile(queueing, 99),
        "slo_met": met / len(records) if records else math.nan,
        "slo_ttft_s": slo.ttft_s,
        "slo_tpot_s": slo.tpot_s,
        **_hits(records),
    }


def _prewarm_use(result: RunResult, served: Sequence[RequestRecord]) -> dict[str, float]:
    """What the pre-warms cost the pods' counters and whom they served (module docstring)."""
    log = result.prewarm_log
    if log is None:
        return {"prewarm_token_share": math.nan, "prewarms_used": math.nan, "requests_per_prewarm": math.nan}
    prompt = sum(r.prompt_tokens for r in served)
    by_copy: dict[tuple[str, int], list[RequestRecord]] = {}
    for r in served:
        if r.group:
            by_copy.setdefault((r.group, r.pod), []).append(r)
    found = [
        sum(1 for r in by_copy.get((w.group, w.pod), ()) if r.arrival > w.at and r.cached_tokens >= w.tokens)
        for w in log
        if w.group
    ]
    return {
        "prewarm_token_share": sum(w.tokens for w in log) / prompt if prompt else math.nan,
        "prewarms_used": sum(1 for n in found if n) / len(log) if log else math.nan,
        "requests_per_prewarm": sum(found) / len(log) if log else math.nan,
    }


def _mean_queue(samples: Sequence[Sample], start: float = -math.inf, end: float = math.inf) -> float:
    picked = [s for s in samples if start <= s.t < end]
    if not picked:
        return math.nan
    return sum(sum(s.waiting) / len(s.waiting) for s in picked) / len(picked)


def _tokens_in(r: RequestRecord, start: float, end: float) -> float:
    """Output tokens of `r` generated in [start, end), spread evenly from first token to finish."""
    if r.first_token is None or r.finish is None or not r.output_tokens:
        return 0.0
    a, b = r.first_token, r.finish
    if b <= a:
        return float(r.output_tokens) if start <= a < end else 0.0
    overlap = min(b, end) - max(a, start)
    return r.output_tokens * overlap / (b - a) if overlap > 0 else 0.0


STEADY_FROM_S: Final = 30.0
"""`ttft_p99_from_30s_s` counts the requests that arrived from this second of the run on. A 120 s
run's TTFT p99 is a dozen requests, and on shared-prefix workloads most of them are its first
seconds' cold prefills, placed before any router has learned the pods: that figure moves by a
third from run to run of one seed (BENCHMARKS.md#real-routers-one-seed); this one compares the
routing past the start."""


def summarize(result: RunResult, stages: Sequence[Stage], slo: Slo | None = None) -> dict[str, Any]:
    """The policy's entry in results.json; `slo` defaults to the profile's (`slo_for`)."""
    slo = slo or slo_for(result.profile)
    served = [r for r in result.records if r.status == 200]
    span = max((r.finish for r in served if r.finish is not None), default=0.0)
    per_pod = (
        result.fleet_requests_per_pod
    )  # live mode: the pods' own counts (a proxy may hide which pod served)
    if per_pod is None:
        per_pod = [0] * result.pods
        for r in served:
            if r.pod >= 0:
                per_pod[r.pod] += 1
    mean_per_pod = sum(per_pod) / result.pods if result.pods else 0.0
    rates = _rates(served, slo)
    met = rates["slo_met"] * len(served) if served else 0.0
    out: dict[str, Any] = {
        "requests": len(result.records),
        "served": len(served),
        "failed": sum(1 for r in result.records if r.status not in (0, 200)),
        "unfinished": sum(1 for r in result.records if r.status == 0),
        **rates,
        "ttft_p99_from_30s_s": percentile(
            sorted(
                r.first_token - r.arrival
                for r in served
                if r.first_token is not None and r.arrival >= STEADY_FROM_S
            ),
            99,
        ),
        # Served within both latency targets, over every request sent (refused ones count as
        # missed), and the same per second of the run.
        "goodput": met / len(result.records) if result.records else math.nan,
        "req_per_s": len(served) / span if span else math.nan,
        # Requests that met the latency target, per second of the run: goodput as a rate.
        "goodput_req_per_s": met / span if span else math.nan,
        "output_tok_per_s": sum(r.output_tokens for r in served) / span if span else math.nan,
        "mean_queue": _mean_queue(result.samples),
        "load_spread": max(per_pod) / mean_per_pod if mean_per_pod else math.nan,
        "requests_per_pod": per_pod,
        # The pods' own prefix-cache counters (tokens): the same source for every arm.
        "fleet_hit_rate": (
            result.fleet_prefix_hits / result.fleet_prefix_queries
            if result.fleet_prefix_queries
            else math.nan
        ),
        # The router's own CPU (live mode: epp with its Envoy, or the peer's process), per request.
        "router_cpu_ms_per_request": (
            result.router_cpu_s * 1000 / len(result.records) if result.records else math.nan
        ),
        "preemptions": sum(r.preemptions for r in served),
        # Prefix pre-warms the router sent the pods (fast mode: epp.bench.fast_prewarm), per request.
        "prewarms_per_request": (
            result.prewarms / len(result.records)
            if result.prewarms is not None and result.records
            else math.nan
        ),
        **_prewarm_use(result, served),
        "pod_restarts": result.pod_restarts,
        "makespan_s": span,
        "wall_s": result.wall_s,
        "engine_steps": result.steps,
        "stopped_early": result.stopped_early,
    }
    if len(stages) > 1:
        out["points"] = [_point(stage, i, served, result.samples, slo) for i, stage in enumerate(stages)]
    return out


def _point(
    stage: Stage, i: int, served: Sequence[RequestRecord], samples: Sequence[Sample], slo: Slo
) -> dict[str, Any]:
    mine = [r for r in served if r.stage == i]
    d = stage.duration
    finished = sum(1 for r in served if r.finish is not None and stage.start <= r.finish < stage.end)
    tokens = sum(_tokens_in(r, stage.start, stage.end) for r in served)
    return {
        "stage": stage.label,
        "qps": stage.qps,
        "sharing": stage.sharing,
        "requests": len(mine),
        **_rates(mine, slo),
        "req_per_s": finished / d if d else math.nan,
        "output_tok_per_s": tokens / d if d else math.nan,
        "mean_queue": _mean_queue(samples, stage.start, stage.end),
    }


def _fleet(entry: Mapping[str, Any]) -> str:
    mix = entry.get("pod_profiles")
    if not mix:
        return f"{entry['pods']} pods x {entry['profile']}"
    counts = {name: mix.count(name) for name in dict.fromkeys(mix)}
    return " + ".join(f"{n} pods x {name}" for name, n in counts.items())


def workload_entry(
    workload: Workload,
    profile: str,
    pods: int,
    runs: Mapping[str, dict[str, Any]],
    pod_profiles: Sequence[str] | None = None,
) -> dict[str, Any]:
    return {
        "description": workload.description,
        "profile": profile,
        "pods": pods,
        # A mixed fleet's profiles, pod by pod (None: `profile` on every pod).
        "pod_profiles": list(pod_profiles) if pod_profiles else None,
        "duration_s": workload.duration,
        "scale": workload.scale,
        "load": workload.load,
        "stages": [
            {"label": s.label, "start_s": s.start, "end_s": s.end, "qps": s.qps, "sharing": s.sharing}
            for s in workload.stages
        ],
        # Pods restarted during each run (`Workload.pod_restarts`): when, which, seconds down.
        "pod_restarts": [{"at_s": t, "pod": pod, "down_s": down} for t, pod, down in workload.pod_restarts],
        "policies": dict(runs),
    }


def write_results(path: str, *, seed: int, mode: str, workloads: Mapping[str, Any]) -> None:
    """results.json: NaN (nothing measured) is written as null."""
    doc = {"schema": SCHEMA, "mode": mode, "seed": seed, "workloads": workloads}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_nan_to_none(doc), f, indent=1)
        f.write("\n")


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value


# --- tables ------------------------------------------------------------------------------------

_COLUMNS = (
    ("policy", None, ""),
    ("hit", "hit_rate", "pct"),
    ("hit ceiling", "hit_rate_ceiling", "pct"),
    ("req hit", "request_hit_rate", "pct"),
    ("cold / away", None, "misses"),
    ("TTFT p50", "ttft_p50_s", "s"),
    ("TTFT p99", "ttft_p99_s", "s"),
    ("queue p90", "queueing_p90_s", "s"),
    ("queue p99", "queueing_p99_s", "s"),
    ("TPOT p50", "tpot_p50_s", "ms"),
    ("TPOT p99", "tpot_p99_s", "ms"),
    ("E2E p50", "e2e_p50_s", "s"),
    ("E2E p99", "e2e_p99_s", "s"),
    ("SLO met", "slo_met", "pct"),
    ("out tok/s", "output_tok_per_s", "f0"),
    ("spread", "load_spread", "f2"),
)


def _fmt(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "ms":
        return f"{value * 1000:.1f}"
    if kind == "s":
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    if kind == "f0":
        return f"{value:,.0f}"
    if kind == "f1":
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(s: Mapping[str, Any], key: str | None, kind: str) -> str:
    if kind == "misses":  # the two kinds of miss a reader weighs: unavoidable / routing's
        return f"{_fmt(s.get('miss_cold'), 'pct')} / {_fmt(s.get('miss_routed_away'), 'pct')}"
    return _fmt(s.get(key) if key else None, kind)


def table(name: str, entry: Mapping[str, Any]) -> str:
    """The workload's comparison as a Markdown table (times in seconds), plus per-stage p90 TTFT."""
    lines = [
        f"### {name}: {entry['description']}",
        f"{_fleet(entry)}, {entry['duration_s']:.0f} s of arrivals; "
        "TPOT in ms, other times in s; " + _slo_note(entry),
        "",
        "| " + " | ".join(c[0] for c in _COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
    ]
    for policy, s in entry["policies"].items():
        cells = [policy] + [_cell(s, key, kind) for _, key, kind in _COLUMNS[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    stages = entry["stages"]
    if len(stages) > 1:
        lines += ["", "TTFT p90 (s) / hit rate by stage:", ""]
        policies = list(entry["policies"])
        lines.append("| stage | " + " | ".join(policies) + " |")
        lines.append("|" + "---|" * (len(policies) + 1))
        for i, st in enumerate(stages):
            cells = []
            for p in policies:
                point = entry["policies"][p]["points"][i]
                cells.append(f"{_fmt(point['ttft_p90_s'], 's')} / {_fmt(point['hit_rate'], 'pct')}")
            lines.append(f"| {st['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _slo_note(entry: Mapping[str, Any]) -> str:
    first: Mapping[str, Any] = next(iter(entry["policies"].values()), {})
    ttft, tpot_s = first.get("slo_ttft_s"), first.get("slo_tpot_s")
    if ttft is None or tpot_s is None:
        return "SLO: -"
    return f"SLO: TTFT <= {ttft:g} s and TPOT <= {tpot_s * 1000:g} ms"


# --- plots ---------------------------------------------------------------------------------------


def plot_ttft_cdf(path: str, title: str, ttfts: Mapping[str, Sequence[float]]) -> bool:
    """One TTFT CDF (seconds, ascending values per series) to `path`; False without matplotlib.
    Shared by `epp bench` and `epp demo`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, values in ttfts.items():
        if values:
            n = len(values)
            ax.plot(values, [(i + 1) / n for i in range(n)], label=label, linewidth=1.2)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot(
    out_dir: str, name: str, entry: Mapping[str, Any], ttfts: Mapping[str, Sequence[float]]
) -> list[str]:
    """PNG plots for one workload: TTFT CDF per policy; for multi-stage workloads, throughput and
    p90 TTFT per stage. Returns the files written; [] without matplotlib (the `bench` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    path = os.path.join(out_dir, f"{name}-ttft-cdf.png")
    if plot_ttft_cdf(path, f"{name}: TTFT CDF", ttfts):
        written.append(path)
    # The sweep: stages in order, a warm-up left out (it is not a point of the ladder).
    stages = [(i, s) for i, s in enumerate(entry["stages"]) if s["label"] != "warmup"]
    if len(stages) > 1:
        xs = [s["qps"] if s["qps"] is not None else s["sharing"] for _, s in stages]
        xlabel = "offered QPS" if stages[-1][1]["qps"] is not None else "sharing ratio"
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
        for policy, s in entry["policies"].items():
            points = [s["points"][i] for i, _ in stages]
            top.plot(xs, [p["output_tok_per_s"] for p in points], marker=".", label=policy)
            bottom.plot(xs, [p["ttft_p90_s"] for p in points], marker=".", label=policy)
        top.set_ylabel("output tok/s")
        bottom.set_ylabel("TTFT p90 (s, log scale)")
        bottom.set_yscale("log")
        bottom.set_xlabel(xlabel)
        top.set_title(f"{name}: throughput and p90 TTFT per stage")
        for a in (top, bottom):
            a.grid(True, alpha=0.3)
        top.legend(fontsize=7)
        path = os.path.join(out_dir, f"{name}-sweep.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def ttft_values(result: RunResult) -> list[float]:
    """The served requests' TTFTs, ascending (for the CDF)."""
    return sorted(
        r.first_token - r.arrival for r in result.records if r.status == 200 and r.first_token is not None
    )
