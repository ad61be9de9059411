"""The `epp` command: `epp serve` (the Endpoint Picker), `epp envoy-config`, `epp demo`, `epp sim`,
`epp sidecar`, `epp bench ...`.

Every flag and argparse type lives in epp.flags; subcommands import them from there, never from here.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import MutableMapping, Sequence

from epp.flags import add_serve_arguments
from epp.flags.compat import normalize_go_flags


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise KeyError(name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epp", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the Endpoint Picker (Envoy ext-proc server)")
    add_serve_arguments(serve)
    envoy_config = sub.add_parser(
        "envoy-config", help="print an Envoy config that fronts epp serve (TLS to epp, as its default)"
    )
    from epp.gateway import cli as gateway_cli

    gateway_cli.add_arguments(envoy_config)
    demo = sub.add_parser("demo", help="local demo: Envoy + epp + a simulated vLLM fleet")
    from epp import demo as demo_mod

    demo_mod.add_arguments(demo)
    sim = sub.add_parser("sim", help="simulated vLLM pods (OpenAI API, /metrics, KV events)")
    from epp.sim import cli as sim_cli

    sim_cli.add_arguments(sim)
    sidecar = sub.add_parser(
        "sidecar", help="prefill/decode sidecar beside a decode pod (llm-d's routing-sidecar protocol)"
    )
    from epp.sidecar import cli as sidecar_cli

    sidecar_cli.add_arguments(sidecar)
    bench = sub.add_parser(
        "bench",
        help="routing policies compared on a simulated fleet (epp bench --list), or `epp bench overhead`",
    )
    from epp.bench import cli as bench_cli
    from epp.bench import overhead

    bench_cli.add_arguments(bench)
    bench_sub = bench.add_subparsers(dest="bench", metavar="overhead | pd | fleet")
    overhead.add_arguments(bench_sub.add_parser("overhead", help="Envoy alone vs Envoy + epp"))
    from epp.bench import fleet as bench_fleet

    bench_fleet.add_arguments(
        bench_sub.add_parser("fleet", help="epp's CPU and memory in front of 10, 100, 1,000 simulated pods")
    )
    from epp.bench import pd as bench_pd

    bench_pd.add_arguments(bench_sub.add_parser("pd", help="prefill/decode disaggregation, fast mode"))
    return parser


# gRPC core's own listener and endpoints (iomgr) in place of its EventEngine ones, for the ext-proc
# server: accepted connections are then polled by the thread grpc.aio already runs, one thread
# hand-off less per read. Measured on grpcio 1.85 (`scripts/bench_grpc_streams.py`, a servicer
# that only answers): ~12% less server CPU per stream (0.92 vs 1.06-1.16 ms, alternated runs);
# epp behind Envoy (`epp bench overhead --stream`): 2-10% less CPU per request, every point of two
# alternated runs. gRPC core reads it once, when it loads: `epp serve` sets it before importing it.
GRPC_EXPERIMENTS = "GRPC_EXPERIMENTS"
GRPC_EXPERIMENTS_DEFAULT = "-event_engine_listener"


def grpc_environment(environ: MutableMapping[str, str]) -> None:
    """Set gRPC core's experiments for `epp serve` unless the environment names its own."""
    environ.setdefault(GRPC_EXPERIMENTS, GRPC_EXPERIMENTS_DEFAULT)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["serve"] and "grpc" not in sys.modules:
        grpc_environment(os.environ)  # before the parser imports grpc
    parser = build_parser()
    if arguments[:1] == ["serve"]:
        arguments = ["serve", *normalize_go_flags(arguments[1:], _subparser(parser, "serve"))]
    args = parser.parse_args(arguments)
    if args.command == "serve":
        from epp import serve

        return serve.main(args, argv=arguments)
    if args.command == "envoy-config":
        from epp.gateway import cli as gateway_cli

        return gateway_cli.run(args)
    if args.command == "demo":
        from epp import demo

        return demo.run(args)
    if args.command == "sim":
        from epp.sim import cli as sim_cli

        return sim_cli.run(args)
    if args.command == "sidecar":
        from epp.sidecar import cli as sidecar_cli

        return sidecar_cli.run(args, arguments[1:])
    if args.command == "bench" and args.bench == "pd":
        from epp.bench import pd as bench_pd

        return bench_pd.run(args)
    if args.command == "bench" and args.bench == "fleet":
        from epp.bench import fleet as bench_fleet

        return bench_fleet.run(args)
    if args.command == "bench" and args.bench == "overhead":
        from epp.bench import overhead

        return overhead.run(args)
    if args.command == "bench":
        from epp.bench import cli as bench_cli

        return bench_cli.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
