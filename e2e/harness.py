"""Real processes for end-to-end tests: simulated model servers, `epp serve`, and a real Envoy.

Topology of one `Stack` (everything on 127.0.0.1, every port picked free at start):

    test client ──HTTP──► Envoy (epp.gateway.envoy config) ──HTTP──► sim backends (this process)
                              │ ext_proc gRPC
                              ▼
                         epp serve (subprocess)  ──scrapes /metrics──► sim backends

Design choices:

* The sims run in-process on a dedicated thread with its own event loop, so fixtures can be
  synchronous, tests can be sync or async, and a test's client never shares a loop with the
  servers it measures.
* epp and Envoy are subprocesses whose output goes to files in the test's tmp dir; `Cleanup`
  stops them in reverse order (SIGTERM, SIGINT for epp so it skips its --drain-delay; then
  SIGKILL after a timeout) even when a test fails, and
  registers their logs so conftest.py can attach them to the failure report.
* Envoy exits with its parent (it sets PR_SET_PDEATHSIG), so the pytest process owns it directly;
  each instance gets its own --base-id.
* The command that runs epp is `python -m epp` unless EPP_E2E_COMMAND (a shell-quoted prefix)
  says otherwise, so the same tests can target another build of the picker. Envoy logs at
  `warning` unless EPP_E2E_ENVOY_LOG_LEVEL says otherwise (each Envoy also writes an access log
  with the upstream host and attempt count, shown with the logs when a test fails).
* Starting and stopping processes, free ports and the sim fleet are shared with the demo and the
  benchmarks (`epp.gateway.processes`, `epp.sim.fleet`); this module adds what only tests need:
  cleanup registration, whole stacks, and client helpers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from epp.gateway import processes
from epp.gateway.envoy import BodyMode, GatewayParams, PodsMode, find_envoy, override_params
from epp.gateway.processes import HOST, EnvoyServer, EppServer, WaitFor, free_ports, tail

# Re-exported for tests that poke at processes or health directly.
from epp.gateway.processes import ManagedProcess as ManagedProcess
from epp.gateway.processes import grpc_health_status as grpc_health_status
from epp.sim.config import LLMD_TOPIC, SimConfig
from epp.sim.fleet import SimFleet

EPP_COMMAND_ENV = "EPP_E2E_COMMAND"
DESTINATION_HEADER = "x-gateway-destination-endpoint"
SERVER_HEADER = "x-sim-server"
RECEIVED_HEADER = "x-sim-received-destination"

# Fast but proportionate: a cold 4k-token prompt prefills in ~6 ms, a token decodes in 0.4 ms.
E2E_SIM = SimConfig(time_scale=0.02)


class Cleanup:
    """Callbacks run in reverse order on close, plus the log files to show if a test fails."""

    def __init__(self) -> None:
        self._callbacks: list[tuple[str, Callable[[], None]]] = []
        self.logs: list[tuple[str, Path]] = []

    def push(self, what: str, callback: Callable[[], None]) -> None:
        self._callbacks.append((what, callback))

    def add_log(self, title: str, path: Path) -> None:
        self.logs.append((title, path))

    def log_sections(self) -> list[tuple[str, str]]:
        return [(f"{title} ({path})", tail(path)) for title, path in self.logs if path.exists()]

    def close(self) -> list[str]:
        errors: list[str] = []
        while self._callbacks:
            what, callback = self._callbacks.pop()
            try:
                callback()
            except Exception as exc:  # keep going: every process must be stopped
                errors.append(f"{what}: {exc!r}")
        return errors


# --- simulated backends ---------------------------------------------------------------------------

# N simulated replicas served by one background thread's event loop (epp.sim.fleet).
SimBackends = SimFleet


# --- epp ------------------------------------------------------------------------------------------


def epp_command() -> list[str]:
    return processes.epp_command(os.environ.get(EPP_COMMAND_ENV))


def parse_prometheus(text: str, name: str) -> dict[str, float]:
    """Samples of metric `name` keyed by their label string ('' if none). Enough for tests."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name) :]
        if rest.startswith("{"):
            labels, _, value = rest[1:].partition("} ")
        elif rest.startswith(" "):
            labels, value = "", rest.strip()
        else:
            continue  # a longer metric name sharing the prefix
        out[labels] = float(value.split()[0])
    return out


class EppProcess(EppServer):
    """`epp serve` as a subprocess on fixed ports, so it can be killed and restarted in place."""

    def __init__(
        self,
        workdir: Path,
        *,
        endpoints: Sequence[str] | None = None,
        endpoints_file: Path | None = None,
        secure: bool = False,
        extra_args: Sequence[str] = (),
        name: str = "epp",
    ) -> None:
        super().__init__(
            workdir / f"{name}.log",
            endpoints=endpoints,
            endpoints_file=endpoints_file,
            secure=secure,
            # The tests read epp's decisions from /debug/* (off by default).
            extra_args=["--refresh-metrics-interval", "50ms", "--enable-debug-api", *extra_args],
            command=epp_command(),
            name=name,
        )

    def inflight(self) -> dict[str, float]:
        return parse_prometheus(self.metrics_text(), "epp_endpoint_inflight_requests")


# --- Envoy ----------------------------------------------------------------------------------------


class EnvoyGateway(EnvoyServer):
    """A real Envoy with the generated gateway config."""

    def __init__(self, workdir: Path, params: GatewayParams, name: str = "envoy") -> None:
        # Info level dumps ~100 lines of extension lists at start; debug it with the env var.
        level = os.environ.get("EPP_E2E_ENVOY_LOG_LEVEL", "warning")
        super().__init__(workdir, params, name=name, log_level=level)
        self.params = params

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.params.listen_port}"

    def stats(self) -> dict[str, str]:
        """Admin /stats as name -> value (text), for diagnostics in assertions."""
        return self.admin_stats()


# --- a whole stack --------------------------------------------------------------------------------


@dataclasses.dataclass
class StackOptions:
    n_backends: int = 2
    sim_configs: Sequence[SimConfig] | None = None  # one per backend; default E2E_SIM
    body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    pods_mode: PodsMode = PodsMode.ORIGINAL_DST
    # "flag": --endpoints; "file": --endpoints-file (YAML); "empty-file": `endpoints: []`;
    # "discovery": llm-d's file-discovery, the sims listed in llm-d's endpoints file, whose path
    # replaces DISCOVERY_FILE in epp_args (the config naming a file-discovery plugin).
    endpoints_source: str = "flag"
    # The endpoints file's `objectives:` (InferenceObjective name -> priority); needs a file source.
    # Each sim's labels in the endpoints file (e.g. llm-d.ai/role), in sim order; needs "file".
    endpoint_labels: Sequence[Mapping[str, str]] = ()
    objectives: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Addresses given to epp (and to Envoy's STATIC clusters) besides the sims, e.g. dead ones.
    extra_endpoints: Sequence[str] = ()
    prepend_extra_endpoints: bool = True
    epp_args: Sequence[str] = ()
    # Control headers Envoy lets clients send (GatewayParams.client_control_headers).
    client_control_headers: Sequence[str] = ()
    epp_tls: bool = False
    epp_wait: WaitFor = "serving"
    num_retries: int = 2
    process_responses: bool = True
    # epp's mode-override gateway (request body BUFFERED, response body STREAMED,
    # allow_mode_override): off-sample responses skip epp. body_mode is then ignored.
    mode_override: bool = False
    # "connect": the sims bind vLLM KV-event publishers (and replay); epp reads an endpoints file
    # naming each publisher and the served model, with --kv-events connect. "bind": epp binds one
    # socket the sims connect to (topic kv@<ip:port>@<model>). Either way epp runs the precise
    # default config. None: no KV events.
    kv_events: str | None = None
    # `epp serve` processes behind the one Envoy (its ext-proc cluster round-robins streams over
    # them); each has its own scheduler state and, with KV events, its own subscriptions.
    epp_replicas: int = 1
    # Envoy gRPC-health-checks the ext-proc cluster (`epp envoy-config`'s default), so a draining
    # epp stops getting new streams.
    epp_health_check: bool = False
    # Envoy routes without epp when it cannot be reached (GatewayParams.failure_mode_allow).
    failure_mode_allow: bool = False


class Stack:
    def __init__(
        self,
        sims: SimBackends,
        epp: EppProcess,
        envoy: EnvoyGateway,
        endpoints: list[str],
        epps: Sequence[EppProcess] = (),
    ) -> None:
        self.sims = sims
        self.epp = epp  # the first replica
        self.epps = list(epps) or [epp]
        self.envoy = envoy
        self.endpoints = endpoints

    @property
    def url(self) -> str:
        return self.envoy.url


def start_stack(workdir: Path, cleanup: Cleanup, options: StackOptions | None = None) -> Stack:
    """Start sims, epp and Envoy; register everything with `cleanup` as soon as it exists."""
    opts = options or StackOptions()
    if opts.epp_replicas < 1 or (opts.epp_replicas > 1 and opts.kv_events == "bind"):
        raise ValueError("epp_replicas: >= 1, and 1 in bind mode (the sims connect to one address)")
    workdir.mkdir(parents=True, exist_ok=True)
    configs = list(opts.sim_configs) if opts.sim_configs is not None else [E2E_SIM] * opts.n_backends
    bind_port = 0
    if opts.kv_events == "connect":
        configs = [
            dataclasses.replace(c, kv_events=f"tcp://{HOST}:0", kv_replay=f"tcp://{HOST}:0") for c in configs
        ]
    elif opts.kv_events == "bind":
        (bind_port,) = free_ports(1)
        # one bound socket for every sim: llm-d's topics tell them apart
        configs = [
            dataclasses.replace(c, kv_events=f"tcp://{HOST}:{bind_port}", kv_topic=LLMD_TOPIC)
            for c in configs
        ]
    sims = SimBackends(configs)
    cleanup.push("sim backends", sims.stop)
    sims.start()
    extra = list(opts.extra_endpoints)
    endpoints = [*extra, *sims.addresses] if opts.prepend_extra_endpoints else [*sims.addresses, *extra]

    endpoints_file: Path | None = None
    epp_args = list(opts.epp_args)
    if opts.kv_events == "bind":
        epp_args = ["--kv-events", "bind", "--kv-events-bind", f"tcp://{HOST}:{bind_port}", *epp_args]
    elif opts.kv_events == "connect":
        endpoints_file = workdir / "endpoints.yaml"
        entries: list[Any] = [*extra] if opts.prepend_extra_endpoints else []
        for address, cfg, events, replay in zip(
            sims.addresses, configs, sims.kv_endpoints, sims.kv_replay_endpoints, strict=True
        ):
            entries.append(
                {"address": address, "model": cfg.served_model, "kvEvents": events, "kvReplay": replay}
            )
        if not opts.prepend_extra_endpoints:
            entries += extra
        endpoints_file.write_text(yaml.safe_dump({"endpoints": entries}))
        epp_args = ["--kv-events", "connect", *epp_args]
    elif opts.endpoints_source == "discovery":
        discovery = workdir / "discovery.yaml"
        entries = []
        for i, address in enumerate(endpoints):
            host, _, port = address.rpartition(":")
            entries.append({"name": f"sim-{i}", "address": host, "port": port})
        discovery.write_text(yaml.safe_dump({"endpoints": entries}))
        epp_args = [a.replace("DISCOVERY_FILE", str(discovery)) for a in epp_args]
    elif opts.endpoints_source != "flag":
        endpoints_file = workdir / "endpoints.yaml"
        # epp's YAML format; `endpoints: []` is a valid empty pool (a 0-byte file is rejected).
        listed: list[Any] = [] if opts.endpoints_source == "empty-file" else list(endpoints)
        for i, labels in enumerate(opts.endpoint_labels):
            address = sims.addresses[i]
            listed[listed.index(address)] = {"address": address, "labels": dict(labels)}
        document: dict[str, Any] = {"endpoints": listed}
        if opts.objectives:
            document["objectives"] = dict(opts.objectives)
        endpoints_file.write_text(yaml.safe_dump(document))
    epps: list[EppProcess] = []
    for i in range(opts.epp_replicas):
        name = "epp" if i == 0 else f"epp-{i + 1}"
        epp = EppProcess(
            workdir,
            endpoints=endpoints if endpoints_file is None and opts.endpoints_source != "discovery" else None,
            endpoints_file=endpoints_file,
            secure=opts.epp_tls,
            extra_args=epp_args,
            name=name,
        )
        cleanup.add_log(f"{name} log", epp.process.log_path)
        cleanup.push(name, epp.stop)
        epp.start(wait=opts.epp_wait)
        epps.append(epp)
    epp = epps[0]

    listen, admin = free_ports(2)
    params = GatewayParams(
        listen_port=listen,
        admin_port=admin,
        epp_addresses=tuple(e.grpc_address for e in epps),
        pods_mode=opts.pods_mode,
        pod_endpoints=tuple(endpoints) if opts.pods_mode is not PodsMode.ORIGINAL_DST else (),
        body_mode=BodyMode.BUFFERED if opts.mode_override else opts.body_mode,
        process_responses=opts.process_responses,
        epp_tls=opts.epp_tls,
        epp_health_check=opts.epp_health_check,
        failure_mode_allow=opts.failure_mode_allow,
        num_retries=opts.num_retries,
        client_control_headers=tuple(opts.client_control_headers),
        route_timeout=60.0,
        access_log_path=str(workdir / "access.log"),
    )
    if opts.mode_override:
        params = override_params(params)
    envoy = EnvoyGateway(workdir, params)
    cleanup.add_log("envoy log", envoy.log_path)
    cleanup.add_log("envoy access log", workdir / "access.log")
    cleanup.push("envoy", envoy.stop)
    envoy.start()
    if opts.kv_events:
        # A PUB socket drops what it sends before a subscriber is there: wait for epp's.
        deadline = time.monotonic() + 15.0
        while min(sims.kv_subscriptions()) < len(epps):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"epp never subscribed to every sim publisher: {sims.kv_subscriptions()}"
                )
            time.sleep(0.05)
    return Stack(sims, epp, envoy, endpoints, epps)


# --- client helpers -------------------------------------------------------------------------------


@dataclasses.dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def served_by(self) -> str:
        return self.headers.get(SERVER_HEADER, "")

    @property
    def received_destination(self) -> str:
        return self.headers.get(RECEIVED_HEADER, "")


async def request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    body: Any = None,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    total: float = 30.0,
) -> Reply:
    kwargs: dict[str, Any] = {"headers": dict(headers or {}), "timeout": aiohttp.ClientTimeout(total=total)}
    if body is not None:
        kwargs["json"] = body
    elif data is not None:
        kwargs["data"] = data
        kwargs["headers"].setdefault("content-type", "application/json")
    async with session.request(method, url, **kwargs) as resp:
        payload = await resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, payload)


def sse_events(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    events: list[str] = []
    for block in text.split("\n\n"):
        data = [line[5:].lstrip() for line in block.splitlines() if line.startswith("data:")]
        if data:
            events.append("\n".join(data))
    return events


async def wait_routable(session: aiohttp.ClientSession, url: str, *, within: float = 15.0) -> Reply:
    """Retry GET /v1/models through the gateway until a backend answers 200 (bounded)."""
    deadline = time.monotonic() + within
    last: Reply | None = None
    while time.monotonic() < deadline:
        try:
            last = await request(session, "GET", f"{url}/v1/models", total=5)
            if last.status == 200:
                return last
        except (TimeoutError, aiohttp.ClientError):
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"gateway {url} never routed GET /v1/models (last: {last})")


async def eventually(
    check: Callable[[], bool], *, within: float = 10.0, interval: float = 0.1, what: str = "condition"
) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(interval)
    if not check():
        raise AssertionError(f"{what} not reached within {within}s")


def envoy_available() -> bool:
    return find_envoy() is not None


def epp_serve_available() -> tuple[bool, str]:
    """Whether `python -m epp serve` can run here (or EPP_E2E_COMMAND overrides it)."""
    if os.environ.get(EPP_COMMAND_ENV):
        return True, ""
    import importlib.util

    if importlib.util.find_spec("epp.__main__") is None:
        return False, "epp/__main__.py does not exist yet (`epp serve` not landed)"
    return True, ""
