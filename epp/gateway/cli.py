"""`epp envoy-config`: print a complete Envoy 1.40 bootstrap that fronts `epp serve`.

The config is `epp.gateway.envoy.gateway_config` for the flags given, the one epp's end-to-end
tests, demo and benchmarks run. Its defaults pair with `epp serve`'s: TLS to the ext-proc port
(`--secure-serving`, true as in `epp serve` and GIE, without certificate verification, since
epp's default certificate is self-signed), gRPC health checks on the ext-proc port (so an epp
that drains or loses its pool stops getting new streams), epp's mode override (request body
BUFFERED, response body STREAMED, `allow_mode_override`: epp stops the response body of requests
outside its sample; `--mode-override=false` gives GIE's full-duplex streamed bodies), and
the ORIGINAL_DST upstream on `x-gateway-destination-endpoint`. Pass the same `--secure-serving`
value to both. Client-sent control headers (`x-gateway-destination-endpoint`, the model-name
rewrite, ...) are removed before Envoy routes (`--client-control-header` keeps one), and the
upstream never connects to Envoy's own admin port (docs/security.md).

    epp envoy-config --epp epp.llm.svc.cluster.local:9002 > envoy.yaml
    envoy -c envoy.yaml
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from epp import flags
from epp.gateway import envoy


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("epp (the ext-proc server)")
    g.add_argument(
        "--epp",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="epp's ext-proc address; repeatable (Envoy spreads streams over them); a DNS name "
        "such as a Kubernetes Service is resolved by Envoy (default 127.0.0.1:9002)",
    )
    flags.go_bool(
        g,
        "secure-serving",
        default=True,
        help="TLS to epp, as `epp serve --secure-serving` (default true, as epp's); "
        "--secure-serving=false when epp serves plaintext",
    )
    g.add_argument("--epp-sni", default="", help="TLS server name sent to epp (default: none)")
    flags.go_bool(
        g,
        "epp-health-check",
        default=True,
        help="gRPC health-check epp's ext-proc port, so a draining epp gets no new streams (default true)",
    )
    g.add_argument(
        "--epp-retries",
        type=int,
        default=10,
        help="times a request's ext-proc stream is tried again when epp cannot be reached (a "
        "restart): with back-off from 0.25 s to 2 s, ~8 s in all on average (default 10, 0: none)",
    )
    flags.go_bool(
        g,
        "failure-mode-allow",
        default=False,
        help="route without epp when it cannot be reached (GIE's FailOpen): with --pods-mode "
        "override-host, to the less loaded of two listed pods (with original-dst there is no "
        "pod to go to: 503). Needs a BUFFERED request body (the mode override's). Default false",
    )
    g.add_argument(
        "--client-control-header",
        action="append",
        default=[],
        choices=envoy.CONTROL_HEADERS,
        metavar="NAME",
        help="a control header clients may send (a trusted proxy in front sets it), e.g. "
        f"{envoy.MODEL_REWRITE_HEADER}; repeatable. Default: all of {', '.join(envoy.CONTROL_HEADERS)} "
        "are removed from client requests",
    )
    g.add_argument(
        "--body-mode",
        choices=[str(m) for m in envoy.REQUEST_BODY_MODES],
        default=None,
        help="request body mode (default BUFFERED with --mode-override, else FULL_DUPLEX_STREAMED, GIE's)",
    )
    flags.go_bool(
        g,
        "mode-override",
        default=True,
        help="let epp stop the response body of requests outside its sample "
        "(`epp serve --response-sample-ratio`): request body BUFFERED, response body STREAMED, "
        "allow_mode_override; --mode-override=false for GIE's full-duplex config (default true)",
    )
    flags.go_bool(
        g,
        "process-responses",
        default=True,
        help="send responses through epp too (token usage, TTFT, in-flight accounting; default true)",
    )

    g = p.add_argument_group("model servers")
    g.add_argument(
        "--pods-mode",
        choices=[str(envoy.PodsMode.ORIGINAL_DST), str(envoy.PodsMode.OVERRIDE_HOST)],
        default=str(envoy.PodsMode.ORIGINAL_DST),
        help="original-dst: connect to the ip:port epp names (no list of pods needed; default); "
        "override-host: a fixed list of pods (--pod) and retries down epp's fallback list",
    )
    g.add_argument(
        "--pod",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a model server, for --pods-mode override-host; repeatable",
    )
    g.add_argument(
        "--num-retries",
        type=int,
        default=2,
        help="override-host: attempts down epp's endpoint list (default 2)",
    )
    g.add_argument(
        "--route-timeout",
        type=flags.duration,
        default=300.0,
        help="longest request, streamed responses included (default 300s)",
    )

    g = p.add_argument_group("Envoy")
    g.add_argument("--listen-address", default="0.0.0.0", help="default 0.0.0.0")
    g.add_argument("--listen-port", type=flags.port_number, default=8081, help="default 8081")
    g.add_argument("--admin-address", default="127.0.0.1", help="default 127.0.0.1")
    g.add_argument("--admin-port", type=flags.port_number, default=19000, help="default 19000")
    g.add_argument("--access-log", default="", metavar="PATH", help="an access log file (default: none)")
    g.add_argument(
        "--max-heap",
        type=flags.byte_size,
        default=768 << 20,
        help="Envoy's heap bound (overload manager): streams holding large unfinished bodies are "
        "reset and new requests answered 503 before it; ~3/4 of Envoy's memory limit "
        "(default 768Mi, 0: none)",
    )
    g.add_argument("-o", "--output", default="-", help="file to write (default -: stdout)")
    g.add_argument(
        "--validate",
        action="store_true",
        help="also load the config in the Envoy binary (`envoy --mode validate`) and fail if it refuses",
    )


def params_from(args: argparse.Namespace) -> envoy.GatewayParams:
    """The GatewayParams the flags describe; ValueError on a bad combination."""
    override = args.mode_override and args.process_responses
    if override and args.body_mode not in (None, str(envoy.BodyMode.BUFFERED)):
        raise ValueError(f"--body-mode {args.body_mode} needs --mode-override=false")
    default_mode = envoy.BodyMode.BUFFERED if override else envoy.BodyMode.FULL_DUPLEX_STREAMED
    params = envoy.GatewayParams(
        listen_port=args.listen_port,
        admin_port=args.admin_port,
        listen_address=args.listen_address,
        admin_address=args.admin_address,
        epp_addresses=tuple(args.epp or ["127.0.0.1:9002"]),
        pods_mode=envoy.PodsMode(args.pods_mode),
        pod_endpoints=tuple(args.pod),
        body_mode=envoy.BodyMode(args.body_mode or default_mode),
        process_responses=args.process_responses,
        epp_tls=args.secure_serving,
        epp_sni=args.epp_sni,
        epp_health_check=args.epp_health_check,
        failure_mode_allow=args.failure_mode_allow,
        client_control_headers=tuple(args.client_control_header),
        route_timeout=args.route_timeout,
        num_retries=args.num_retries,
        access_log_path=args.access_log,
        epp_retries=args.epp_retries,
        max_heap_bytes=args.max_heap,
    )
    return envoy.override_params(params) if override else params


def run(args: argparse.Namespace) -> int:
    try:
        params = params_from(args)
    except ValueError as exc:
        print(f"epp envoy-config: {exc}", file=sys.stderr)
        return 2
    if args.pod and params.pods_mode is envoy.PodsMode.ORIGINAL_DST:
        print("epp envoy-config: --pod needs --pods-mode override-host", file=sys.stderr)
        return 2
    text = envoy.dump_config(envoy.gateway_config(params))
    if args.validate:
        try:
            with tempfile.TemporaryDirectory(prefix="epp-envoy-") as tmp:
                path = Path(tmp) / "envoy.yaml"
                path.write_text(text, encoding="utf-8")
                result = envoy.validate_config(path)
        except FileNotFoundError as exc:
            print(f"epp envoy-config: --validate: {exc}", file=sys.stderr)
            return 2
        if result.returncode != 0:
            print(
                f"epp envoy-config: Envoy refused the config:\n{result.stderr}{result.stdout}",
                file=sys.stderr,
            )
            return 1
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
    return 0
