"""llm-d Router's ext-proc flags (v0.10 `pkg/epp/server/options.go`): gRPC message limits, stream
metrics, per-endpoint scores in the routing answer, and the TLS version and cipher suites of
`--secure-serving`.

TLS knobs: grpcio's Python server takes no TLS version or cipher settings, but gRPC core reads the
TLS 1.2 cipher list from `GRPC_SSL_CIPHER_SUITES` (OpenSSL names) once, when it starts. So
`epp serve` sets it and starts itself again before serving (`grpc_cipher_list`, `epp.serve`).
gRPC serves TLS 1.2 and 1.3 only, and TLS 1.3's suites are fixed (as in Go, which llm-d's flag
documents: "Only effective for TLS 1.2 and below"). What maps:

- `--tls-min-version VersionTLS12`: gRPC's own floor, nothing to change;
- `--tls-min-version VersionTLS13`: the TLS 1.2 list is a pre-shared-key suite, which a server
  without pre-shared keys never picks, so every TLS 1.2 handshake fails and TLS 1.3 is unchanged
  (`tests/extproc/test_extproc_tls.py` checks both with a real client);
- `--tls-min-version VersionTLS10/11`: refused (gRPC cannot accept TLS 1.0 or 1.1 clients);
- `--tls-cipher-suites`: Go's names mapped to OpenSSL's; TLS 1.3 names are always on (in a list of
  only TLS 1.3 names TLS 1.2 is off, as in Go); suites gRPC's BoringSSL lacks are refused.
"""

from __future__ import annotations

import argparse

from epp.flags.types import go_bool, quantity_bytes

GRPC_MESSAGE_DEFAULT = 64 << 20
"""epp's gRPC message limit both ways when the flag is 0 or absent. llm-d leaves gRPC's default
(4 MiB received), which its FULL_DUPLEX_STREAMED chunks stay under; epp also serves BUFFERED mode,
where the whole request body (up to --max-body-bytes, 16Mi) is one message each way."""
GRPC_MESSAGE_MAX = (1 << 31) - 1  # gRPC core's limits are C ints
CIPHER_ENV = "GRPC_SSL_CIPHER_SUITES"

TLS_VERSIONS = ("VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13")

# Go's crypto/tls names (tls.CipherSuites() and tls.InsecureCipherSuites(), which llm-d accepts)
# -> the OpenSSL name gRPC's cipher list takes; None: a TLS 1.3 suite (not configurable).
GO_CIPHER_SUITES: dict[str, str | None] = {
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    # Go's insecure ones: BoringSSL (gRPC's TLS library) still has these three...
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
}
# ...and not these (checked against grpcio's BoringSSL: an unknown name is refused at startup).
UNSUPPORTED_CIPHER_SUITES = frozenset(
    {
        "TLS_RSA_WITH_RC4_128_SHA",
        "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
        "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
        "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
        "TLS_RSA_WITH_AES_128_CBC_SHA256",
    }
)
# A TLS 1.2 list no handshake can use: a pre-shared-key suite, and epp has no pre-shared keys.
TLS12_OFF = "ECDHE-PSK-CHACHA20-POLY1305"


def tls_version(text: str) -> str:
    value = text.strip()
    if value not in TLS_VERSIONS:
        raise argparse.ArgumentTypeError(
            f"unknown TLS version {text!r}; supported values: {', '.join(TLS_VERSIONS)}"
        )
    return value


def cipher_suites(text: str) -> tuple[str, ...]:
    """A comma-separated list of Go cipher-suite names (empty items skipped, as llm-d does)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if name not in GO_CIPHER_SUITES and name not in UNSUPPORTED_CIPHER_SUITES:
            raise argparse.ArgumentTypeError(f"unknown cipher suite {name!r} (Go's crypto/tls names)")
    return names


def add_extproc_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ext-proc (llm-d Router's flags)")
    g.add_argument(
        "--grpc-max-recv-msg-size",
        type=quantity_bytes,
        default=0,
        metavar="SIZE",
        help="largest gRPC message epp accepts from the proxy, e.g. 10MiB, 25MB (default 0: 64Mi, "
        "so a BUFFERED body up to --max-body-bytes fits in one message)",
    )
    g.add_argument(
        "--grpc-max-send-msg-size",
        type=quantity_bytes,
        default=0,
        metavar="SIZE",
        help="largest gRPC message epp sends to the proxy (default 0: 64Mi)",
    )
    go_bool(
        g,
        "enable-grpc-stream-metrics",
        default=False,
        help="export llm_d_epp_extproc_streams_inflight, _stream_duration_seconds and "
        "_streams_total{code} (default false)",
    )
    go_bool(
        g,
        "emit-endpoint-scores",
        default=False,
        help="put the scheduler's per-endpoint scores in the routing answer's envoy.lb metadata, "
        "under x-gateway-destination-endpoint-scores (default false)",
    )
    g.add_argument(
        "--tls-min-version",
        type=tls_version,
        default=None,
        help="with --secure-serving: VersionTLS12 (gRPC's floor, the default) or VersionTLS13",
    )
    g.add_argument(
        "--tls-cipher-suites",
        type=cipher_suites,
        default=None,
        metavar="NAME[,NAME...]",
        help="with --secure-serving: the TLS 1.2 cipher suites, Go's names "
        "(TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, ...); TLS 1.3's are always on",
    )


def grpc_message_limits(args: argparse.Namespace) -> tuple[int, int]:
    """(receive, send) limits for gRPC: the flags, 0 meaning epp's default, at most a C int."""

    def limit(value: int) -> int:
        return min(value, GRPC_MESSAGE_MAX) if value else GRPC_MESSAGE_DEFAULT

    return limit(args.grpc_max_recv_msg_size), limit(args.grpc_max_send_msg_size)


def grpc_cipher_list(args: argparse.Namespace) -> str | None:
    """The `GRPC_SSL_CIPHER_SUITES` the TLS flags ask for, or None (gRPC's own list). Raises
    ValueError for what gRPC cannot do."""
    if not args.secure_serving:
        return None
    version = args.tls_min_version
    if version in ("VersionTLS10", "VersionTLS11"):
        raise ValueError(
            f"--tls-min-version {version}: gRPC serves TLS 1.2 and 1.3 only, so clients of older "
            "versions cannot connect whatever the floor; use VersionTLS12 (the default) or VersionTLS13"
        )
    suites = args.tls_cipher_suites or ()
    refused = [s for s in suites if s in UNSUPPORTED_CIPHER_SUITES]
    if refused:
        raise ValueError(
            f"--tls-cipher-suites: {', '.join(refused)} not available in gRPC's TLS library "
            "(BoringSSL); use ECDHE suites with AES-GCM or ChaCha20-Poly1305"
        )
    if version == "VersionTLS13":
        return TLS12_OFF
    if not suites:
        return None
    tls12 = [GO_CIPHER_SUITES[s] for s in suites if GO_CIPHER_SUITES[s] is not None]
    return ":".join(n for n in tls12 if n is not None) if tls12 else TLS12_OFF


def extproc_notes(args: argparse.Namespace) -> list[str]:
    """What the flags do not change, logged once at startup."""
    notes = []
    if not args.secure_serving and (args.tls_min_version or args.tls_cipher_suites):
        notes.append("--tls-min-version / --tls-cipher-suites: no effect with --secure-serving=false")
    for flag, value in (
        ("--grpc-max-recv-msg-size", args.grpc_max_recv_msg_size),
        ("--grpc-max-send-msg-size", args.grpc_max_send_msg_size),
    ):
        if value > GRPC_MESSAGE_MAX:
            notes.append(f"{flag}={value}: gRPC's largest message is {GRPC_MESSAGE_MAX} bytes; using that")
        elif value and value < args.max_body_bytes:
            notes.append(
                f"{flag}={value} is below --max-body-bytes ({args.max_body_bytes}): where the gateway "
                "sends bodies BUFFERED (one message), larger ones fail in gRPC"
            )
    return notes
