"""Local processes for the demo, the end-to-end tests and the benchmarks: `epp serve` and Envoy.

One implementation of what each of those needs, so they start and stop things the same way:

* `free_ports(n)`: n distinct TCP ports on 127.0.0.1 that were free a moment ago.
* `stable_ports(n)`: the same from below the ephemeral range, for ports bound late or again.
* `ManagedProcess`: a subprocess whose output goes to a log file; stop() is idempotent.
* `EppServer`: `epp serve` on free ports (plaintext gRPC, 127.0.0.1), started and waited for
  until its gRPC health check says SERVING (or, on request, merely answers).
* `EnvoyServer`: a real Envoy on a generated bootstrap, waited for until its admin /ready is LIVE.

Every process started here is also remembered in a module-level set and killed when the
interpreter exits, so a crash or Ctrl-C in the caller does not leave an epp or an Envoy behind.
(Envoy also dies with its parent by itself: it sets PR_SET_PDEATHSIG.)

All waits are bounded by a deadline and poll at a fixed interval; nothing here retries forever.
grpc is imported only when a health check is made, because `epp.cli` imports the demo module
(and through it, possibly this one) on every start of `epp serve`.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from epp.gateway.envoy import (
    GatewayParams,
    start_envoy,
    stop_process,
    unique_base_id,
    wait_envoy_ready,
    write_config,
)

HOST = "127.0.0.1"

# "serving": the health check of service "" answers SERVING (epp has its endpoints and routes).
# "listening": the health port answers at all, whatever the status (e.g. an empty pool).
WaitFor = Literal["serving", "listening"]


def free_ports(n: int, host: str = HOST) -> list[int]:
    """`n` distinct ports that were free a moment ago (held together so they differ)."""
    socks: list[socket.socket] = []
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        for _ in range(n):
            s = socket.socket(family, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default 32768 if unreadable)."""
    with contextlib.suppress(OSError, ValueError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


# Ports `stable_ports` handed out in this process. Its picks are bound later, so a free port is
# no proof that no earlier caller owns it: the soak picks ~20 ports for its pods, epps and Envoy
# before any binds, and CI saw one of its pods fail on "Address already in use".
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def stable_span() -> range:
    """The ports `stable_ports` picks from: the 12,000 just below the ephemeral range."""
    low = ephemeral_low()
    return range(max(1024, low - 12000), low)


def stable_ports(n: int, host: str = HOST) -> list[int]:
    """`n` distinct free ports below the kernel's ephemeral range, for a socket bound seconds or
    minutes after the pick, or bound again after a restart in place. A port from `free_ports`
    (bind to port 0) comes from the ephemeral range, where meanwhile the kernel hands the same
    number to other sockets' bind(0) and connect() calls: CI saw that collision for vLLM's replay
    socket, NIXL's side channel and Envoy's listener (and, by its quick exit, most likely for a
    soak pod's ports). Nor does it hand out a port it handed out before in this process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    rng = random.Random()
    span = stable_span()
    picked: list[int] = []
    with _handed_out_lock:
        if len(_handed_out) + n > len(span):
            _handed_out.clear()  # a long-lived caller has used the span: old picks are bound
        while len(picked) < n:
            port = rng.choice(span)
            if port in picked or port in _handed_out:
                continue
            with socket.socket(family, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            picked.append(port)
        _handed_out.update(picked)
    return picked


def hostport(host: str, port: int) -> str:
    """`host:port`, an IPv6 literal in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tail(path: Path, max_chars: int = 20_000) -> str:
    """The last `max_chars` characters of a log file, or why it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"<unreadable: {exc}>"
    text = data[-max_chars:].decode("utf-8", "replace")
    return ("…(truncated)\n" if len(data) > max_chars else "") + text


# Last-resort safety net: processes still alive when the interpreter exits get stopped.
_live: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _stop_leftovers() -> None:
    for proc in list(_live):
        with contextlib.suppress(Exception):
            stop_process(proc, timeout=2.0)


def track(proc: subprocess.Popen[bytes]) -> None:
    """Have `proc` stopped at interpreter exit if its owner has not stopped it by then."""
    _live.add(proc)


def untrack(proc: subprocess.Popen[bytes]) -> None:
    _live.discard(proc)


class ManagedProcess:
    """A subprocess with its output appended to a log file; stop() is idempotent."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start: {shlex.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        track(self.proc)

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 5.0, sig: signal.Signals = signal.SIGTERM) -> None:
        """`sig` (SIGTERM), then SIGKILL after `timeout`."""
        if self.proc is not None:
            stop_process(self.proc, timeout=timeout, sig=sig)
            untrack(self.proc)

    def kill(self) -> None:
        """SIGKILL, no grace: simulates a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc is not None:
            untrack(self.proc)

    def log_text(self, max_chars: int = 20_000) -> str:
        return tail(self.log_path, max_chars)


# --- epp ------------------------------------------------------------------------------------------


def epp_command(custom: str | None = None) -> list[str]:
    """The command prefix that runs epp: `custom` (shell-quoted) if given, else this Python's -m epp."""
    return shlex.split(custom) if custom else [sys.executable, "-m", "epp"]


def grpc_health_status(port: int, service: str = "", *, host: str = HOST, timeout: float = 1.0) -> str:
    """The grpc.health.v1 status name of `service` on host:port, or "UNREACHABLE"."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(hostport(host, port)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            return (
                "UNREACHABLE"
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                else str(code)
            )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def wait_grpc_health(
    health_port: int,
    *,
    proc: ManagedProcess | None = None,
    until: WaitFor = "serving",
    timeout: float = 30.0,
    host: str = HOST,
    what: str = "epp",
) -> None:
    """Poll the gRPC health port until `until` holds; fail early if `proc` exits meanwhile."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{what} exited early (status {proc.returncode})")
        last = grpc_health_status(health_port, host=host)
        if last == "SERVING" or (until == "listening" and last != "UNREACHABLE"):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s (health: {last})")


@dataclasses.dataclass(frozen=True, slots=True)
class EppPorts:
    grpc: int
    health: int
    metrics: int

    @classmethod
    def free(cls, host: str = HOST) -> EppPorts:
        # Stable ports: an EppServer restarts in place (drain and soak tests), binding them again.
        grpc_port, health_port, metrics_port = stable_ports(3, host)
        return cls(grpc_port, health_port, metrics_port)


class EppServer:
    """`epp serve` as a subprocess on fixed ports (picked free once), so it can be restarted in place.

    At most one endpoint source: `endpoints` (the --endpoints flag) or `endpoints_file`; with
    neither, `extra_args` must name one (a Kubernetes pool: --pool-name and --kubeconfig). The
    scheduling config, log level and any other flag go in `extra_args`.
    """

    def __init__(
        self,
        log_path: Path,
        *,
        endpoints: Sequence[str] | None = None,
        endpoints_file: Path | None = None,
        secure: bool = False,
        extra_args: Sequence[str] = (),
        command: Sequence[str] | None = None,
        host: str = HOST,
        name: str = "epp",
    ) -> None:
        if endpoints is not None and endpoints_file is not None:
            raise ValueError("give at most one of endpoints / endpoints_file")
        self.host = host
        self.ports = EppPorts.free(host)
        self.secure = secure
        args = [
            "serve",
            "--grpc-port", str(self.ports.grpc),
            "--grpc-health-port", str(self.ports.health),
            "--metrics-port", str(self.ports.metrics),
            f"--secure-serving={'true' if secure else 'false'}",
            "--bind-address", host,
            # One process unless `extra_args` says otherwise (the last --workers wins): a test or
            # benchmark reads one process's CPU and state; `--workers auto` is the binary's default.
            "--workers", "1",
        ]  # fmt: skip
        if endpoints is not None:
            args += ["--endpoints", ",".join(endpoints)]
        elif endpoints_file is not None:
            args += ["--endpoints-file", str(endpoints_file)]
        prefix = list(command) if command is not None else epp_command()
        self.process = ManagedProcess(name, [*prefix, *args, *extra_args], log_path)

    @property
    def grpc_port(self) -> int:
        return self.ports.grpc

    @property
    def health_port(self) -> int:
        return self.ports.health

    @property
    def metrics_port(self) -> int:
        return self.ports.metrics

    @property
    def grpc_address(self) -> str:
        return hostport(self.host, self.ports.grpc)

    @property
    def argv(self) -> list[str]:
        return self.process.argv

    def start(self, *, wait: WaitFor = "serving", timeout: float = 30.0) -> None:
        """Start and wait (see `WaitFor`)."""
        self.process.start()
        self.wait_ready(wait=wait, timeout=timeout)

    def wait_ready(self, *, wait: WaitFor = "serving", timeout: float = 30.0) -> None:
        wait_grpc_health(
            self.ports.health,
            proc=self.process,
            until=wait,
            timeout=timeout,
            host=self.host,
            what=self.process.name,
        )

    def stop(self, timeout: float = 5.0) -> None:
        # SIGINT: in-flight streams still drain, without SIGTERM's --drain-delay (epp.drain),
        # which would hold every test's and benchmark's teardown 5 s for a gateway that is gone.
        self.process.stop(timeout, sig=signal.SIGINT)

    def kill(self) -> None:
        self.process.kill()

    def restart(self, *, wait: WaitFor = "serving", timeout: float = 30.0) -> None:
        self.stop()
        self.start(wait=wait, timeout=timeout)

    def metrics_text(self, timeout: float = 5.0) -> str:
        url = f"http://{hostport(self.host, self.ports.metrics)}/metrics"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text: str = resp.read().decode()
        return text


# --- Envoy ----------------------------------------------------------------------------------------


class EnvoyServer:
    """A real Envoy on a bootstrap built from `GatewayParams` (or given as a dict).

    The config goes to `<workdir>/<name>.yaml`, the output to `<workdir>/<name>.log`; each
    instance gets its own --base-id, so several can run side by side.
    """

    def __init__(
        self,
        workdir: Path,
        config: GatewayParams | Mapping[str, Any],
        *,
        admin_port: int | None = None,
        name: str = "envoy",
        log_level: str = "warning",
        concurrency: int = 1,
        admin_address: str = HOST,
    ) -> None:
        if isinstance(config, GatewayParams):
            admin_port = config.admin_port if admin_port is None else admin_port
        if admin_port is None:
            raise ValueError("admin_port is needed with a bootstrap dict")
        self.name = name
        self.admin_port = admin_port
        self.admin_address = admin_address
        self.log_level = log_level
        self.concurrency = concurrency
        self.config_path = write_config(workdir / f"{name}.yaml", config)
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc.pid

    def start(self, timeout: float = 20.0) -> None:
        self.proc = start_envoy(
            self.config_path,
            base_id=unique_base_id(),
            log_level=self.log_level,
            concurrency=self.concurrency,
            log_path=self.log_path,
        )
        track(self.proc)
        wait_envoy_ready(self.admin_port, proc=self.proc, timeout=timeout, admin_address=self.admin_address)

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=timeout)
            untrack(self.proc)

    def admin_stats(self, timeout: float = 5.0) -> dict[str, str]:
        """Admin /stats as name -> value (text), or {} if the admin port does not answer."""
        url = f"http://{self.admin_address}:{self.admin_port}/stats"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                text = resp.read().decode()
        except (urllib.error.URLError, OSError):
            return {}
        out: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition(": ")
            if sep:
                out[key] = value
        return out


def log_tails(paths: Sequence[tuple[str, Path]], max_chars: int = 4000) -> str:
    """`--- name (path) ---` sections with the end of each existing, non-empty log."""
    parts: list[str] = []
    for title, path in paths:
        if path.exists():
            text = tail(path, max_chars)
            if text.strip():
                parts.append(f"--- {title} ({path}) ---\n{text}")
    return "\n".join(parts)
