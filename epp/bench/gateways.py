"""What live mode's client sends its requests to: epp behind Envoy, or a real peer router.

`EppGateway` is epp as users run it: an `epp serve` subprocess with the policy's
EndpointPickerConfig and an endpoints file naming each pod, behind a real Envoy (ext-proc
FULL_DUPLEX_STREAMED, ORIGINAL_DST to the pod epp names). `PeerGateway` is one of the peers'
binaries (`epp.bench.peers`) with the pods as its workers. Both are started once the fleet runs,
answer `GET /v1/models` before the run starts, and report the CPU seconds their processes used
(epp's workers and Envoy included for epp; the peer and its children for a peer), which the
report divides by the requests served.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from epp.bench.measure import cpu_seconds
from epp.bench.peers import Launch, Peer
from epp.bench.policies import Policy
from epp.scheduling import config_compat

if TYPE_CHECKING:
    from epp.gateway.processes import EnvoyServer, EppServer, ManagedProcess
    from epp.sim.fleet import SimFleet

HOST = "127.0.0.1"
REQUEST_TIMEOUT_S = 3600.0
"""Wall seconds one request may take, in Envoy's route and in the client."""
OBJECTIVE_PREFIX = "priority-"


class Gateway(abc.ABC):
    """One arm's router in front of the fleet; `start` once, then `stop` (idempotent)."""

    name: str
    kv_events: bool  # the fleet must publish KV events

    def __init__(self) -> None:
        self.logs: list[tuple[str, Path]] = []  # (what, log file) of every process started
        self.metrics_url = ""  # the router's Prometheus page, once it runs

    @abc.abstractmethod
    def start(self, fleet: SimFleet, workdir: Path, label: str) -> str:
        """Start in front of `fleet` (files and logs under `workdir`, named after `label`); returns
        the base URL requests go to, once it routes."""

    @abc.abstractmethod
    def pids(self) -> list[int]:
        """The processes whose CPU time is the router's cost (children are counted with them)."""

    def cpu_seconds(self) -> float:
        """CPU seconds the router's processes have used so far."""
        return sum(cpu_seconds(pid) for pid in self.pids())

    def save(self, workdir: Path, label: str) -> None:  # noqa: B027 (optional hook)
        """Write the router's own counters next to its logs, for whoever reads them."""

    @abc.abstractmethod
    def stop(self) -> None: ...


def _has_flow_control(config_text: str) -> bool:
    """Whether the config's `featureGates` turn flow control on, read as epp serve reads them."""
    doc = yaml.safe_load(config_text)
    gates = doc.get("featureGates") if isinstance(doc, dict) else None
    flow, _ = config_compat.feature_gates([str(g) for g in gates or []], lambda _at, msg: ValueError(msg))
    return flow


class EppGateway(Gateway):
    """Envoy, then `epp serve` with `policy`'s configuration."""

    def __init__(
        self, policy: Policy, *, mode_override: bool = False, extra_args: Sequence[str] = ()
    ) -> None:
        """`mode_override`: behind epp's own Envoy config (`override_params`) instead of GIE's;
        `extra_args`: more `epp serve` arguments."""
        super().__init__()
        self.policy = policy
        self.mode_override = mode_override
        self.extra_args = list(extra_args)
        self.name = policy.name
        self.kv_events = policy.kv_events
        # Whether the bench reads epp's /metrics for flow control's queues while it runs: only
        # then, since rendering the page costs epp CPU that would be charged to its requests.
        self.flow_control = _has_flow_control(policy.config_text())
        self._epp: EppServer | None = None
        self._envoy: EnvoyServer | None = None

    def serve_args(self) -> list[str]:
        """`epp serve`'s arguments for the policy (beside its endpoints file)."""
        extra = ["--log-level", "warning", "--config-text", self.policy.config_text()]
        # As fast mode loads them (epp.bench.fast): the policies are the benchmark's own, and some
        # use plugins llm-d marks Alpha (priority-holdback-policy in the flow-control ones).
        extra.append("--allow-experimental-plugins")
        if self.kv_events:
            extra += ["--kv-events", "connect"]
        if not self.policy.paced:
            # A peer's rule reads the pods as its router does, every refresh (epp.bench.policies).
            extra += ["--booked-metrics-interval", "0"]
        return extra + self.extra_args

    def start(self, fleet: SimFleet, workdir: Path, label: str) -> str:
        from epp.demo.arms import endpoints_yaml, wait_subscribed
        from epp.demo.workload import wait_routable
        from epp.gateway.envoy import BodyMode, GatewayParams, override_params
        from epp.gateway.processes import EnvoyServer, EppServer, free_ports

        endpoints = workdir / f"endpoints-{label}.yaml"
        # The objectives `priority-<n>` fast mode's Director knows (epp.bench.fast._Objectives).
        objectives = "objectives:\n" + "".join(f"  {OBJECTIVE_PREFIX}{n}: {n}\n" for n in range(-10, 11))
        endpoints.write_text(endpoints_yaml(fleet) + objectives)
        subscribed = fleet.kv_subscriptions()
        self._epp = epp = EppServer(
            workdir / f"epp-{label}.log", endpoints_file=endpoints, extra_args=self.serve_args()
        )
        self.logs.append((f"epp ({label})", epp.process.log_path))
        epp.start(timeout=60.0)
        if self.kv_events:
            wait_subscribed(fleet, subscribed, within=30.0)
        listen, admin = free_ports(2)
        params = GatewayParams(
            listen_port=listen,
            admin_port=admin,
            epp_addresses=(epp.grpc_address,),
            body_mode=BodyMode.FULL_DUPLEX_STREAMED,
            route_timeout=REQUEST_TIMEOUT_S,
            request_timeout=REQUEST_TIMEOUT_S,  # flow control may hold a request up to its budget
            access_log_path=str(workdir / f"access-{label}.log"),
        )
        if self.mode_override:
            params = override_params(params)
        self._envoy = envoy = EnvoyServer(workdir, params, name=f"envoy-{label}")
        self.logs.append((f"envoy ({label})", envoy.log_path))
        envoy.start()
        base_url = f"http://{HOST}:{listen}"
        asyncio.run(wait_routable(base_url, within=30.0))
        self.metrics_url = f"http://{HOST}:{epp.metrics_port}/metrics"
        return base_url

    def pids(self) -> list[int]:
        return [p.pid for p in (self._epp.process if self._epp else None, self._envoy) if p is not None]

    def save(self, workdir: Path, label: str) -> None:
        # epp's and Envoy's counters (decisions, stream errors, ext-proc failures).
        if self._epp is not None:
            (workdir / f"epp-{label}.metrics").write_text(self._epp.metrics_text())
        if self._envoy is not None:
            stats = self._envoy.admin_stats()
            (workdir / f"envoy-{label}.stats").write_text("".join(f"{k}: {v}\n" for k, v in stats.items()))

    def stop(self) -> None:
        if self._envoy is not None:
            self._envoy.stop()
        if self._epp is not None:
            self._epp.stop()


class PeerGateway(Gateway):
    """A peer's router binary with the fleet's pods as its workers."""

    def __init__(self, peer: Peer, peers_dir: Path, extra_args: Sequence[str] = ()) -> None:
        """`extra_args`: appended to the peer's command line (`epp bench --peer-arg`)."""
        super().__init__()
        if not peer.installed(peers_dir):
            raise RuntimeError(
                f"{peer.name}: {peer.package} is not installed under {peers_dir}: "
                "run `bash scripts/peers-env` (or give --peers-dir)"
            )
        self.peer = peer
        self.peers_dir = peers_dir
        self.name = peer.name
        self.kv_events = peer.kv_events
        self.extra_args = list(extra_args)
        self._process: ManagedProcess | None = None

    def start(self, fleet: SimFleet, workdir: Path, label: str) -> str:
        from epp.demo.arms import wait_subscribed

        subscribed = fleet.kv_subscriptions()
        base_url = self.launch(
            [f"http://{address}" for address in fleet.addresses],
            fleet.kv_endpoints,
            block_size=fleet.configs[0].block_size,
            model=fleet.configs[0].served_model,
            log=workdir / f"{label}.log",
            label=label,
        )
        if self.kv_events:  # as for epp: its index must not miss the run's first events
            wait_subscribed(fleet, subscribed, within=30.0, who=self.name)
        return base_url

    def launch(
        self,
        workers: Sequence[str],
        kv_events: Sequence[str | None],
        *,
        block_size: int,
        model: str,
        log: Path,
        label: str,
        settle_s: float = 0.0,
    ) -> str:
        """Start the router in front of `workers` (http://host:port; `kv_events` each one's
        KV-event endpoint) with the benchmark's command line, logging to `log`; returns its URL
        once it routes. `start` calls it for a fleet; the fidelity test for real vLLM pods too.
        `settle_s`: how long after the start the first readiness probe goes (a probe answered 503
        before the workers register is an ERROR line in smg's log)."""
        from epp.demo.workload import wait_routable
        from epp.gateway.processes import ManagedProcess, free_ports

        port, metrics_port = free_ports(2)
        at = Launch(HOST, port, metrics_port, workers, kv_events, block_size, model)
        argv = [*self.peer.argv(self.peers_dir, at), *self.extra_args]
        self._process = ManagedProcess(self.name, argv, log, env=self.peer.env())
        self.logs.append((f"{self.name} ({label})", log))
        self._process.start()
        base_url = f"http://{HOST}:{port}"
        time.sleep(settle_s)
        asyncio.run(wait_routable(base_url, within=60.0))
        self.metrics_url = f"http://{HOST}:{metrics_port}/metrics"
        return base_url

    def pids(self) -> list[int]:
        return [self._process.pid] if self._process is not None else []

    def save(self, workdir: Path, label: str) -> None:
        import urllib.request

        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
                (workdir / f"{label}.metrics").write_bytes(resp.read())
        except OSError as exc:  # counters for the log reader only: their absence is not a failure
            (workdir / f"{label}.metrics").write_text(f"# could not read {self.metrics_url}: {exc}\n")

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
