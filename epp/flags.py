"""`epp serve`'s flags, GIE's EPP flags among them, and the argparse types every subcommand uses.

Flag names and defaults follow GIE's EPP (v1.0-v1.5, the last GIE release with its EPP) where it
has them (--grpc-port 9002, --grpc-health-port 9003, --metrics-port 9090, --config-file/
--config-text, --secure-serving, --cert-path, --refresh-metrics-interval,
--metrics-staleness-threshold, --disable-endpoint-subset-filter, --pool-*, --endpoint-*), so a GIE
deployment's arguments carry over. GIE's other flags (-v, --zap-*, --tracing,
--ha-enable-leader-election, ...) are accepted too: each does what GIE's does, or is a clear
startup error where epp cannot do it yet, or is logged once as having no effect in epp
(docs/kubernetes.md, "GIE flags"). Booleans take Go's forms: `--flag`, `--flag=false`.

This module imports nothing of epp's but units, so every subcommand's module can use its types
without importing `epp.cli` (which imports them all).
"""

from __future__ import annotations

import argparse
import math
import re

from epp.kvcache.access import AccessPolicy
from epp.units import parse_duration

KV_EVENTS_PORT_DEFAULT = 5557
KV_EVENTS_BIND_DEFAULT = "tcp://*:5557"  # vLLM's own default endpoint, seen from the other side


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


def go_bool(g: argparse._ArgumentGroup, name: str, *, default: bool | None, help: str) -> None:
    """A boolean flag in Go's forms, as GIE's binary takes them: `--name`, `--name=true|false`."""
    g.add_argument(f"--{name}", type=boolean, nargs="?", const=True, default=default, help=help)


def byte_size(text: str) -> int:
    match = re.match(r"^(\d+)\s*([kKmMgG]i?[bB]?)?$", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 16Mi, 1048576)")
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]


def kv_access(text: str) -> AccessPolicy:
    try:
        return AccessPolicy.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def model_length(text: str) -> tuple[str, int]:
    """`--max-model-len` values: `MODEL=N` for one model, `N` for every model (model "*")."""
    model, sep, number = text.rpartition("=")
    if sep and not model:
        raise argparse.ArgumentTypeError(f"the model name before '=' is empty: {text!r}")
    return (model if sep else "*", positive_int(number))


def workers_count(text: str) -> int:
    """`--workers`: N >= 1, or `auto`/0 (0 stands for auto)."""
    if text.strip().lower() == "auto":
        return 0
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number of workers: {text!r} (N or auto)") from exc
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be auto, 0 (auto) or at least 1: {text!r}")
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


def ratio(text: str) -> float:
    """A share between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if value < 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _json_depth(text: str) -> int:
    value = positive_int(text)
    if value > 512:  # epp.api.limits.MAX_JSON_DEPTH_CAP: well below Python's recursion limit
        raise argparse.ArgumentTypeError(f"must be at most 512: {text!r}")
    return value


def add_request_limit_arguments(p: argparse.ArgumentParser) -> None:
    """epp's own bounds on one request's work and on what all streams hold (docs/security.md,
    "Request limits"; epp.api.limits, epp.extproc.limits). vLLM has no such limits: the defaults
    sit far above any legitimate request."""
    g = p.add_argument_group("request limits")
    g.add_argument(
        "--max-request-messages",
        type=positive_int,
        default=10_000,
        help="chat messages / Responses input items per request; more are 400 (default 10000)",
    )
    g.add_argument(
        "--max-request-content-parts",
        type=positive_int,
        default=20_000,
        help="content parts per request, all messages together (default 20000)",
    )
    g.add_argument(
        "--max-request-tools", type=positive_int, default=2_000, help="chat tools per request (default 2000)"
    )
    g.add_argument(
        "--max-request-json-depth",
        type=_json_depth,
        default=64,
        help="nesting of arrays and objects in a body, at most 512 (default 64)",
    )
    g.add_argument(
        "--max-buffered-body-bytes",
        type=byte_size,
        default=1 << 30,
        help="request-body bytes held across all requests; past it 503 (default 1Gi)",
    )
    g.add_argument(
        "--max-concurrent-streams",
        type=positive_int,
        default=10_000,
        help="requests in progress at once; more are answered 503 (default 10000)",
    )
    g.add_argument(
        "--request-body-timeout",
        type=duration,
        default=60.0,
        help="from the request headers to the body's end; later 408 (default 60s, 0: none)",
    )


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ports")
    g.add_argument("--grpc-port", type=int, default=9002, help="ext-proc gRPC port (default 9002)")
    g.add_argument("--grpc-health-port", type=int, default=9003, help="gRPC health port (default 9003)")
    g.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port (default 9090)")
    g.add_argument("--bind-address", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    go_bool(
        g,
        "enable-debug-api",
        default=False,
        help="serve /debug/score, /debug/tokenize and /debug/endpoints on the metrics port "
        "(default false: they answer 404; docs/security.md)",
    )
    go_bool(
        g,
        "secure-serving",
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
    add_request_limit_arguments(p)
    go_bool(
        g, "disable-endpoint-subset-filter", default=False, help="ignore the proxy's envoy.lb.subset_hint"
    )
    go_bool(
        g,
        "trust-model-name-rewrite-header",
        default=False,
        help="honour x-gateway-model-name-rewrite as GIE does; only where the gateway removes it "
        "from client requests (`epp envoy-config` does) (default false: ignored; docs/security.md)",
    )
    g.add_argument(
        "--response-sample-ratio",
        type=ratio,
        default=DEFAULT_RESPONSE_SAMPLE_RATIO,
        help="where the gateway allows a mode override (`epp envoy-config`'s default): the share "
        "of requests whose response body still streams through epp for token usage, TTFT and "
        "cached-token metrics; the others skip it (default 0.01; 1 reads every response). "
        "Requests whose model name is rewritten back always pass",
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
        default=KV_EVENTS_PORT_DEFAULT,
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
        default=KV_EVENTS_BIND_DEFAULT,
        help="bind mode: where to listen for publishers (vLLM's endpoint tcp://<epp>:5557, "
        "topic kv@<ip>:<port>@<model>) (default tcp://*:5557)",
    )
    g.add_argument(
        "--kv-events-allow",
        type=kv_access,
        default=kv_access("pool"),
        metavar="pool|any|[pool,]CIDR,...",
        help="bind mode: who may publish. pool: only the pool's pods, each for its own topic; "
        "CIDRs admit those networks for any pod (a NAT or mesh range); any: no check "
        "(default pool; docs/security.md)",
    )
    g.add_argument(
        "--kv-events-max-message-bytes",
        type=byte_size,
        default=16 << 20,
        help="larger KV-event frames close the sender's connection (default 16Mi)",
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
    g.add_argument(
        "--max-model-len",
        action="append",
        type=model_length,
        default=[],
        metavar="[MODEL=]N",
        help="context length vLLM enforces for MODEL (or, without MODEL=, for every model); "
        "repeatable. Requests vLLM would refuse for it get vLLM's 400 from epp. Default: what the "
        "pods list on /v1/models, else the tokenizer config's model_max_length",
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

    g = p.add_argument_group("processes")
    g.add_argument(
        "--workers",
        type=workers_count,
        default=0,
        metavar="N|auto",
        help="worker processes sharing the ext-proc port, each with its own copy of the KV index "
        "(default auto: the cores the pod may use, from its cgroup CPU limit and CPU affinity, "
        "at most 8; 1 runs one process as before)",
    )

    g = p.add_argument_group("shutdown")
    g.add_argument(
        "--drain-timeout",
        type=duration,
        default=DEFAULT_DRAIN_S,
        help="on SIGTERM: readiness goes NOT_SERVING, new ext-proc streams are refused, and "
        "in-flight ones (long streamed responses too) get this long to finish (default 130s, "
        "GIE's terminationGracePeriodSeconds; keep it below the pod's)",
    )

    g = p.add_argument_group("logging")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g.add_argument("--log-format", default="json", choices=["json", "text"])
    add_gie_arguments(p)


# Off-sample responses skip epp where Envoy allows it. A sampled stream costs epp ~40 ms of CPU
# when few others stream beside it (per-message costs without batching), an off-sample one ~1.3
# ms: 1 in 100 keeps a 200-token stream near 1.7 ms on average (BENCHMARKS.md 1e) and still feeds
# usage metrics and TTFT learning a few samples a second at production rates.
DEFAULT_RESPONSE_SAMPLE_RATIO = 0.01

# GIE's terminationGracePeriodSeconds (its chart's and epp's): how long in-flight streams may run
# after SIGTERM.
DEFAULT_DRAIN_S = 130.0

# GIE's logging verbosity levels (its logutil): V(2) is the default, V(4) debug, V(5) trace.
GIE_DEFAULT_VERBOSITY = 2


def zap_level(text: str) -> str:
    """controller-runtime's --zap-log-level: debug, info, error, panic, or an integer > 0."""
    value = text.strip().lower()
    if value in ("debug", "info", "error", "panic"):
        return value
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a zap level: {text!r} (debug, info, error, panic or N > 0)"
        ) from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"a numeric zap level must be > 0: {text!r}")
    return value


def verbosity_level(v: int) -> str:
    """A klog/logr verbosity (-v N) as a Python level: GIE logs most lines at V(2), debug at V(4)."""
    if v >= 4:
        return "debug"
    if v >= GIE_DEFAULT_VERBOSITY:
        return "info"
    return "warning"


def log_settings(args: argparse.Namespace) -> tuple[str, str]:
    """(level, format) for `epp serve` from epp's flags and GIE's (zap, -v), GIE's winning when given.

    Precedence as in GIE: an explicit --zap-log-level beats -v; --zap-devel (development mode)
    means console output at debug unless --zap-encoder or a level says otherwise.
    """
    fmt = args.log_format
    if args.zap_encoder is not None:
        fmt = "json" if args.zap_encoder == "json" else "text"
    elif args.zap_devel:
        fmt = "text"
    level = args.log_level
    if args.zap_log_level is not None:
        zap = args.zap_log_level
        level = {"panic": "critical"}.get(zap, zap)
        if zap.isdigit():
            level = verbosity_level(int(zap))
    elif args.v is not None:
        level = verbosity_level(args.v)
    elif args.zap_devel:
        level = "debug"
    return level, fmt


# GIE EPP flags that epp accepts without acting on them: flag -> why. Logged once at startup when
# given (docs/kubernetes.md has the same table).
GIE_NO_EFFECT: dict[str, str] = {
    "health-checking": "epp always serves gRPC health on the ext-proc port and on --grpc-health-port",
    "enable-pprof": "Go's pprof; epp is Python (the event-loop lag metric and py-spy cover profiling)",
    "refresh-prometheus-metrics-interval": "epp computes its pool gauges when /metrics is scraped",
}

# GIE's deprecated metric-name flags (v1.0-v1.4; v1.5 refuses them): epp reads vLLM's metrics,
# so vLLM's names, GIE's defaults, are accepted and anything else is a startup error.
GIE_METRIC_FLAGS: dict[str, str] = {
    "total-queued-requests-metric": "vllm:num_requests_waiting",
    "total-running-requests-metric": "vllm:num_requests_running",
    "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
    "lora-info-metric": "vllm:lora_requests_info",
    "cache-info-metric": "vllm:cache_config_info",
}


def _optional_bool(g: argparse._ArgumentGroup, name: str, text: str) -> None:
    # default None: "not given", so startup can tell GIE's defaults from what the user asked for.
    go_bool(g, name, default=None, help=text)


def add_gie_arguments(p: argparse.ArgumentParser) -> None:
    """The GIE EPP flags (v1.0-v1.5) that are not epp flags of the same name already."""
    g = p.add_argument_group(
        "GIE EPP compatibility (docs/kubernetes.md, 'GIE flags', says what each does in epp)"
    )
    g.add_argument(
        "-v",
        "--v",
        type=int,
        default=None,
        metavar="N",
        help="GIE/klog verbosity: 0-1 warnings and errors, 2-3 info (GIE's default 2), 4+ debug",
    )
    g.add_argument(
        "--zap-encoder",
        choices=["json", "console"],
        default=None,
        help="json: one JSON object per line; console: plain text (overrides --log-format)",
    )
    g.add_argument(
        "--zap-log-level",
        type=zap_level,
        default=None,
        help="debug, info, error, panic, or a verbosity N > 0 as for -v (overrides -v and --log-level)",
    )
    _optional_bool(g, "zap-devel", "development logging: console output at debug level")
    g.add_argument(
        "--zap-stacktrace-level",
        choices=["info", "error", "panic"],
        default=None,
        help="log lines at this level or above carry the caller's stack (default: none; "
        "a logged exception always carries its traceback)",
    )
    g.add_argument(
        "--zap-time-encoding",
        choices=["epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano"],
        default=None,
        help="the log timestamps' encoding, as zap's (default: RFC 3339 with milliseconds, UTC)",
    )
    _optional_bool(
        g,
        "ha-enable-leader-election",
        "active-passive HA as GIE's: replicas campaign for the pool's Lease; only the leader is "
        "ready (gRPC health readiness, ext-proc); liveness stays SERVING",
    )
    g.add_argument(
        "--ha-lease-duration",
        type=duration,
        default=15.0,
        help="epp: how long a leader's Lease holds without renewal (default 15s, controller-runtime's)",
    )
    g.add_argument(
        "--ha-renew-deadline",
        type=duration,
        default=10.0,
        help="epp: a leader that cannot renew for this long stops leading (default 10s)",
    )
    g.add_argument(
        "--ha-retry-period",
        type=duration,
        default=2.0,
        help="epp: how often candidates try and the leader renews (default 2s)",
    )
    _optional_bool(
        g,
        "tracing",
        "OpenTelemetry: a span per request, configured by the OTEL_* environment as GIE's "
        "(needs epp[tracing]; GIE's default is true, epp's off)",
    )
    _optional_bool(g, "health-checking", "no effect: epp always serves health")
    _optional_bool(g, "enable-pprof", "no effect (Go pprof)")
    _optional_bool(
        g,
        "enable-cert-reload",
        "serve a renewed tls.crt/tls.key from --cert-path from the next connection on",
    )
    _optional_bool(
        g,
        "metrics-endpoint-auth",
        "Kubernetes authn/authz (TokenReview, SubjectAccessReview) on the metrics port, as GIE's; "
        "epp's default is off (GIE's is on; its chart passes false unless its auth is enabled)",
    )
    g.add_argument("--refresh-prometheus-metrics-interval", type=duration, default=None, help="no effect")
    g.add_argument(
        "--model-server-metrics-scheme",
        choices=["http", "https"],
        default="http",
        help="scheme of the model servers' metrics (and model-card) requests (default http)",
    )
    g.add_argument(
        "--model-server-metrics-path",
        default="/metrics",
        help="path of the model servers' metrics (default /metrics)",
    )
    g.add_argument(
        "--model-server-metrics-port",
        type=int,
        default=0,
        help="port to scrape metrics on, for endpoints whose entry names no metricsPort "
        "(default 0: the endpoint's target port)",
    )
    _optional_bool(
        g,
        "model-server-metrics-https-insecure-skip-verify",
        "with https, accept any model-server certificate (GIE's default: true)",
    )
    for name, default in GIE_METRIC_FLAGS.items():
        g.add_argument(f"--{name}", default=None, help=f"only vLLM's {default} is accepted")


def gie_flag_problems(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(errors, notes) for the GIE flags given: what epp cannot do, and what it accepts but ignores."""
    errors: list[str] = []
    notes: list[str] = []
    if args.ha_enable_leader_election and not (
        args.ha_lease_duration > args.ha_renew_deadline > args.ha_retry_period > 0
    ):
        errors.append(
            "--ha-lease-duration > --ha-renew-deadline > --ha-retry-period > 0 is needed, got "
            f"{args.ha_lease_duration:g}s, {args.ha_renew_deadline:g}s, {args.ha_retry_period:g}s"
        )
    if args.enable_cert_reload and not args.cert_path:
        errors.append("--enable-cert-reload needs --cert-path (a self-signed certificate never changes)")
    if not 0 <= args.model_server_metrics_port <= 65535:
        errors.append(f"--model-server-metrics-port={args.model_server_metrics_port}: not a port")
    for name, default in GIE_METRIC_FLAGS.items():
        value = getattr(args, name.replace("-", "_"))
        if value is not None and value.strip('"') != default:
            errors.append(f"--{name}={value}: epp reads vLLM's metrics; only {default} is accepted")
        elif value is not None:
            notes.append(f"--{name}: vLLM's name, which epp reads anyway")
    for name, why in GIE_NO_EFFECT.items():
        if getattr(args, name.replace("-", "_")) is not None:
            notes.append(f"--{name} has no effect in epp: {why}")
    return errors, notes


def normalize_go_flags(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """Go's flag package (GIE's EPP up to v1.2) also takes long flags with one dash: -grpc-port=9002."""
    long_options = {
        option
        for action in parser._actions  # argparse has no public listing of option strings
        for option in action.option_strings
        if option.startswith("--")
    }
    out = []
    for arg in argv:
        if arg.startswith("-") and not arg.startswith("--") and f"-{arg.split('=', 1)[0]}" in long_options:
            arg = f"-{arg}"
        out.append(arg)
    return out
