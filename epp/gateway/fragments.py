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


def overload_manager(max_connections: int) -> dict[str, Any]:
    # Configuring the limit silences Envoy's start-up warning about unlimited connections.
    return {
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


def admin_config(address: str, port: int) -> dict[str, Any]:
    return {"address": socket_address(address, port)}
