"""llm-d Router v0.10's ext-proc flags, end to end: `epp serve` started with each, and its effect
read where a gateway would see it (the ext-proc answer, /metrics, the TLS handshake)."""

from __future__ import annotations

import re
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import msgspec
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.extproc import messages as m
from epp.gateway.processes import EppServer
from tests.extproc import helpers as h

ENDPOINTS = ["127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"]
CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: kv-cache-utilization-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: queue-scorer
        weight: 2
      - pluginRef: kv-cache-utilization-scorer
      - pluginRef: max-score-picker
"""
CHAT = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture
def epp_with(tmp_path: Path) -> Iterator[list[EppServer]]:
    started: list[EppServer] = []
    yield started
    for epp in started:
        epp.stop()


def start(started: list[EppServer], tmp_path: Path, *args: str, secure: bool = False) -> EppServer:
    epp = EppServer(
        tmp_path / f"epp{len(started)}.log",
        endpoints=ENDPOINTS,
        secure=secure,
        extra_args=["--config-text", CONFIG, *args],
    )
    started.append(epp)
    epp.start(wait="listening")
    return epp


def route(address: str, body: bytes = CHAT) -> list[pb.ProcessingResponse]:
    """One request through the ext-proc port as Envoy sends it (full duplex): the answers."""
    with grpc.insecure_channel(address) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process(
            iter([h.headers_msg(h.post_headers()), h.body_msg(body)]), timeout=10
        )
        return list(call)


def test_emit_endpoint_scores_puts_every_scored_endpoint_in_envoy_lb(
    tmp_path: Path, epp_with: list[EppServer]
) -> None:
    epp = start(epp_with, tmp_path, "--emit-endpoint-scores")
    # Nothing listens on the endpoints' port 1, so their scrapes fail and each is excluded in
    # turn; routing in between would score only those not yet excluded. Once all are, epp routes
    # degraded over every endpoint, which is the set this test checks.
    deadline = time.monotonic() + 20
    while not re.search(r"^inference_pool_ready_pods\{[^}]*\} 0\.0$", epp.metrics_text(), re.M):
        assert time.monotonic() < deadline, "the endpoints were never all excluded"
        time.sleep(0.05)
    first = route(epp.grpc_address)[0]
    lb = first.dynamic_metadata.fields[m.LB_NAMESPACE].struct_value.fields
    picked = lb[m.DESTINATION_HEADER].string_value
    scores = {k: v.number_value for k, v in lb[m.SCORES_KEY].struct_value.fields.items()}
    assert sorted(scores) == sorted(f"{e.split(':')[0]}:1" for e in ENDPOINTS)
    # Weighted sums, not normalised: queue (weight 2) and KV (weight 1) both 1.0 on idle pods.
    assert all(0.0 <= s <= 3.0 for s in scores.values()), scores
    assert scores[picked] == max(scores.values())

    plain = start(epp_with, tmp_path)  # without the flag: the destination alone, as before
    lb = route(plain.grpc_address)[0].dynamic_metadata.fields[m.LB_NAMESPACE].struct_value.fields
    assert m.SCORES_KEY not in lb and lb[m.DESTINATION_HEADER].string_value


def test_grpc_stream_metrics_count_streams_by_code(tmp_path: Path, epp_with: list[EppServer]) -> None:
    epp = start(epp_with, tmp_path, "--enable-grpc-stream-metrics")
    for _ in range(3):
        route(epp.grpc_address)
    text = epp.metrics_text()
    assert 'llm_d_epp_extproc_streams_total{code="OK"} 3.0' in text
    assert "llm_d_epp_extproc_stream_duration_seconds_count 3.0" in text
    assert "llm_d_epp_extproc_streams_inflight 0.0" in text
    plain = start(epp_with, tmp_path)
    route(plain.grpc_address)
    assert "llm_d_epp_extproc_streams" not in plain.metrics_text()  # llm-d: absent without the flag


def test_grpc_max_recv_msg_size_refuses_larger_messages(tmp_path: Path, epp_with: list[EppServer]) -> None:
    epp = start(epp_with, tmp_path, "--grpc-max-recv-msg-size=1KiB")
    route(epp.grpc_address)  # a small request still routes
    big = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "x" * 4096}]})
    with pytest.raises(grpc.RpcError) as err:
        route(epp.grpc_address, big)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def tls_handshake(port: int, *, max_version: ssl.TLSVersion | None = None, ciphers: str | None = None) -> str:
    """The TLS version and cipher a client gets from the ext-proc port, or the failure."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    if max_version is not None:
        ctx.maximum_version = max_version
    if ciphers is not None:
        ctx.set_ciphers(ciphers)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as conn:
            cipher = conn.cipher()
            return f"{conn.version()} {cipher[0] if cipher else ''}"
    except (ssl.SSLError, OSError) as exc:
        return f"failed: {type(exc).__name__}"


def test_tls_min_version_13_refuses_tls12_clients(tmp_path: Path, epp_with: list[EppServer]) -> None:
    epp = start(epp_with, tmp_path, "--tls-min-version=VersionTLS13", secure=True)
    assert tls_handshake(epp.grpc_port).startswith("TLSv1.3")
    assert tls_handshake(epp.grpc_port, max_version=ssl.TLSVersion.TLSv1_2).startswith("failed")
    assert "GRPC_SSL_CIPHER_SUITES" in epp.process.log_text()  # started again with gRPC's knob


def test_tls_cipher_suites_limit_tls12(tmp_path: Path, epp_with: list[EppServer]) -> None:
    suite = "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"  # the self-signed key is ECDSA
    epp = start(epp_with, tmp_path, f"--tls-cipher-suites={suite}", secure=True)
    tls12 = ssl.TLSVersion.TLSv1_2
    assert tls_handshake(epp.grpc_port, max_version=tls12) == "TLSv1.2 ECDHE-ECDSA-CHACHA20-POLY1305"
    other = "ECDHE-ECDSA-AES128-GCM-SHA256"
    assert tls_handshake(epp.grpc_port, max_version=tls12, ciphers=other).startswith("failed")
    assert tls_handshake(epp.grpc_port).startswith("TLSv1.3")  # TLS 1.3's suites stay on
    # Without the flag, gRPC's own TLS 1.2 list (AES-GCM) is served.
    plain = start(epp_with, tmp_path, secure=True)
    assert tls_handshake(plain.grpc_port, max_version=tls12, ciphers=other) == f"TLSv1.2 {other}"
