"""The generated gateway bounds how long a client may take to send its request (slowloris)."""

from __future__ import annotations

from typing import Any

from epp.gateway.envoy import GatewayParams, gateway_config


def _hcm(params: GatewayParams) -> dict[str, Any]:
    listener = gateway_config(params)["static_resources"]["listeners"][0]
    hcm: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm


def test_request_and_header_timeouts_are_set_by_default_and_can_be_turned_off() -> None:
    base = GatewayParams(listen_port=10000, admin_port=10001, epp_addresses=("127.0.0.1:9002",))
    hcm = _hcm(base)
    assert hcm["request_timeout"] == "60s"
    assert hcm["request_headers_timeout"] == "10s"
    off = GatewayParams(
        listen_port=10000,
        admin_port=10001,
        epp_addresses=("127.0.0.1:9002",),
        request_timeout=0,
        request_headers_timeout=0,
    )
    assert "request_timeout" not in _hcm(off) and "request_headers_timeout" not in _hcm(off)
