"""TLS for the ext-proc port (GIE's --secure-serving): a mounted cert or a self-signed one.

GIE's EPP serves TLS by default with a self-signed certificate, and gateways are configured to
skip verification (Istio DestinationRule `insecureSkipVerify`, Envoy's empty validation context).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import pathlib
import socket

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


def server_credentials(cert_path: str | None) -> grpc.ServerCredentials:
    """Credentials from `<cert_path>/tls.crt` and `tls.key` (a mounted Secret), else self-signed."""
    if cert_path:
        base = pathlib.Path(cert_path)
        try:
            cert = (base / "tls.crt").read_bytes()
            key = (base / "tls.key").read_bytes()
        except OSError as exc:
            raise SystemExit(f"--cert-path {cert_path}: cannot read tls.crt/tls.key: {exc}") from exc
        log.info("serving TLS with the certificate in %s", cert_path)
    else:
        key, cert = self_signed()
        log.info("serving TLS with a self-signed certificate")
    return grpc.ssl_server_credentials([(key, cert)])
