"""Envoy bootstrap fragments (as plain dicts) that more than one builder uses: type URLs, durations,
addresses, the admin block and the overload manager."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from epp.gateway.params import split_host_port

TYPE_URL = "type.googleapis.com/"
HCM_TYPE = TYPE_URL + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_DOWNSTREAM_CONNECTIONS = (
    "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
)
_FIXED_HEAP = "envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig"


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def duration(seconds: float) -> str:
    # Envoy's JSON mapping of google.protobuf.Duration: decimal seconds with an "s" suffix.
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def socket_address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def load_assignment(name: str, addresses: Sequence[str]) -> dict[str, Any]:
    endpoints = [{"endpoint": {"address": socket_address(*split_host_port(a))}} for a in addresses]
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]}


def overload_manager(max_connections: int, max_heap_bytes: int = 0) -> dict[str, Any]:
    """Envoy's overload manager: the downstream connection limit (configuring it also silences
    Envoy's start-up warning) and, with `max_heap_bytes`, a heap bound (`GatewayParams`): the
    streams buffering 1 MiB or more are reset from 80% of it (the largest first), new requests
    are answered 503 from 95%, and freed memory is returned to the system from 90%."""
    config: dict[str, Any] = {
        "resource_monitors": [
            {
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": TYPE_URL + _DOWNSTREAM_CONNECTIONS,
                    "max_active_downstream_connections": max_connections,
                },
            }
        ]
    }
    if not max_heap_bytes:
        return config
    heap = "envoy.resource_monitors.fixed_heap"
    config["refresh_interval"] = "0.25s"
    config["resource_monitors"].append(
        {
            "name": heap,
            "typed_config": {"@type": TYPE_URL + _FIXED_HEAP, "max_heap_size_bytes": max_heap_bytes},
        }
    )
    # Streams are tracked from 2^20 bytes buffered (request or response), so only large ones.
    config["buffer_factory_config"] = {"minimum_account_to_track_power_of_two": 20}
    config["actions"] = [
        {
            "name": "envoy.overload_actions.reset_high_memory_stream",
            "triggers": [{"name": heap, "scaled": {"scaling_threshold": 0.80, "saturation_threshold": 0.95}}],
        },
        {
            # HTTP/1 streams are not tracked for the above: an upload that stops arriving is
            # reset after a shorter idle time instead (the stream idle timeout, scaled down).
            "name": "envoy.overload_actions.reduce_timeouts",
            "triggers": [{"name": heap, "scaled": {"scaling_threshold": 0.80, "saturation_threshold": 0.95}}],
            "typed_config": {
                "@type": TYPE_URL + "envoy.config.overload.v3.ScaleTimersOverloadActionConfig",
                "timer_scale_factors": [
                    {"timer": "HTTP_DOWNSTREAM_STREAM_IDLE", "min_timeout": "1s"},
                    {"timer": "HTTP_DOWNSTREAM_CONNECTION_IDLE", "min_timeout": "1s"},
                ],
            },
        },
        {
            "name": "envoy.overload_actions.shrink_heap",
            "triggers": [{"name": heap, "threshold": {"value": 0.90}}],
        },
        {
            "name": "envoy.overload_actions.stop_accepting_requests",
            "triggers": [{"name": heap, "threshold": {"value": 0.95}}],
        },
    ]
    return config


def admin_config(address: str, port: int) -> dict[str, Any]:
    return {"address": socket_address(address, port)}
