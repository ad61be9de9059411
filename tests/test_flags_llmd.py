"""`epp serve` takes llm-d Router v0.10's EPP flags (`pkg/epp/server/options.go`, AddFlags) with
llm-d's meaning; GIE v1.5's stay (tests/test_flags_compat.py). The end-to-end effect of the new
ones is in tests/test_serve_llmd_flags.py and tests/test_serve_metrics_port.py."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from epp import cli
from epp.flags import compat, extproc, types

# llm-d Router v0.10's 37 flags (its logging flags are GIE's: -v, --zap-*), each with a value
# llm-d accepts. `--allow-experimental-plugins` belongs with the config's plugin stability levels.
LLMD_FLAGS: dict[str, str] = {
    "grpc-port": "9002",
    "ha-enable-leader-election": "false",
    "drain-timeout": "30s",
    "grpc-max-recv-msg-size": "10MiB",
    "grpc-max-send-msg-size": "25MB",
    "pool-group": "inference.networking.k8s.io",
    "pool-namespace": "llm",
    "pool-name": "pool",
    "endpoint-selector": "app=vllm",
    "endpoint-target-ports": "8000,8001",
    "disable-endpoint-subset-filter": "true",
    "emit-endpoint-scores": "true",
    "refresh-metrics-interval": "50ms",
    "refresh-prometheus-metrics-interval": "5s",
    "metrics-staleness-threshold": "2s",
    "total-queued-requests-metric": "vllm:num_requests_waiting",
    "total-running-requests-metric": "vllm:num_requests_running",
    "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
    "lora-info-metric": "vllm:lora_requests_info",
    "cache-info-metric": "vllm:cache_config_info",
    "tracing": "false",
    "health-checking": "true",
    "metrics-port": "9090",
    "grpc-health-port": "9003",
    "enable-pprof": "true",
    "cert-path": "/certs",
    "enable-cert-reload": "false",
    "enable-grpc-stream-metrics": "true",
    "secure-serving": "true",
    "tls-min-version": "VersionTLS13",
    "tls-cipher-suites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "metrics-endpoint-auth": "true",
    "metrics-client-ca-file": "/ca/ca.crt",
    "metrics-cert-dir": "/certs/metrics",
    "config-file": "/config/default-plugins.yaml",
    "config-text": "",
}
PLUGINS_FLAG = "allow-experimental-plugins"


def parse(*argv: str) -> argparse.Namespace:
    args = cli.build_parser().parse_args(["serve", *compat.normalize_go_flags(list(argv), serve_parser())])
    assert isinstance(args, argparse.Namespace)
    return args


def serve_parser() -> Any:
    return cli._subparser(cli.build_parser(), "serve")


def test_the_list_is_llm_ds_37() -> None:
    assert len(LLMD_FLAGS) + 1 == 37 and PLUGINS_FLAG not in LLMD_FLAGS


@pytest.mark.parametrize("name", sorted(LLMD_FLAGS))
def test_every_llmd_flag_is_accepted(name: str) -> None:
    parse(f"--{name}={LLMD_FLAGS[name]}")
    parse(f"-{name}={LLMD_FLAGS[name]}")  # Go's single-dash form


def test_llm_ds_defaults() -> None:
    args = parse()
    assert (args.grpc_port, args.grpc_health_port, args.metrics_port) == (9002, 9003, 9090)
    assert args.secure_serving is True and args.pool_group == "inference.networking.k8s.io"
    assert args.refresh_metrics_interval == 0.05 and args.metrics_staleness_threshold == 2.0
    assert args.emit_endpoint_scores is False and args.enable_grpc_stream_metrics is False
    assert args.tls_min_version is None and args.tls_cipher_suites is None
    assert args.metrics_cert_dir is None and args.metrics_client_ca_file is None
    # 0: epp's 64 MiB (llm-d keeps gRPC's 4 MiB; epp's BUFFERED bodies are one message).
    assert extproc.grpc_message_limits(args) == (64 << 20, 64 << 20)


@pytest.mark.parametrize(
    ("text", "size"),
    [("10MiB", 10 << 20), ("25MB", 25_000_000), ("4194304", 4194304), ("1.5Ki", 1536), ("1e6", 10**6)],
)
def test_message_sizes_read_as_llm_d_reads_them(text: str, size: int) -> None:
    assert types.quantity_bytes(text) == size
    args = parse(f"--grpc-max-recv-msg-size={text}", f"--grpc-max-send-msg-size={text}")
    assert extproc.grpc_message_limits(args) == (size, size)


@pytest.mark.parametrize("text", ["-1", "0.5", "ten", "B", "1e30"])
def test_bad_message_sizes_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        types.quantity_bytes(text)


def test_a_size_past_grpcs_limit_is_capped_and_said() -> None:
    args = parse("--grpc-max-recv-msg-size=4Gi")
    assert extproc.grpc_message_limits(args)[0] == (1 << 31) - 1
    assert any("largest message" in n for n in extproc.extproc_notes(args))


@pytest.mark.parametrize(
    ("argv", "ciphers"),
    [
        ([], None),
        (["--tls-min-version=VersionTLS12"], None),  # gRPC's floor already
        (["--tls-min-version=VersionTLS13"], extproc.TLS12_OFF),
        (["--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"], "ECDHE-RSA-AES128-GCM-SHA256"),
        (
            ["--tls-cipher-suites=TLS_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,"],
            "ECDHE-ECDSA-CHACHA20-POLY1305",
        ),
        (["--tls-cipher-suites=TLS_AES_128_GCM_SHA256"], extproc.TLS12_OFF),  # TLS 1.3 names only
        (["--tls-min-version=VersionTLS13", "--secure-serving=false"], None),
    ],
)
def test_tls_flags_become_grpcs_cipher_list(argv: list[str], ciphers: str | None) -> None:
    assert extproc.grpc_cipher_list(parse(*argv)) == ciphers


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--tls-min-version=VersionTLS10"], "TLS 1.2 and 1.3 only"),
        (["--tls-min-version=VersionTLS11"], "TLS 1.2 and 1.3 only"),
        (["--tls-cipher-suites=TLS_RSA_WITH_RC4_128_SHA"], "not available"),
    ],
)
def test_what_grpc_cannot_do_is_refused(argv: list[str], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        extproc.grpc_cipher_list(parse(*argv))


@pytest.mark.parametrize("argv", [["--tls-min-version=TLS1.3"], ["--tls-cipher-suites=AES128-SHA"]])
def test_unknown_tls_names_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)
    assert "unknown" in capsys.readouterr().err


def test_every_go_cipher_suite_name_is_known() -> None:
    # Go's tls.CipherSuites() (17) and tls.InsecureCipherSuites() (8): the names llm-d accepts.
    assert len(extproc.GO_CIPHER_SUITES) + len(extproc.UNSUPPORTED_CIPHER_SUITES) == 25
