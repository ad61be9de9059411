"""The soak's report: requests and errors in and out of fault windows, latency per interval and
its drift, each epp's RSS slope, per fault the recovery times; `report.json`'s dict and its
markdown rendering (`report.md`, the summary printed at the end)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epp.bench.soak.config import Fault, Record, SoakConfig


@dataclasses.dataclass
class Observations:
    """What a soak recorded: its requests, faults, epp RSS samples ((t, epp name, pid, RSS MB,
    anon MB)) and epp /metrics samples ((t, epp name, {series: value}))."""

    cfg: SoakConfig
    records: list[Record]
    faults: list[Fault]
    rss: list[tuple[float, str, int, float, float]]
    samples: list[tuple[float, str, dict[str, float]]]
    pods: int

    def window(self, f: Fault) -> tuple[float, float]:
        """A fault lasts from its start until what it broke is back: the restarted process ready
        (pod_kill, epp_sigterm) or the fault lifted (the others); then `grace` more seconds."""
        back = f.ready if not math.isnan(f.ready) else f.end
        if math.isnan(back):
            back = self.cfg.duration
        return f.start, back + self.cfg.grace

    def in_fault(self, r: Record) -> Fault | None:
        """The fault whose window the request overlapped (a request in flight when a pod is
        killed fails too)."""
        for f in self.faults:
            lo, hi = self.window(f)
            if r.t <= hi and r.t + r.latency >= lo:
                return f
        return None

    def report(self) -> dict[str, Any]:
        cfg = self.cfg
        recs = sorted(self.records, key=lambda r: r.t)
        failed = [r for r in recs if r.status != 200]
        lost = [r for r in failed if self.in_fault(r) is None]
        intervals = _intervals(recs, cfg)
        steady = [i for i in intervals if i["start"] >= cfg.warmup and i["n"]]
        drift = (
            steady[-1]["p99_ms"] / steady[0]["p99_ms"] if len(steady) >= 2 and steady[0]["p99_ms"] else None
        )
        faults = []
        for f in self.faults:
            window = [r for r in recs if self.in_fault(r) is f]
            errors: dict[str, int] = {}
            for r in window:
                if r.status != 200:
                    errors[r.error.split(":")[0]] = errors.get(r.error.split(":")[0], 0) + 1
            faults.append(
                {
                    **dataclasses.asdict(f),
                    "requests": len(window),
                    "failed": sum(r.status != 200 for r in window),
                    "errors": errors,
                    **self.recovery(f, recs),
                }
            )
        return {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()},
            "requests": len(recs),
            "ok": len(recs) - len(failed),
            "failed_in_faults": len(failed) - len(lost),
            "lost": len(lost),
            "lost_samples": [dataclasses.asdict(r) for r in lost[:20]],
            "p50_ms": _pct([r.latency for r in recs if r.status == 200], 50),
            "p99_ms": _pct([r.latency for r in recs if r.status == 200], 99),
            "p99_drift": drift,
            "intervals": intervals,
            "rss": _rss_summary(self.rss, cfg.warmup),
            "degraded_picks": _last_total(self.samples, "epp_routing_degraded_total"),
            "faults": faults,
        }

    def recovery(self, f: Fault, recs: list[Record]) -> dict[str, Any]:
        """Seconds from the fault's end (or the process's return) to: a request served by the pod
        again and the pod back at half its fair share over 10 s (pod_kill); every endpoint routable
        again on epp A (scrape_hang); epp A applying the pod's events again (publisher_drop); epp B
        routing again (epp_sigterm)."""
        if math.isnan(f.end):
            return {}
        out: dict[str, Any] = {}
        if f.kind == "pod_kill":
            back = [r.t for r in recs if r.t >= f.ready and r.pod == f.target and r.status == 200]
            out["first_served_s"] = back[0] - f.ready if back else None
            out["share_s"] = _share_time(recs, f, self.pods)
        elif f.kind == "scrape_hang":
            out["readmitted_s"] = self._first_sample(f.end, "epp-a", lambda s: s.get("excluded", 1) == 0)
        elif f.kind == "publisher_drop":
            port = f.target.rsplit(":", 1)[1]
            before = [s for t, n, s in self.samples if n == "epp-a" and t <= f.end]
            base = before[-1].get(f"batches:{port}", 0.0) if before else 0.0
            out["events_again_s"] = self._first_sample(
                f.end, "epp-a", lambda s: s.get(f"batches:{port}", 0.0) > base
            )
        elif f.kind == "epp_sigterm":
            out["serving_s"] = f.ready - f.end
            out["routing_s"] = self._first_sample(f.ready, "epp-b", lambda s: s.get("requests", 0.0) > 0)
        return out

    def _first_sample(self, after: float, name: str, ok: Any) -> float | None:
        for t, n, s in self.samples:
            if n == name and t >= after and ok(s):
                return round(t - after, 2)
        return None


def parse_series(text: str) -> dict[str, float]:
    """The few epp series the soak follows, summed: excluded endpoints, requests, degraded picks,
    and KV batches per pod port (`batches:<port>`)."""
    out: dict[str, float] = {"excluded": 0.0, "requests": 0.0, "epp_routing_degraded_total": 0.0}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        if name.startswith("epp_endpoint_excluded{"):
            out["excluded"] += v
        elif name.startswith("inference_objective_request_total{"):
            out["requests"] += v
        elif name.startswith("epp_routing_degraded_total"):
            out["epp_routing_degraded_total"] += v
        elif name.startswith("epp_kv_events_batches_total{"):
            port = name.rsplit(":", 1)[-1].split('"')[0].split("@")[0]
            if port.isdigit():
                out[f"batches:{port}"] = out.get(f"batches:{port}", 0.0) + v
    return out


def _pct(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(1000 * s[min(len(s) - 1, int(len(s) * p / 100))], 1)


def _intervals(recs: list[Record], cfg: SoakConfig) -> list[dict[str, Any]]:
    width = max(10.0, min(300.0, cfg.duration / 12))
    out = []
    for k in range(math.ceil(cfg.duration / width)):
        lo, hi = k * width, (k + 1) * width
        ok = [r.latency for r in recs if lo <= r.t < hi and r.status == 200]
        n = sum(1 for r in recs if lo <= r.t < hi)
        out.append(
            {"start": lo, "n": n, "failed": n - len(ok), "p50_ms": _pct(ok, 50), "p99_ms": _pct(ok, 99)}
        )
    return out


def _share_time(recs: list[Record], f: Fault, pods: int) -> float | None:
    """Seconds after the pod's return until, over the next 10 s, it served >= half its share."""
    served = [r for r in recs if r.t >= f.ready and r.status == 200]
    for start in [r.t for r in served if r.pod == f.target]:
        window = [r for r in served if start <= r.t < start + 10.0]
        if window and recs[-1].t >= start + 10.0:
            mine = sum(1 for r in window if r.pod == f.target)
            if mine >= 0.5 * len(window) / pods:
                return round(start - f.ready, 2)
    return None


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope in MB per minute of (seconds, MB) points."""
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return round(60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den, 4) if den else None


def _rss_summary(rss: list[tuple[float, str, int, float, float]], warmup: float) -> dict[str, Any]:
    """Per epp process lifetime (name, pid): RSS and anonymous RSS at start and end, and the
    anonymous RSS's slope after warm-up (a restarted process warms up again: its first `warmup`
    seconds are left out)."""
    lives: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for t, name, pid, mb, anon in rss:
        lives.setdefault((name, pid), []).append((t, mb, anon))
    out = {}
    for (name, pid), pts in lives.items():
        began = max(warmup, pts[0][0] + (warmup if pts[0][0] > 1 else 0.0))
        steady = [p for p in pts if p[0] >= began]
        out[f"{name} pid {pid}"] = {
            "from_s": round(pts[0][0], 1),
            "to_s": round(pts[-1][0], 1),
            "first_mb": round(pts[0][1], 1),
            "last_mb": round(pts[-1][1], 1),
            "max_mb": round(max(p[1] for p in pts), 1),
            "anon_first_mb": round(pts[0][2], 1),
            "anon_steady_first_mb": round(steady[0][2], 1) if steady else None,
            "anon_last_mb": round(pts[-1][2], 1),
            "anon_slope_mb_per_min": _slope([(t, anon) for t, _, anon in steady]),
            "rss_slope_mb_per_min": _slope([(t, mb) for t, mb, _ in steady]),
        }
    return out


def _last_total(samples: list[tuple[float, str, dict[str, float]]], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for _, name, s in samples:
        out[name] = s.get(key, 0.0)
    return out


def render(r: dict[str, Any]) -> str:
    c = r["config"]
    lines = [
        f"# Soak: {c['duration']:.0f} s at {c['rate']:g} req/s, {c['pods']} pods, "
        "2 epp replicas behind Envoy",
        "",
        f"- requests {r['requests']}, ok {r['ok']}, failed inside fault windows {r['failed_in_faults']}, "
        f"**lost (failed outside any fault window) {r['lost']}**",
        f"- latency p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms; p99 drift (last interval / first after "
        f"warm-up) {r['p99_drift'] if r['p99_drift'] is None else round(r['p99_drift'], 2)}",
        f"- picks made in degraded mode (every endpoint's metrics stale): {r['degraded_picks']}",
        "",
        "| epp process | from s | to s | RSS first / last / max MB | anon RSS first / after warm-up / "
        "last MB | anon slope MB/min | RSS slope MB/min |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in r["rss"].items():
        lines.append(
            f"| {name} | {v['from_s']} | {v['to_s']} | {v['first_mb']} / {v['last_mb']} / {v['max_mb']} | "
            f"{v['anon_first_mb']} / {v['anon_steady_first_mb']} / {v['anon_last_mb']} | "
            f"{v['anon_slope_mb_per_min']} | {v['rss_slope_mb_per_min']} |"
        )
    lines += [
        "",
        "| t s | fault | target | requests in window | failed | errors | recovery |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = ("first_served_s", "share_s", "readmitted_s", "events_again_s", "serving_s", "routing_s")
    for f in r["faults"]:
        rec = ", ".join(f"{k} {f[k] if f[k] is None else round(f[k], 2)}" for k in keys if k in f)
        lines.append(
            f"| {f['start']:.0f} | {f['kind']} | {f['target']} | {f['requests']} | {f['failed']} | "
            f"{f['errors'] or ''} | {rec} |"
        )
    if r.get("attacks"):
        lines += [
            "",
            f"Client attacks (epp.bench.soak.attacks), answers by kind; **5xx outside fault windows: "
            f"{r['attack_5xx']}** (inside them: {r.get('attack_5xx_in_faults', 0)})",
            "",
            "| attack | answers |",
            "|---|---|",
        ]
        lines += [f"| {kind} | {counts} |" for kind, counts in sorted(r["attacks"].items())]
    lines += ["", "| interval start s | requests | failed | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    for i in r["intervals"]:
        lines.append(f"| {i['start']:.0f} | {i['n']} | {i['failed']} | {i['p50_ms']} | {i['p99_ms']} |")
    return "\n".join(lines) + "\n"
