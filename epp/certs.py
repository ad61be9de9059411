"""TLS key pairs for epp's servers: a mounted `tls.crt`/`tls.key` pair, or a self-signed one.

Shared by the ext-proc port (`epp.extproc.tls`, GIE's `--secure-serving`) and `epp sidecar`
(llm-d's `--secure-proxy`): both serve a mounted pair, else a certificate made at start-up, and
their clients are configured to skip verification (GIE's and llm-d's default).
"""

from __future__ import annotations

import datetime
import ipaddress
import pathlib
import socket

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


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
