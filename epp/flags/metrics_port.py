"""The metrics port's protection, as llm-d Router v0.10 sets it up (`pkg/epp/server/options.go`,
`ConfigureMetricsTLS`): Kubernetes authentication (`--metrics-endpoint-auth`, the flag itself is
in epp.flags.compat with GIE's), TLS (`--metrics-cert-dir`) and client certificates
(`--metrics-client-ca-file`).

`--metrics-endpoint-auth`'s default follows where the endpoints come from. Watching Kubernetes
(`--pool-name` alone, `--endpoint-selector`), as in GIE's and llm-d's charts, it is on: both
EPPs default it on, and both charts pass `--metrics-endpoint-auth=false` only when their
Prometheus auth is off, so the image in those charts checks callers exactly when theirs does.
Without Kubernetes (`--endpoints`, `--endpoints-file`) it is off, as llm-d serves its metrics
without auth in file-discovery mode: `epp serve` on a laptop needs no API server to be scraped.
"""

from __future__ import annotations

import argparse
from pathlib import Path

CERT_FILES = ("tls.crt", "tls.key")


def add_metrics_port_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("metrics port TLS (llm-d Router's flags)")
    g.add_argument(
        "--metrics-cert-dir",
        default=None,
        metavar="DIR",
        help="serve the metrics port over TLS with DIR/tls.crt and DIR/tls.key (reloaded when they "
        "change); needs --metrics-client-ca-file or metrics auth",
    )
    g.add_argument(
        "--metrics-client-ca-file",
        default=None,
        metavar="FILE",
        help="with --metrics-cert-dir: only clients with a certificate from this PEM CA may connect",
    )


def kubernetes_endpoints(args: argparse.Namespace) -> bool:
    """Whether the endpoints come from Kubernetes (epp.k8s.from_flags.kubernetes_source's rule)."""
    if args.endpoint_selector or args.endpoint_target_ports:
        return True
    return bool(args.pool_name) and not (args.endpoints or args.endpoints_file)


def metrics_auth(args: argparse.Namespace) -> bool:
    """`--metrics-endpoint-auth` as given, else its default (see the module docstring)."""
    given: bool | None = args.metrics_endpoint_auth
    return kubernetes_endpoints(args) if given is None else given


def metrics_port_problems(args: argparse.Namespace) -> list[str]:
    """llm-d's checks of the metrics TLS flags, as startup errors."""
    problems = []
    cert_dir, client_ca = args.metrics_cert_dir, args.metrics_client_ca_file
    if client_ca is not None and not Path(client_ca).is_file():
        problems.append(f"--metrics-client-ca-file {client_ca}: no such file")
    if cert_dir is not None:
        problems += [
            f"--metrics-cert-dir: {Path(cert_dir) / name} is missing"
            for name in CERT_FILES
            if not (Path(cert_dir) / name).is_file()
        ]
    if client_ca is not None and cert_dir is None:
        problems.append("--metrics-client-ca-file needs --metrics-cert-dir")
    if cert_dir is not None and client_ca is None and args.metrics_endpoint_auth is False:
        problems.append(
            "--metrics-cert-dir would serve metrics over TLS without authentication: "
            "give --metrics-client-ca-file, or leave --metrics-endpoint-auth on"
        )
    return problems
