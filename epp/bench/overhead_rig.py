"""The processes of one `epp bench overhead` run (backends, epp, one front Envoy per arm), and how a
run ends: raw results to JSON, the processes stopped, their logs on failure. Both modes use it
(epp.bench.overhead and epp.bench.overhead_stream).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from epp.gateway.envoy import BodyMode, GatewayParams, PodsMode, gateway_config, static_backends_config
from epp.gateway.processes import EnvoyServer, EppServer, epp_command, free_ports, log_tails

HOST = "127.0.0.1"


def probe(url: str, body: bytes, *, within: float = 15.0) -> None:
    """One request through a front Envoy must succeed before it is measured (retries bounded)."""
    deadline = time.monotonic() + within
    last = ""
    while time.monotonic() < deadline:
        req = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:200]!r}"
        except (urllib.error.URLError, OSError) as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{url} does not answer 200 (last: {last})")


@dataclasses.dataclass
class Front:
    url: str
    envoy: EnvoyServer


class Rig:
    """The processes of one benchmark run: backends, epp, one front Envoy per arm."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.envoys: list[EnvoyServer] = []
        self.backends: list[str] = []
        self.epp: EppServer | None = None
        self.fronts: dict[str, Front] = {}

    @property
    def epp_address(self) -> str:
        return self.epp.grpc_address if self.epp is not None else ""

    def _envoy(self, name: str, config: dict[str, Any], admin_port: int, concurrency: int) -> EnvoyServer:
        envoy = EnvoyServer(self.workdir, config, admin_port=admin_port, name=name, concurrency=concurrency)
        self.envoys.append(envoy)  # before start(): stop() must cover a start that fails half-way
        envoy.start()
        return envoy

    def start_backends(self) -> None:
        ports = free_ports(self.args.backends + 1, HOST)
        self.backends = [f"{HOST}:{p}" for p in ports[:-1]]
        config = static_backends_config(ports[:-1], ports[-1], address=HOST)
        self._envoy("backends", config, ports[-1], self.args.backend_concurrency)

    def start_epp(self) -> None:
        self.epp = EppServer(
            self.workdir / "epp.log",
            endpoints=self.backends,
            extra_args=["--log-level", "warning", *self.args.epp_arg],
            command=epp_command(self.args.epp_command),
            host=HOST,
        )
        print("epp: " + shlex.join(self.epp.argv), flush=True)
        self.epp.start(timeout=60.0)

    def start_front(self, arm: str, body: bytes) -> None:
        listen, admin = free_ports(2, HOST)
        if arm == "baseline":
            params = GatewayParams(listen_port=listen, admin_port=admin, pods_mode=PodsMode.ROUND_ROBIN,
                                   pod_endpoints=tuple(self.backends))  # fmt: skip
        else:
            params = GatewayParams(
                listen_port=listen,
                admin_port=admin,
                epp_addresses=(self.epp_address,),
                body_mode=BodyMode.FULL_DUPLEX_STREAMED if arm == "duplex" else BodyMode.BUFFERED,
                process_responses=not self.args.no_response_processing,
            )
        envoy = self._envoy(f"front-{arm}", gateway_config(params), admin, self.args.envoy_concurrency)
        url = f"http://{HOST}:{listen}/v1/chat/completions"
        probe(url, body)
        self.fronts[arm] = Front(url, envoy)

    def stop(self) -> None:
        # Fronts first, then epp, then the backends: the reverse of the start order.
        for envoy in reversed(self.envoys[1:]):
            envoy.stop()
        if self.epp is not None:
            self.epp.stop()
        for envoy in self.envoys[:1]:
            envoy.stop()

    def dump_logs(self) -> None:
        logs = [(e.name, e.log_path) for e in self.envoys]
        if self.epp is not None:
            logs.insert(1, ("epp", self.epp.process.log_path))
        text = log_tails(logs)
        if text:
            print(text, file=sys.stderr)


def save_results(output: str | None, stem: str, result: Mapping[str, Any]) -> None:
    """The raw results as JSON: to `output`, else bench-results/<stem>-<UTC time>.json."""
    out_path = (
        Path(output)
        if output
        else Path("bench-results") / time.strftime(f"{stem}-%Y%m%dT%H%M%SZ.json", time.gmtime())
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2, default=str))
    print(f"raw results: {out_path}")


def run_rig(rig: Rig, workdir: Path, args: argparse.Namespace, measure: Callable[[], None]) -> int:
    """Run `measure` on `rig`: 0 when it finishes, 1 (with the processes' log tails) when a
    process or a measurement fails. The rig stops either way; the workdir goes after a success
    unless --keep-workdir or --workdir keeps it."""
    ok = False
    try:
        measure()
        ok = True
        return 0
    except (RuntimeError, TimeoutError, ValueError, OSError, subprocess.SubprocessError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        rig.dump_logs()
        return 1
    finally:
        rig.stop()
        if ok and not args.keep_workdir and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"workdir: {workdir}", file=sys.stderr)
