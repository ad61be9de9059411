"""Closed doors (docs/security.md): the HCM's early removal of the control headers clients may not
send, and the RBAC filter that keeps ORIGINAL_DST off Envoy's own admin and listener ports."""

from __future__ import annotations

from typing import Any

from epp.gateway.fragments import TYPE_URL
from epp.gateway.params import CONTROL_HEADERS, DESTINATION_HEADER, GatewayParams


def strip_control_headers(params: GatewayParams) -> list[dict[str, Any]]:
    """The HCM's early header mutation: runs before route selection and every HTTP filter."""
    kept = {h.lower() for h in params.client_control_headers}
    removed = [h for h in CONTROL_HEADERS if h not in kept]
    if not removed:
        return []
    return [
        {
            "name": "envoy.http.early_header_mutation.header_mutation",
            "typed_config": {
                "@type": TYPE_URL
                + "envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
                "mutations": [{"remove": h} for h in removed],
            },
        }
    ]


def destination_guard(params: GatewayParams) -> dict[str, Any]:
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
            "@type": TYPE_URL + "envoy.extensions.filters.http.rbac.v3.RBAC",
            "rules": {
                "action": "DENY",
                "policies": {"envoy-itself": {"permissions": permissions, "principals": [{"any": True}]}},
            },
        },
    }
