"""TLS on the metrics port (llm-d's `--metrics-cert-dir`, `--metrics-client-ca-file`).

As llm-d's metrics server (controller-runtime's, `ConfigureMetricsTLS`): TLS 1.2 at least, the
certificate `tls.crt`/`tls.key` from the directory, re-read when the files change (its
certwatcher: a rotated Secret is served without a restart), and with a client CA every client
must present a certificate that CA signed (`RequireAndVerifyClientCert`). The client CA is read
once, at start, as there.

The check for changed files runs every `RELOAD_EVERY` seconds on the event loop, which is also
where every handshake of the port runs (asyncio's TLS), so a reload never races one. A pair that
does not load (mid-rotation, or a key of another certificate) keeps the old one, logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path

from epp import tasks

log = logging.getLogger("epp.metrics")

RELOAD_EVERY = 10.0  # seconds; controller-runtime's certwatcher polls as often


class MetricsTLS:
    def __init__(self, cert_dir: str, client_ca: str | None = None) -> None:
        self.cert_dir = Path(cert_dir)
        self.reloads = 0
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._stat()
        try:
            self._load()
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--metrics-cert-dir {cert_dir}: cannot load tls.crt/tls.key: {exc}") from exc
        if client_ca is not None:
            try:
                self.context.load_verify_locations(cafile=client_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--metrics-client-ca-file {client_ca}: no CA certificate: {exc}") from exc
            self.context.verify_mode = ssl.CERT_REQUIRED
        self._task: asyncio.Task[None] | None = None

    def _load(self) -> None:
        self.context.load_cert_chain(self.cert_dir / "tls.crt", self.cert_dir / "tls.key")

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for name in ("tls.crt", "tls.key"):
            try:
                st = (self.cert_dir / name).stat()  # follows a mounted Secret's ..data symlink
            except OSError:
                return ()
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def reload_if_changed(self) -> bool:
        """Load the pair again if its files changed; True when the new one is served."""
        stamp = self._stat()
        if not stamp or stamp == self._stamp:
            return False
        try:
            self._load()
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "--metrics-cert-dir %s changed but cannot be loaded (keeping the old certificate): %s",
                self.cert_dir,
                exc,
            )
            return False
        self._stamp = stamp
        self.reloads += 1
        log.info("reloaded the metrics port's TLS certificate from %s", self.cert_dir)
        return True

    async def _watch(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            self.reload_if_changed()

    def start(self, every: float = RELOAD_EVERY) -> None:
        self._task = tasks.create_guarded_task(self._watch(every), name="metrics certificate", logger=log)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def from_flags(cert_dir: str | None, client_ca: str | None) -> MetricsTLS | None:
    """The metrics port's TLS the flags ask for, started; None without --metrics-cert-dir."""
    if cert_dir is None:
        return None
    tls = MetricsTLS(cert_dir, client_ca)
    tls.start()
    clients = f", client certificates from {client_ca}" if client_ca else ""
    log.info("metrics port: TLS with %s%s", cert_dir, clients)
    return tls
