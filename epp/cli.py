"""The `epp` command: `epp serve` (the Endpoint Picker), `epp demo`, `epp sim`, `epp bench ...`.

Flag names and defaults follow GIE's EPP where it has them (--grpc-port 9002, --grpc-health-port
9003, --metrics-port 9090, --config-file/--config-text, --secure-serving, --cert-path,
--refresh-metrics-interval, --metrics-staleness-threshold, --disable-endpoint-subset-filter), so
a GIE deployment's arguments carry over. Booleans accept Go's `--flag=false` form.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence

from epp.units import parse_duration


def duration(text: str) -> float:
    """Go-style durations: '50ms', '2s', '1.5s', '1m30s'; a bare number is seconds."""
    try:
        return parse_duration(text, bare_seconds=True)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def byte_size(text: str) -> int:
    match = re.match(r"^(\d+)\s*([kKmMgG]i?[bB]?)?$", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 16Mi, 1048576)")
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port in 1-65535: {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if value < 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ports")
    g.add_argument("--grpc-port", type=int, default=9002, help="ext-proc gRPC port (default 9002)")
    g.add_argument("--grpc-health-port", type=int, default=9003, help="gRPC health port (default 9003)")
    g.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port (default 9090)")
    g.add_argument("--bind-address", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    g.add_argument(
        "--secure-serving",
        type=boolean,
        nargs="?",
        const=True,
        default=True,
        help="serve ext-proc over TLS (default true, as GIE); --secure-serving=false for plaintext",
    )
    g.add_argument(
        "--cert-path", help="directory with tls.crt and tls.key; default: a self-signed certificate"
    )

    g = p.add_argument_group("scheduling")
    cfg = g.add_mutually_exclusive_group()
    cfg.add_argument("--config-file", help="EndpointPickerConfig YAML file")
    cfg.add_argument("--config-text", help="EndpointPickerConfig YAML given inline")
    g.add_argument(
        "--max-body-bytes",
        type=byte_size,
        default=16 << 20,
        help="larger request bodies are answered 413 (default 16Mi)",
    )
    g.add_argument(
        "--disable-endpoint-subset-filter",
        action="store_true",
        help="ignore the proxy's envoy.lb.subset_hint",
    )

    g = p.add_argument_group("endpoints (standalone pool)")
    g.add_argument("--endpoints", help="comma-separated host:port list of model-server endpoints")
    g.add_argument("--endpoints-file", help="YAML file of endpoints, reloaded when it changes")
    g.add_argument(
        "--pool-name",
        default=None,
        help="the InferencePool to serve: without --endpoints/--endpoints-file, epp watches it and "
        "its pods in Kubernetes (as GIE's EPP); always the pool name in metrics (default: standalone)",
    )

    g = p.add_argument_group("endpoints (Kubernetes)")
    g.add_argument(
        "--pool-namespace",
        default=None,
        help="namespace of the InferencePool or selected pods (default: $NAMESPACE, else default)",
    )
    g.add_argument(
        "--pool-group",
        default="inference.networking.k8s.io",
        choices=["inference.networking.k8s.io"],
        help="API group of the InferencePool (v1; the only one supported)",
    )
    g.add_argument(
        "--endpoint-selector",
        default=None,
        help="pool-less mode: pods matching these labels (k=v,k2=v2) are the endpoints; "
        "needs --endpoint-target-ports",
    )
    g.add_argument(
        "--endpoint-target-ports",
        default=None,
        help="pool-less mode: the model-server port(s) of each pod, 8000[,8001...] (1-8; one rank each)",
    )
    g.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG or ~/.kube/config)",
    )

    g = p.add_argument_group("KV-cache events (precise prefix-cache routing)")
    g.add_argument(
        "--kv-events",
        choices=["off", "connect", "bind"],
        default="off",
        help="consume vLLM's KV-cache events: connect a subscriber to each endpoint's publisher, "
        "or bind one that the model servers connect to (default off)",
    )
    g.add_argument(
        "--kv-events-port",
        type=port_number,
        default=5557,
        help="connect mode: the publisher port of endpoints whose entry names no kvEvents, "
        "plus the endpoint's data-parallel rank, as vLLM offsets it (default 5557)",
    )
    g.add_argument(
        "--kv-replay-port",
        type=port_number,
        default=None,
        help="the replay port of endpoints whose entry names no kvReplay (plus the rank); "
        "default: no replay for them (a gap purges the pod's blocks until new events rebuild them)",
    )
    g.add_argument(
        "--kv-events-bind",
        default="tcp://*:5557",
        help="bind mode: where to listen for publishers (vLLM's endpoint tcp://<epp>:5557, "
        "topic kv@<ip>:<port>@<model>) (default tcp://*:5557)",
    )
    g.add_argument(
        "--kv-index-max-entries",
        type=positive_int,
        default=10_000_000,
        help="cap on (block, pod) entries in the KV index; least recently used go first (default 10M)",
    )
    g.add_argument(
        "--kv-block-size",
        type=positive_int,
        default=None,
        help="block size for events that carry none (offload connectors); default: none",
    )

    g = p.add_argument_group("tokenizers")
    g.add_argument(
        "--tokenizer",
        action="append",
        default=[],
        metavar="[MODEL=]PATH",
        help="a Hugging Face tokenizer directory or tokenizer.json, for MODEL or (without MODEL=) "
        "for every model; repeatable. Default: epp-tiny, shipped with epp, for every model",
    )
    g.add_argument(
        "--tokenizer-workers",
        type=positive_int,
        default=None,
        help="threads tokenizing long prompts off the event loop (default: CPUs, at most 4; "
        "in a container set it to the CPU limit)",
    )
    g.add_argument(
        "--tokenizer-prefix-cache-bytes",
        type=byte_size,
        default=64 << 20,
        help="per tokenizer: memory for token ids of prompt prefixes seen before, so a repeated "
        "system prompt or a growing conversation encodes only its new part; 0 disables (default 64Mi)",
    )

    g = p.add_argument_group("model-server metrics")
    g.add_argument(
        "--refresh-metrics-interval",
        type=duration,
        default=0.05,
        help="scrape interval per endpoint (default 50ms)",
    )
    g.add_argument(
        "--metrics-staleness-threshold",
        type=duration,
        default=2.0,
        help="metrics older than this are stale (default 2s)",
    )
    g.add_argument(
        "--scrape-failure-threshold",
        type=int,
        default=3,
        help="exclude an endpoint after this many consecutive failed scrapes (default 3)",
    )

    g = p.add_argument_group("logging")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g.add_argument("--log-format", default="json", choices=["json", "text"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epp", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the Endpoint Picker (Envoy ext-proc server)")
    add_serve_arguments(serve)
    demo = sub.add_parser("demo", help="local demo: Envoy + epp + a simulated vLLM fleet")
    from epp import demo as demo_mod

    demo_mod.add_arguments(demo)
    sim = sub.add_parser("sim", help="simulated vLLM pods (OpenAI API, /metrics, KV events)")
    from epp.sim import cli as sim_cli

    sim_cli.add_arguments(sim)
    bench = sub.add_parser(
        "bench",
        help="routing policies compared on a simulated fleet (epp bench --list), or `epp bench overhead`",
    )
    from epp.bench import cli as bench_cli
    from epp.bench import overhead

    bench_cli.add_arguments(bench)
    bench_sub = bench.add_subparsers(dest="bench", metavar="overhead")
    overhead.add_arguments(bench_sub.add_parser("overhead", help="Envoy alone vs Envoy + epp"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from epp import serve

        return serve.main(args)
    if args.command == "demo":
        from epp import demo

        return demo.run(args)
    if args.command == "sim":
        from epp.sim import cli as sim_cli

        return sim_cli.run(args)
    if args.command == "bench" and args.bench == "overhead":
        from epp.bench import overhead

        return overhead.run(args)
    if args.command == "bench":
        from epp.bench import cli as bench_cli

        return bench_cli.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
