"""The metrics port's protection, llm-d Router's flags: TLS (`--metrics-cert-dir`) with client
certificates (`--metrics-client-ca-file`), and `--metrics-endpoint-auth`'s default."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from epp import cli
from epp.flags import metrics_port
from epp.gateway.processes import EppServer
from epp.observability.metrics_tls import MetricsTLS

PEM = serialization.Encoding.PEM


class CA:
    """A certificate authority that signs server and client certificates for the tests."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            self._builder(self.name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def _builder(self, subject: x509.Name, public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def issue(self, common_name: str, *, server: bool) -> tuple[bytes, bytes]:
        """(key PEM, certificate PEM) signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = self._builder(subject, key.public_key())
        if server:
            sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        key_pem = key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        return key_pem, cert.public_bytes(PEM)

    def write(self, path: Path) -> Path:
        path.write_bytes(self.cert.public_bytes(PEM))
        return path


def write_pair(directory: Path, pair: tuple[bytes, bytes], stem: str = "tls") -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / f"{stem}.key", directory / f"{stem}.crt"
    key.write_bytes(pair[0])
    cert.write_bytes(pair[1])
    return cert, key


def scrape(port: int, server_ca: Path, client: tuple[Path, Path] | None) -> str:
    ctx = ssl.create_default_context(cafile=str(server_ca))
    if client is not None:
        ctx.load_cert_chain(*client)
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=5) as resp:
        text: str = resp.read().decode()
    return text


def test_metrics_over_tls_with_client_certificates(tmp_path: Path) -> None:
    ca, stranger = CA("metrics-ca"), CA("another-ca")
    write_pair(tmp_path / "certs", ca.issue("epp", server=True))
    client = write_pair(tmp_path / "client", ca.issue("prometheus", server=False), "client")
    foreign = write_pair(tmp_path / "foreign", stranger.issue("prometheus", server=False), "client")
    ca_file = ca.write(tmp_path / "ca.crt")
    epp = EppServer(
        tmp_path / "epp.log",
        endpoints=["127.0.0.1:1"],
        extra_args=["--metrics-cert-dir", str(tmp_path / "certs"), "--metrics-client-ca-file", str(ca_file)],
    )
    try:
        epp.start(wait="listening")
        assert "inference_pool_ready_pods" in scrape(epp.metrics_port, ca_file, client)
        for who in (None, foreign):  # no certificate, or one another CA signed: no handshake
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                scrape(epp.metrics_port, ca_file, who)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not served
            urllib.request.urlopen(f"http://127.0.0.1:{epp.metrics_port}/metrics", timeout=5)
    finally:
        epp.stop()


def test_a_renewed_certificate_is_served_and_a_broken_one_is_not(tmp_path: Path) -> None:
    ca = CA("metrics-ca")
    certs = tmp_path / "certs"
    write_pair(certs, ca.issue("epp-1", server=True))
    tls = MetricsTLS(str(certs))
    assert not tls.reload_if_changed()
    write_pair(certs, ca.issue("epp-2", server=True))
    assert tls.reload_if_changed() and tls.reloads == 1
    (certs / "tls.key").write_bytes(ca.issue("epp-3", server=True)[0])  # a key of another cert
    assert not tls.reload_if_changed() and tls.reloads == 1  # the old pair stays


def serve_args(*argv: str) -> object:
    return cli.build_parser().parse_args(["serve", *argv])


@pytest.mark.parametrize(
    ("argv", "auth"),
    [
        (["--pool-name", "p"], True),  # GIE's and llm-d's charts: on, as their EPPs default it
        (["--endpoint-selector", "app=vllm", "--endpoint-target-ports", "8000"], True),
        (["--pool-name", "p", "--metrics-endpoint-auth=false"], False),  # the charts' auth off
        (["--endpoints", "10.0.0.1:8000"], False),  # local: as llm-d's file discovery, no auth
        (["--endpoints", "10.0.0.1:8000", "--pool-name", "p"], False),
        (["--endpoints-file", "eps.yaml", "--metrics-endpoint-auth"], True),
    ],
)
def test_metrics_auth_default_follows_the_endpoint_source(argv: list[str], auth: bool) -> None:
    assert metrics_port.metrics_auth(serve_args(*argv)) is auth  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--metrics-client-ca-file", "{ca}"], "--metrics-client-ca-file needs --metrics-cert-dir"),
        (["--metrics-cert-dir", "{empty}"], "tls.crt is missing"),
        (["--metrics-cert-dir", "{certs}", "--metrics-endpoint-auth=false"], "without authentication"),
        (["--metrics-cert-dir", "{certs}", "--metrics-client-ca-file", "{empty}/ca"], "no such file"),
    ],
)
def test_metrics_tls_flags_are_checked_at_startup(tmp_path: Path, argv: list[str], said: str) -> None:
    ca = CA("ca")
    write_pair(tmp_path / "certs", ca.issue("epp", server=True))
    (tmp_path / "empty").mkdir()
    paths = {"ca": ca.write(tmp_path / "ca.crt"), "certs": tmp_path / "certs", "empty": tmp_path / "empty"}
    args = [a.format(**paths) for a in argv]
    run = subprocess.run(
        [sys.executable, "-m", "epp", "serve", "--endpoints", "127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert said in run.stderr + run.stdout
