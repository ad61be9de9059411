"""The gateway's two clusters: epp's ext-proc servers and the model servers ("pods", in one of the
three `PodsMode`s)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.gateway.fragments import TYPE_URL, duration, is_ip, load_assignment
from epp.gateway.params import (
    DESTINATION_HEADER,
    EXT_PROC_CLUSTER,
    EXT_PROC_SERVICE,
    LB_NAMESPACE,
    PODS_CLUSTER,
    SERVED_KEY,
    GatewayParams,
    PodsMode,
    split_host_port,
)


def static_cluster(name: str, addresses: Sequence[str], params: GatewayParams) -> dict[str, Any]:
    # STRICT_DNS lets a Kubernetes Service name stand in for the addresses; IPs stay STATIC.
    all_ips = all(is_ip(split_host_port(a)[0]) for a in addresses)
    limit = params.circuit_breaker_limit
    return {
        "name": name,
        "type": "STATIC" if all_ips else "STRICT_DNS",
        "connect_timeout": duration(params.connect_timeout),
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
        "load_assignment": load_assignment(name, addresses),
    }


def lb_metadata_key(key: str) -> dict[str, Any]:
    return {"key": LB_NAMESPACE, "path": [{"key": key}]}


def epp_http2(params: GatewayParams) -> dict[str, Any]:
    if params.epp_streams_per_connection <= 0:
        return {}
    return {"max_concurrent_streams": params.epp_streams_per_connection}


def ext_proc_cluster(params: GatewayParams) -> dict[str, Any]:
    cluster = static_cluster(EXT_PROC_CLUSTER, params.epp_addresses, params)
    cluster["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": TYPE_URL + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": epp_http2(params)},
        }
    }
    if params.epp_tls:
        # An empty validation context accepts any server certificate: epp's default cert is
        # self-signed, exactly as GIE's standalone Envoy talks to it.
        tls: dict[str, Any] = {
            "@type": TYPE_URL + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"validation_context": {}, "alpn_protocols": ["h2"]},
        }
        if params.epp_sni:
            tls["sni"] = params.epp_sni
        cluster["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": tls}
    if params.epp_health_check:
        cluster["health_checks"] = [
            {
                "timeout": duration(min(2.0, params.epp_health_check_interval * 2)),
                "interval": duration(params.epp_health_check_interval),
                # Envoy checks a cluster that has had no traffic yet only every 60 s by default:
                # a replica draining before the first request would go unnoticed that long.
                "no_traffic_interval": duration(params.epp_health_check_interval),
                "unhealthy_threshold": params.epp_health_check_unhealthy_threshold,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": EXT_PROC_SERVICE},
            }
        ]
    return cluster


def pods_cluster(params: GatewayParams) -> dict[str, Any]:
    if params.pods_mode is PodsMode.ORIGINAL_DST:
        lb_config: dict[str, Any] = {"use_http_header": not params.original_dst_use_metadata}
        if params.original_dst_use_metadata:
            lb_config["metadata_key"] = lb_metadata_key(DESTINATION_HEADER)
        else:
            lb_config["http_header_name"] = DESTINATION_HEADER
        limit = params.circuit_breaker_limit
        return {
            "name": PODS_CLUSTER,
            "type": "ORIGINAL_DST",
            "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": duration(params.connect_timeout),
            "cleanup_interval": "60s",
            "circuit_breakers": {
                "thresholds": [
                    {"max_connections": limit, "max_pending_requests": limit, "max_requests": limit}
                ]
            },
            "original_dst_lb_config": lb_config,
        }
    cluster = static_cluster(PODS_CLUSTER, params.pod_endpoints, params)
    if params.pods_mode is PodsMode.ROUND_ROBIN:
        cluster["lb_policy"] = "ROUND_ROBIN"
        return cluster
    # The fallback is what a request gets without epp's pick (failure_mode_allow with epp down):
    # the pod with the fewest requests of two drawn, as an LLM server's load varies per request.
    least_request = {
        "typed_extension_config": {
            "name": "envoy.load_balancing_policies.least_request",
            "typed_config": {
                "@type": TYPE_URL + "envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest"
            },
        }
    }
    cluster["load_balancing_policy"] = {
        "policies": [
            {
                "typed_extension_config": {
                    "name": "envoy.load_balancing_policies.override_host",
                    "typed_config": {
                        "@type": TYPE_URL
                        + "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                        # Metadata first: a client cannot forge it, while it can send the header.
                        "override_host_sources": [
                            {"metadata": lb_metadata_key(DESTINATION_HEADER)},
                            {"header": DESTINATION_HEADER},
                        ],
                        # Tells epp's response path which endpoint actually served (after retries).
                        "selected_host_key": lb_metadata_key(SERVED_KEY),
                        # Used only when epp named no host of this cluster, or the list is used up.
                        "fallback_policy": {"policies": [least_request]},
                    },
                }
            }
        ]
    }
    return cluster
