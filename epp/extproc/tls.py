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

import logging
import pathlib
import threading

import grpc

# Callers and tests take the pair helpers from here too (the `X as X` re-exports).
from epp.certs import read_pair as read_pair
from epp.certs import self_signed as self_signed

log = logging.getLogger("epp.tls")


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
