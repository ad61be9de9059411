"""`epp serve`'s flags, GIE's EPP flags among them.

Flag names and defaults follow GIE's EPP (v1.0-v1.5, the last GIE release with its EPP) where it
has them (--grpc-port 9002, --grpc-health-port 9003, --metrics-port 9090, --config-file/
--config-text, --secure-serving, --cert-path, --refresh-metrics-interval,
--metrics-staleness-threshold, --disable-endpoint-subset-filter, --pool-*, --endpoint-*), so a GIE
deployment's arguments carry over. GIE's other flags (-v, --zap-*, --tracing,
--ha-enable-leader-election, ...) are accepted too: each does what GIE's does, or is a clear
startup error where epp cannot do it yet, or is logged once as having no effect in epp
(docs/kubernetes.md#gie-flags). Booleans take Go's forms: `--flag`, `--flag=false`.

The request-limit flags are in epp.flags.request_limits, the KV-event flags in
epp.flags.kv_events, GIE's flags that epp has no own name for in epp.flags.compat, llm-d Router's
ext-proc flags (message sizes, stream metrics, endpoint scores, TLS) in epp.flags.extproc.
"""

from __future__ import annotations

import argparse
from typing import TypedDict

from epp.flags.compat import add_gie_arguments
from epp.flags.extproc import add_extproc_arguments
from epp.flags.kv_events import add_kv_events_arguments
from epp.flags.metrics_port import add_metrics_port_arguments
from epp.flags.plugins import add_plugin_arguments
from epp.flags.request_limits import add_request_limit_arguments
from epp.flags.types import (
    bind_address,
    byte_size,
    duration,
    go_bool,
    model_length,
    positive_int,
    ratio,
    workers_count,
)

# epp's scrape interval for an endpoint whose load is all epp's own (epp.datastore.pacing); fast
# mode's `epp bench --booked-scrape-interval` models the same default.
BOOKED_METRICS_INTERVAL_S = 0.2


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ports")
    g.add_argument("--grpc-port", type=int, default=9002, help="ext-proc gRPC port (default 9002)")
    g.add_argument("--grpc-health-port", type=int, default=9003, help="gRPC health port (default 9003)")
    g.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port (default 9090)")
    g.add_argument(
        "--bind-address",
        type=bind_address,
        default="0.0.0.0",
        help="address every port listens on; 0.0.0.0 and :: both mean every address, IPv4 and "
        "IPv6 where the host has it (default 0.0.0.0)",
    )
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
    add_extproc_arguments(p)
    add_metrics_port_arguments(p)

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
    add_plugin_arguments(p)
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
    g.add_argument(
        "--response-sample-min-interval",
        type=duration,
        default=DEFAULT_RESPONSE_SAMPLE_MIN_INTERVAL_S,
        help="with --response-sample-ratio below 1: an endpoint with no sampled response for this "
        "long gets its next request sampled, so the rates the latency scorers learn per endpoint "
        "keep coming, unless its /metrics has vLLM's latency histograms (time to first token: "
        "they learn from those; learnFromMetrics: false then wants a ratio of 1) (default 2s; at "
        "most endpoints/interval extra sampled streams a second per worker; 0: the ratio alone)",
    )
    g.add_argument(
        "--response-sample-settled-interval",
        type=duration,
        default=DEFAULT_RESPONSE_SAMPLE_SETTLED_INTERVAL_S,
        help="the floor's interval for an endpoint once it has had 32 sampled responses, by when "
        "the latency scorers have learned its rates and later samples only track drift (default "
        "20s; not below --response-sample-min-interval, which it then replaces)",
    )
    g.add_argument(
        "--response-sample-headers",
        choices=("all", "sampled"),
        default="all",
        help="all (default): epp reads every response's headers (the model server's status for "
        "error metrics, the served endpoint, response-header plugins) and stops only off-sample "
        "bodies; sampled: an off-sample request skips epp from its request headers on, one "
        "ext-proc round trip less (5-10%% of epp's and Envoy's CPU per request on the peers' "
        "shared-prefix load); its status is then "
        "unseen, so model-server errors are counted from sampled responses only "
        "(docs/metrics.md#off-sample-requests)",
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

    add_kv_events_arguments(p)

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
        "--idle-metrics-interval",
        type=duration,
        default=0.5,
        help="epp's: scrape interval of an endpoint whose last scrape showed nothing running or "
        "waiting and on which epp booked nothing since; a booking brings it back to "
        "--refresh-metrics-interval at once. At most half of --metrics-staleness-threshold; "
        "0 scrapes idle endpoints like the others (default 500ms)",
    )
    g.add_argument(
        "--booked-metrics-interval",
        type=duration,
        default=BOOKED_METRICS_INTERVAL_S,
        help="epp's: scrape interval of an endpoint whose last scrape showed nothing waiting and "
        "no more requests running than epp has in flight there (all its load is epp's own, which "
        "epp counts between scrapes); each booking there brings its next scrape to about half of "
        "--refresh-metrics-interval later, and a queue or load epp did not book brings it back "
        "to --refresh-metrics-interval. At most half of --metrics-staleness-threshold; 0 scrapes "
        "such endpoints like the others (default 200ms)",
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

    g.add_argument(
        "--event-loop-lag-interval",
        type=duration,
        default=0.25,
        help="how often epp times its own event loop (epp_event_loop_lag_seconds); a benchmark "
        "of the loop's tail sets 5ms (default 250ms)",
    )

    g = p.add_argument_group("shutdown")
    g.add_argument(
        "--drain-delay",
        type=duration,
        default=DEFAULT_DRAIN_DELAY_S,
        help="on SIGTERM: readiness goes NOT_SERVING at once but new ext-proc streams are still "
        "served this long, so the gateway's health check moves them elsewhere first; then "
        "--drain-timeout begins (default 5s: `epp envoy-config`'s check notices in 2s; SIGINT "
        "skips it; 0 refuses new streams at once)",
    )
    g.add_argument(
        "--drain-timeout",
        type=duration,
        default=DEFAULT_DRAIN_S,
        help="after --drain-delay: new ext-proc streams are refused, and in-flight ones (long "
        "streamed responses too) get this long to finish (default 130s, GIE's "
        "terminationGracePeriodSeconds; keep delay + timeout below the pod's)",
    )

    g = p.add_argument_group("logging")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g.add_argument("--log-format", default="json", choices=["json", "text"])
    add_gie_arguments(p)


RESPONSE_SAMPLE_FLAGS = (
    "--response-sample-ratio",
    "--response-sample-min-interval",
    "--response-sample-settled-interval",
)


class ResponseSampling(TypedDict):
    """The Director's response-sampling settings (`DirectorSettings`' fields of these names)."""

    response_sample_ratio: float
    response_sample_min_interval: float
    response_sample_settled_interval: float
    response_sample_headers: str


def response_sampling(args: argparse.Namespace) -> ResponseSampling:
    """The Director's response-sampling settings from the `--response-sample-*` flags (`epp
    serve`, and `epp bench`'s fast mode behind epp's own gateway config)."""
    return {
        "response_sample_ratio": args.response_sample_ratio,
        "response_sample_min_interval": args.response_sample_min_interval,
        "response_sample_settled_interval": max(
            args.response_sample_settled_interval, args.response_sample_min_interval
        ),
        "response_sample_headers": args.response_sample_headers,
    }


# Off-sample responses skip epp where Envoy allows it. A sampled stream costs epp ~40 ms of CPU
# when few others stream beside it (per-message costs without batching), an off-sample one ~1.3
# ms: 1 in 100 keeps a 200-token stream near 1.7 ms on average
# (docs/bench/overhead.md#mode-override) and still feeds usage metrics and TTFT learning a few
# samples a second at production rates.
DEFAULT_RESPONSE_SAMPLE_RATIO = 0.01
# ...but the learned per-endpoint rates need samples from every endpoint, also quiet ones: one per
# endpoint every 2 s at least (sampling.py: the floor), where its page lacks vLLM's latency histograms
# (with them, the rates come from there). Bounded by endpoints / 2 s sampled streams a second per
# worker, each ~13-45 ms of CPU (docs/bench/overhead.md#streamed, #mode-override).
DEFAULT_RESPONSE_SAMPLE_MIN_INTERVAL_S = 2.0
# ...until an endpoint has had 32 (sampling.SETTLE_SAMPLES), then one every 20 s: the learners weigh
# a sample at their floor rate by then, and the 2 s floor was a third of epp's and Envoy's CPU per
# request on 8 pods at 20 req/s, ~2.5 cores at 100 busy pods
# (docs/bench/fleet-cost.md#sample-floor).
DEFAULT_RESPONSE_SAMPLE_SETTLED_INTERVAL_S = 20.0

# GIE's terminationGracePeriodSeconds (its chart's and epp's): how long in-flight streams may run
# after SIGTERM.
DEFAULT_DRAIN_S = 130.0
# After SIGTERM, new streams are still served this long (epp.drain): `epp envoy-config`'s health
# check on the ext-proc cluster (interval 1 s x unhealthy_threshold 2, epp.gateway.params) marks a
# NOT_SERVING epp unhealthy within ~2 s; 3 s more covers a check in flight, a loaded host and
# Kubernetes' endpoint removal (tests/gateway/test_envoy_config.py holds the two together).
DEFAULT_DRAIN_DELAY_S = 5.0
