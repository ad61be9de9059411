"""TLS for the ext-proc port (GIE's --secure-serving): a mounted cert or a self-signed one.

GIE's EPP serves TLS by default with a self-signed certificate, and gateways are configured to
skip verification (Istio DestinationRule `insecureSkipVerify`, Envoy's empty validation context).

With `--enable-cert-reload` (GIE's flag) a renewed tls.crt/tls.key under --cert-path (a rotated
Secret, cert-manager) is served from the next connection on: gRPC asks `CertReloader` before
every TLS handshake, and it re-reads the files when their stat changed. A half-written pair (the
key not matching the certificate) or an unreadable file keeps the previous certificate and is
logged, so a rotation can never take the port down.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import pathlib
import socket
import threading

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = logging.getLogger("epp.tls")


def self_signed() -> tuple[bytes, bytes]:
    """(key PEM, cert PEM) for this host, valid for 10 years. ECDSA P-256: fast to generate."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "epp")])
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName(socket.gethostname()),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def read_pair(cert_path: str) -> tuple[bytes, bytes]:
    """(key PEM, cert PEM) from `<cert_path>/tls.key` and `tls.crt`; ValueError if they do not match."""
    base = pathlib.Path(cert_path)
    cert = (base / "tls.crt").read_bytes()
    key = (base / "tls.key").read_bytes()
    try:
        cert_key = x509.load_pem_x509_certificate(cert).public_key()
        private = serialization.load_pem_private_key(key, password=None)
    except ValueError as exc:
        raise ValueError(f"not a PEM certificate and key: {exc}") from exc
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(serialization.Encoding.PEM, spki) != cert_key.public_bytes(
        serialization.Encoding.PEM, spki
    ):
        raise ValueError("tls.key does not belong to tls.crt")
    return key, cert


class CertReloader:
    """gRPC's certificate fetcher: a new configuration when the files under `cert_path` changed."""

    def __init__(self, cert_path: str) -> None:
        self.cert_path = cert_path
        self.reloads = 0
        self._lock = threading.Lock()  # gRPC calls the fetcher from its own threads
        self._stamp = self._stat()

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        base = pathlib.Path(self.cert_path)
        out = []
        for name in ("tls.crt", "tls.key"):
            try:
                st = (base / name).stat()  # follows the ..data symlink of a mounted Secret
            except OSError:
                return ()
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            stamp = self._stat()
            if not stamp or stamp == self._stamp:
                return None
            try:
                key, cert = read_pair(self.cert_path)
            except (OSError, ValueError) as exc:
                # Mid-rotation or broken: keep serving the old certificate, look again next time.
                log.warning(
                    "--cert-path %s changed but cannot be loaded (keeping the old certificate): %s",
                    self.cert_path,
                    exc,
                )
                return None
            self._stamp = stamp
            self.reloads += 1
        log.info("reloaded the TLS certificate in %s", self.cert_path)
        return grpc.ssl_server_certificate_configuration([(key, cert)])


def server_credentials(cert_path: str | None, *, reload: bool = False) -> grpc.ServerCredentials:
    """Credentials from `<cert_path>/tls.crt` and `tls.key` (a mounted Secret), else self-signed.

    `reload`: re-read the files when they change (GIE's --enable-cert-reload); needs `cert_path`.
    """
    if reload and not cert_path:
        raise SystemExit("--enable-cert-reload needs --cert-path (a self-signed certificate never changes)")
    if cert_path:
        try:
            key, cert = read_pair(cert_path)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--cert-path {cert_path}: cannot read tls.crt/tls.key: {exc}") from exc
        log.info(
            "serving TLS with the certificate in %s%s",
            cert_path,
            " (reloaded when it changes)" if reload else "",
        )
    else:
        key, cert = self_signed()
        log.info("serving TLS with a self-signed certificate")
    if reload and cert_path:
        return grpc.dynamic_ssl_server_credentials(
            grpc.ssl_server_certificate_configuration([(key, cert)]), CertReloader(cert_path)
        )
    return grpc.ssl_server_credentials([(key, cert)])
