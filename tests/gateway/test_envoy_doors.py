"""The generated Envoy config's closed doors, on the real Envoy 1.40 with epp down.

- Client-sent control headers (destination, model rewrite, ...) never reach a filter or a
  backend, unless the config lets one through.
- Failing open (`failure_mode_allow`) with epp down, on an ORIGINAL_DST cluster, leads nowhere: a
  client's destination header cannot reach Envoy's admin page, and even a config that trusts
  client destinations refuses the admin port and a loop into Envoy's own listener. Over a list
  of pods (override-host), it reaches the pods, by Envoy's least-request choice.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp import cli
from epp.gateway.envoy import (
    CONTROL_HEADERS,
    DESTINATION_HEADER,
    MODEL_REWRITE_HEADER,
    BodyMode,
    GatewayParams,
    PodsMode,
    find_envoy,
    start_envoy,
    stop_process,
    unique_base_id,
    wait_envoy_ready,
    write_config,
)
from epp.gateway.processes import free_ports

pytestmark = pytest.mark.skipif(find_envoy() is None, reason="envoy binary not found")

OBJECTIVE = "x-gateway-inference-objective"


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers every request with the request headers it received, as JSON."""

    def do_GET(self) -> None:
        seen = {k.lower(): v for k, v in self.headers.items()}
        seen["x-test-served-by"] = "{}:{}".format(*self.server.server_address[:2])
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Gateway:
    def __init__(self, tmp_path: Path, **fields: Any) -> None:
        self.listen, self.admin, dead = free_ports(3)
        self.params = GatewayParams(
            listen_port=self.listen,
            admin_port=self.admin,
            epp_addresses=(f"127.0.0.1:{dead}",),  # epp is down: nothing listens there
            **fields,
        )
        path = write_config(tmp_path / "envoy.yaml", self.params)
        self.proc: subprocess.Popen[bytes] = start_envoy(
            path, base_id=unique_base_id(), log_path=tmp_path / "envoy.log"
        )
        wait_envoy_ready(self.admin, proc=self.proc)

    def get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        return _get(f"http://127.0.0.1:{self.listen}{path}", headers)

    def close(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Any]:
    made: list[Gateway] = []

    def make(**fields: Any) -> Gateway:
        gw = Gateway(tmp_path / str(len(made)), **fields)
        made.append(gw)
        return gw

    for i in range(4):
        (tmp_path / str(i)).mkdir()
    try:
        yield make
    finally:
        for gw in made:
            gw.close()


def test_fail_open_with_epp_down_reaches_neither_admin_nor_a_named_backend(gateways: Any, echo: str) -> None:
    gw = gateways(failure_mode_allow=True, body_mode=BodyMode.BUFFERED)
    status, body = gw.get("/server_info", {DESTINATION_HEADER: f"127.0.0.1:{gw.admin}"})
    assert status != 200 and b"hot_restart_version" not in body
    assert gw.get("/stats", {DESTINATION_HEADER: f"localhost:{gw.admin}"})[0] != 200
    # Any client-named destination is gone before routing: nothing is reached at all.
    assert gw.get("/v1/models", {DESTINATION_HEADER: echo})[0] == 503


def test_fail_open_over_the_pods_list_serves_every_request_with_epp_down(gateways: Any) -> None:
    """What `router.proxy.failOpen` and `envoy.failOpen` build: without epp's pick, Envoy's
    least-request fallback spreads the requests over the listed pods. A client cannot steer it."""
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    pods = tuple(f"127.0.0.1:{s.server_address[1]}" for s in servers)
    try:
        gw = gateways(
            failure_mode_allow=True,
            body_mode=BodyMode.BUFFERED,
            pods_mode=PodsMode.OVERRIDE_HOST,
            pod_endpoints=pods,
        )
        served = []
        for _ in range(20):
            status, body = gw.get("/v1/models", {DESTINATION_HEADER: pods[0]})
            assert status == 200, body
            served.append(json.loads(body)["x-test-served-by"])
        assert set(served) == set(pods), served  # both pods, though the client named the first
        closed = gateways(pods_mode=PodsMode.OVERRIDE_HOST, pod_endpoints=pods, epp_retries=0)
        assert closed.get("/v1/models", {})[0] == 503  # failing closed: no pod without epp
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_the_guard_holds_when_clients_may_name_destinations(gateways: Any, echo: str) -> None:
    gw = gateways(
        failure_mode_allow=True, body_mode=BodyMode.BUFFERED, client_control_headers=(DESTINATION_HEADER,)
    )
    assert gw.get("/v1/models", {DESTINATION_HEADER: echo})[0] == 200  # configured: passes
    for target in (f"127.0.0.1:{gw.admin}", f"0.0.0.0:{gw.admin}", f"127.0.0.1:{gw.listen}"):
        status, body = gw.get("/server_info", {DESTINATION_HEADER: target})
        assert status == 403, target
        assert b"hot_restart_version" not in body


def test_control_headers_from_clients_are_stripped(gateways: Any, echo: str) -> None:
    sent = {h: "127.0.0.1:1" for h in CONTROL_HEADERS} | {OBJECTIVE: "premium"}
    gw = gateways(pods_mode=PodsMode.ROUND_ROBIN, pod_endpoints=(echo,))
    status, body = gw.get("/v1/models", {k.upper(): v for k, v in sent.items()})
    assert status == 200
    received = json.loads(body)
    assert not set(CONTROL_HEADERS) & set(received), received
    assert received[OBJECTIVE] == "premium"  # the client's to choose, as in GIE
    trusting = gateways(
        pods_mode=PodsMode.ROUND_ROBIN, pod_endpoints=(echo,), client_control_headers=(MODEL_REWRITE_HEADER,)
    )
    received = json.loads(trusting.get("/v1/models", sent)[1])
    assert received[MODEL_REWRITE_HEADER] == "127.0.0.1:1"
    assert DESTINATION_HEADER not in received


def _early_removals(config: dict[str, Any]) -> list[str]:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    mutations = hcm.get("early_header_mutation_extensions", [{"typed_config": {"mutations": []}}])
    return [m["remove"] for m in mutations[0]["typed_config"]["mutations"]]


def test_envoy_config_cli_strips_by_default_and_keeps_what_it_is_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "envoy.yaml"
    assert cli.main(["envoy-config", "-o", str(out)]) == 0
    assert _early_removals(yaml.safe_load(out.read_text())) == list(CONTROL_HEADERS)
    assert cli.main(["envoy-config", "-o", str(out), "--client-control-header", MODEL_REWRITE_HEADER]) == 0
    kept = _early_removals(yaml.safe_load(out.read_text()))
    assert kept == [h for h in CONTROL_HEADERS if h != MODEL_REWRITE_HEADER]
    with pytest.raises(SystemExit):
        cli.main(["envoy-config", "--client-control-header", "x-forwarded-for"])
    assert "invalid choice" in capsys.readouterr().err
