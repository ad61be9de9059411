"""`epp serve --bind-address`: IPv6 literals on every port (ext-proc, gRPC health, metrics), and a
wildcard that listens on IPv4 and IPv6 alike, as Go's `:port` does for GIE's and llm-d's EPP."""

from __future__ import annotations

import argparse
import urllib.request
from pathlib import Path

import pytest

from epp.flags import types
from epp.gateway.processes import EppServer, grpc_health_status, hostport


def _metrics(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{hostport(host, port)}/metrics", timeout=5) as resp:
        text: str = resp.read().decode()
    return text


@pytest.mark.parametrize(
    ("text", "expected"),
    [("::1", "::1"), ("[::1]", "::1"), ("::", "::"), ("0.0.0.0", "0.0.0.0"), ("localhost", "localhost")],
)
def test_bind_address_values(text: str, expected: str) -> None:
    assert types.bind_address(text) == expected


@pytest.mark.parametrize("text", ["", "[]", "::g", "a b", "1.2.3.4:9090"])
def test_bind_address_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        types.bind_address(text)


def test_every_port_listens_on_an_ipv6_literal(tmp_path: Path) -> None:
    epp = EppServer(tmp_path / "epp.log", endpoints=["127.0.0.1:1"], host="::1")
    try:
        epp.start(wait="listening")
        assert "inference_pool_ready_pods" in _metrics("::1", epp.metrics_port)
        # The ext-proc port serves gRPC health too (Envoy's health check).
        assert grpc_health_status(epp.grpc_port, host="::1") != "UNREACHABLE"
        assert grpc_health_status(epp.grpc_port, host="127.0.0.1") == "UNREACHABLE"
    finally:
        epp.stop()


@pytest.mark.parametrize("wildcard", ["::", "0.0.0.0"])
def test_a_wildcard_listens_on_ipv4_and_ipv6(tmp_path: Path, wildcard: str) -> None:
    epp = EppServer(tmp_path / "epp.log", endpoints=["127.0.0.1:1"], host="127.0.0.1")
    epp.process.argv[epp.process.argv.index("--bind-address") + 1] = wildcard
    try:
        epp.start(wait="listening")
        for host in ("127.0.0.1", "::1"):
            assert "inference_pool_ready_pods" in _metrics(host, epp.metrics_port), host
            assert grpc_health_status(epp.health_port, host=host) != "UNREACHABLE", host
            assert grpc_health_status(epp.grpc_port, host=host) != "UNREACHABLE", host
    finally:
        epp.stop()
