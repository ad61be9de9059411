"""GIE EPP's flags (v1.0-v1.5) that are not epp flags of the same name: logging (-v, --zap-*),
leader election, tracing, metrics auth, model-server metrics, and the ones epp accepts without acting
on them; what each does in epp is in docs/kubernetes.md#gie-flags.
"""

from __future__ import annotations

import argparse

from epp.datastore.engines import MetricSpec, MetricSpecError, parse_spec
from epp.flags.types import duration, go_bool, verbosity_level, zap_level


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

# GIE's metric-name flags (v1.0-v1.4 read them; llm-d v0.10 accepts them deprecated, with no
# effect, and names metrics in core-metrics-extractor's engineConfigs instead). epp reads them as
# GIE did: each names the metric (a PromQL selector, `name{label="value"}`) of one quantity for
# every endpoint of the default engine: flag -> (EngineMapping field, GIE's default).
GIE_METRIC_FLAGS: dict[str, tuple[str, str]] = {
    "total-queued-requests-metric": ("queued", "vllm:num_requests_waiting"),
    "total-running-requests-metric": ("running", "vllm:num_requests_running"),
    "kv-cache-usage-percentage-metric": ("kv_usage", "vllm:kv_cache_usage_perc"),
    "lora-info-metric": ("lora", "vllm:lora_requests_info"),
    "cache-info-metric": ("cache_info", "vllm:cache_config_info"),
}


def metric_flag_specs(args: argparse.Namespace) -> dict[str, tuple[str, MetricSpec | None]]:
    """The metric-name flags given, other than GIE's defaults: flag -> (field, spec; None: the
    flag's empty value, which reads no metric). Call after `gie_flag_problems` found none."""
    out: dict[str, tuple[str, MetricSpec | None]] = {}
    for name, (field, default) in GIE_METRIC_FLAGS.items():
        value = getattr(args, name.replace("-", "_"))
        if value is not None and value.strip('"') != default:
            out[name] = (field, parse_spec(value.strip('"')))
    return out


def _optional_bool(g: argparse._ArgumentGroup, name: str, text: str) -> None:
    # default None: "not given", so startup can tell GIE's defaults from what the user asked for.
    go_bool(g, name, default=None, help=text)


def add_gie_arguments(p: argparse.ArgumentParser) -> None:
    """The GIE EPP flags (v1.0-v1.5) that are not epp flags of the same name already."""
    g = p.add_argument_group(
        "GIE EPP compatibility (docs/kubernetes.md#gie-flags says what each does in epp)"
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
        "Kubernetes authn/authz (TokenReview, SubjectAccessReview) on the metrics port, as GIE's "
        "and llm-d's; default: on when the endpoints come from Kubernetes (--pool-name, "
        "--endpoint-selector), as in their charts; off with --endpoints/--endpoints-file",
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
    for name, (_, default) in GIE_METRIC_FLAGS.items():
        g.add_argument(
            f"--{name}",
            default=None,
            help=f"the metric (PromQL selector) read for every endpoint of the default engine, as "
            f"GIE v1.4 (default {default}; llm-d v0.10 ignores it)",
        )


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
    for name, (_, default) in GIE_METRIC_FLAGS.items():
        value = getattr(args, name.replace("-", "_"))
        if value is None:
            continue
        try:
            parse_spec(value.strip('"'))
        except MetricSpecError as err:
            errors.append(f"--{name}={value}: {err}")
            continue
        if value.strip('"') == default:
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
