"""The demo's report: percentiles, per-arm results, the tables printed and the JSON written.

Nothing is adjusted after the fact: each arm's block shows what its requests measured, and the
comparison states for every metric whether an epp arm did better or worse than round-robin.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epp.demo.workload import RequestResult, Workload, best_hit_rate

if TYPE_CHECKING:
    from epp.sim.engine import SimConfig

ARM_TITLES = {
    "round-robin": "Envoy alone, ROUND_ROBIN over the pods (no epp)",
    "epp": "Envoy + epp with vLLM KV events, its default for them (whole-request latency, precise index)",
    "epp-approx": "Envoy + epp without KV events (queue 2, kv-cache 2, approximate prefix 3, in-flight 1)",
    "epp-load-only": "Envoy + epp, load only (queue 2, kv-cache 2, in-flight 1; no prefix-cache scorer)",
}


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default); NaN for no values."""
    clean = sorted(v for v in values if not math.isnan(v))
    if not clean:
        return math.nan
    pos = (len(clean) - 1) * pct / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(clean) - 1)
    return clean[lo] + (clean[hi] - clean[lo]) * (pos - lo)


@dataclasses.dataclass(slots=True)
class ArmResult:
    name: str
    results: list[RequestResult]
    wall_s: float
    pods: list[str]
    sim_stats: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if not r.error]

    @property
    def errors(self) -> int:
        return sum(1 for r in self.results if r.error)

    @property
    def rps(self) -> float:
        return len(self.ok) / self.wall_s if self.wall_s > 0 else math.nan

    def ttft_ms(self, pct: float) -> float:
        return percentile([r.ttft_s * 1e3 for r in self.ok], pct)

    def latency_ms(self, pct: float) -> float:
        return percentile([r.latency_s * 1e3 for r in self.ok], pct)

    def tpot_ms(self, pct: float) -> float:
        """Time per output token after the first (end-to-end minus TTFT over the rest)."""
        return percentile(
            [
                (r.latency_s - r.ttft_s) * 1e3 / (r.completion_tokens - 1)
                for r in self.ok
                if r.completion_tokens > 1
            ],
            pct,
        )

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.ok)

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.ok)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else math.nan

    def per_pod(self) -> dict[str, dict[str, Any]]:
        """Requests served and cache hit rate per pod (pods that served nothing included)."""
        requests: Counter[str] = Counter()
        prompt: Counter[str] = Counter()
        cached: Counter[str] = Counter()
        for r in self.results:
            if r.pod:
                requests[r.pod] += 1
                prompt[r.pod] += r.prompt_tokens
                cached[r.pod] += r.cached_tokens
        names = list(self.pods) + sorted(set(requests) - set(self.pods))
        return {
            p: {
                "requests": requests[p],
                "cache_hit_rate": cached[p] / prompt[p] if prompt[p] else math.nan,
            }
            for p in names
        }

    def summary(self) -> dict[str, Any]:
        return {
            "arm": self.name,
            "title": ARM_TITLES[self.name],
            "requests": len(self.results),
            "errors": self.errors,
            "wall_s": self.wall_s,
            "rps": self.rps,
            "ttft_ms": {f"p{p}": self.ttft_ms(p) for p in (50, 90, 99)},
            "latency_ms": {f"p{p}": self.latency_ms(p) for p in (50, 90, 99)},
            "tpot_ms": {f"p{p}": self.tpot_ms(p) for p in (50, 90, 99)},
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cache_hit_rate": self.hit_rate,
            "per_pod": self.per_pod(),
            "error_samples": sorted({r.error for r in self.results if r.error})[:5],
        }


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value * 100:.1f}%"


def render_arm(arm: ArmResult) -> str:
    s = arm.summary()
    t, lat, tpot = s["ttft_ms"], s["latency_ms"], s["tpot_ms"]
    pods = s["per_pod"]
    width = max([len(p) for p in pods] + [6])
    lines = [
        f"[{arm.name}] {ARM_TITLES[arm.name]}",
        f"  requests    {s['requests']:>6}    errors {s['errors']}    {arm.rps:.1f} req/s"
        f"    (wall {arm.wall_s:.1f} s)",
        f"  TTFT ms     p50 {_ms(t['p50']):>6}   p90 {_ms(t['p90']):>6}   p99 {_ms(t['p99']):>6}",
        f"  E2E ms      p50 {_ms(lat['p50']):>6}   p90 {_ms(lat['p90']):>6}   p99 {_ms(lat['p99']):>6}",
        f"  TPOT ms     p50 {_ms(tpot['p50']):>6}   p90 {_ms(tpot['p90']):>6}   p99 {_ms(tpot['p99']):>6}",
        f"  cache hit   {_pct(arm.hit_rate):>6}    ({arm.cached_tokens:,} of {arm.prompt_tokens:,} "
        "prompt tokens were cached)",
        "  pod         " + "  ".join(f"{p:>{width}}" for p in pods),
        "  requests    " + "  ".join(f"{v['requests']:>{width}}" for v in pods.values()),
        "  cache hit   " + "  ".join(f"{_pct(v['cache_hit_rate']):>{width}}" for v in pods.values()),
    ]
    for sample in s["error_samples"]:
        lines.append(f"  error: {sample}")
    return "\n".join(lines)


def _ratio(new: float, old: float, *, lower_is_better: bool) -> str:
    """'0.52x, 1.9x lower' when `new` is better, '1.05x, worse' when not, 'about the same' within 2%."""
    if math.isnan(new) or math.isnan(old) or old == 0 or new == 0:
        return "n/a"
    ratio = new / old
    if abs(ratio - 1) < 0.02:
        return f"{ratio:.2f}x, about the same"
    better = ratio < 1 if lower_is_better else ratio > 1
    if not better:
        return f"{ratio:.2f}x, worse"
    factor = 1 / ratio if lower_is_better else ratio
    digits = 2 if factor < 1.1 else 1  # "1.05x higher", not a misleading "1.0x higher"
    return f"{ratio:.2f}x, {factor:.{digits}f}x {'lower' if lower_is_better else 'higher'}"


def render_comparison(arms: Sequence[ArmResult], best: float) -> str:
    """Each epp arm against round-robin: TTFT, E2E and TPOT p50/p99, cache hit rate, throughput."""
    base = next((a for a in arms if a.name == "round-robin"), None)
    others = [a for a in arms if a.name != "round-robin"]
    if base is None or not others:
        return ""
    lines = []
    for arm in others:
        rows = [
            ("TTFT p50 ms", _ms(arm.ttft_ms(50)), _ms(base.ttft_ms(50)),
             _ratio(arm.ttft_ms(50), base.ttft_ms(50), lower_is_better=True)),
            ("TTFT p99 ms", _ms(arm.ttft_ms(99)), _ms(base.ttft_ms(99)),
             _ratio(arm.ttft_ms(99), base.ttft_ms(99), lower_is_better=True)),
            ("E2E p50 ms", _ms(arm.latency_ms(50)), _ms(base.latency_ms(50)),
             _ratio(arm.latency_ms(50), base.latency_ms(50), lower_is_better=True)),
            ("E2E p99 ms", _ms(arm.latency_ms(99)), _ms(base.latency_ms(99)),
             _ratio(arm.latency_ms(99), base.latency_ms(99), lower_is_better=True)),
            ("TPOT p50 ms", _ms(arm.tpot_ms(50)), _ms(base.tpot_ms(50)),
             _ratio(arm.tpot_ms(50), base.tpot_ms(50), lower_is_better=True)),
            ("TPOT p99 ms", _ms(arm.tpot_ms(99)), _ms(base.tpot_ms(99)),
             _ratio(arm.tpot_ms(99), base.tpot_ms(99), lower_is_better=True)),
            ("cache hit", _pct(arm.hit_rate), _pct(base.hit_rate),
             _ratio(arm.hit_rate, base.hit_rate, lower_is_better=False)),
            ("throughput req/s", f"{arm.rps:.1f}", f"{base.rps:.1f}",
             _ratio(arm.rps, base.rps, lower_is_better=False)),
        ]  # fmt: skip
        width = max(len(arm.name), 6)
        title = f"{arm.name} vs round-robin"
        label_width = max(20, len(title) - 1)
        lines.append(f"{title:<{label_width + 2}}{arm.name:>{width}}  round-robin  ratio")
        for label, mine, theirs, ratio in rows:
            lines.append(f"  {label:<{label_width}}{mine:>{width}}  {theirs:>11}  {ratio}")
        lines.append("")
    lines.append(
        f"Best possible cache hit for this workload: {_pct(best)} (every request except each\n"
        "tenant's first finds its tenant's whole system prompt cached)."
    )
    return "\n".join(lines)


def setup_paragraph(args: argparse.Namespace, cfg: SimConfig, workload: Workload) -> str:
    scale = "" if args.time_scale == 1 else f" (all times below x{args.time_scale:g})"
    from epp.tokenize.tokenizer import load_shipped

    prompt_tokens = len(load_shipped().encode(workload.system_prompts[0])) if workload.system_prompts else 0
    cold_ms = (cfg.base_latency + prompt_tokens * cfg.prefill_cost) * 1e3
    usable = cfg.num_gpu_blocks - 1  # vLLM keeps one block back (its null block)
    tenants_fit = usable * cfg.block_size / max(1, prompt_tokens)
    question_chars = sum(len(r.question) for r in workload.requests) // max(1, len(workload.requests))
    return (
        f'Setup: {args.pods} simulated vLLM replicas ("pods") run inside this process. They are a '
        "simulator, not GPUs: a replica schedules like vLLM (continuous batching, chunked "
        "prefill, prefix cache) and sleeps for each step's time instead of computing it"
        f"{scale}. A step takes {cfg.prefill_cost * 1e6:g} us per prompt token it computes (tokens "
        f"found in that pod's prefix cache are not computed), at least "
        f"{cfg.decode_per_token * 1e3:g} ms (a decode step: one more token for every running "
        f"request; {args.output_tokens} tokens per answer), after {cfg.base_latency * 1e3:g} ms of "
        f"request handling. A pod runs at most {cfg.max_num_seqs} requests at once and queues "
        f"the rest, so a request's first token also waits for the prefills sharing its steps. "
        f"Its prefix cache holds {usable} blocks of {cfg.block_size} "
        f"tokens (evicted least recently used, as vLLM's), room for about {tenants_fit:.1f} "
        f"tenants' system prompts; it publishes vLLM's KV-cache events over ZMQ. Prompts are "
        f"tokenized with epp-tiny, the tokenizer shipped with epp. "
        f"Workload: {args.groups} tenants, each with its own {args.prompt_chars:,}-character "
        f"({prompt_tokens:,}-token) system prompt (a cold prefill costs ~{cold_ms:.0f} ms); "
        f"{len(workload.requests)} "
        f"streaming chat requests per arm, each a random tenant's system prompt plus a unique "
        f"~{question_chars}-character question, sent by {args.concurrency} concurrent clients "
        f"(seed {args.seed}). Every arm starts with empty caches, a fresh Envoy (and a fresh epp) "
        "and sends the same requests in the same order. TTFT is measured by the client, to the "
        "first streamed chunk, through the real Envoy on 127.0.0.1."
    )


def write_json(
    path: Path,
    args: argparse.Namespace,
    workload: Workload,
    arms: Sequence[ArmResult],
    sim_config: SimConfig,
) -> None:
    """Every raw number of the run, with the settings and the pods' `sim_config` (NaN as null)."""

    def clean(value: Any) -> Any:
        # JSON has no NaN: missing measurements become null.
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    data = {
        "command": sys.orig_argv,
        "settings": dict(vars(args)),
        "sim_config": dataclasses.asdict(sim_config),
        "best_possible_cache_hit_rate": best_hit_rate(workload),
        "arms": [
            a.summary()
            | {"sim_stats": a.sim_stats, "requests_raw": [dataclasses.asdict(r) for r in a.results]}
            for a in arms
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(clean(data), indent=1, default=str))
