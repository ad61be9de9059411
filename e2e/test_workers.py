"""`epp serve --workers 2` behind a real Envoy: both workers route, one /metrics adds them up,
the supervisor scrapes and consumes the KV events once for the pod and both workers read them,
a killed worker comes back, SIGTERM drains both.

The stack is built here rather than by `start_stack`: the gateway must open many connections
(Envoy's `max_concurrent_streams` of 1 towards epp) so the kernel's SO_REUSEPORT spread reaches
both workers in a few requests, whatever the hash.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import ssl
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from e2e.harness import (
    E2E_SIM,
    Cleanup,
    EnvoyGateway,
    EppProcess,
    SimBackends,
    eventually,
    parse_prometheus,
    request,
    wait_routable,
)
from epp.gateway.envoy import GatewayParams, PodsMode
from epp.gateway.processes import HOST, free_ports
from epp.sim.engine import SimConfig

PROMPT = "Workers share the port. " * 60  # a few KV blocks per request


@dataclasses.dataclass
class WorkerStack:
    sims: SimBackends
    epp: EppProcess
    envoy: EnvoyGateway

    @property
    def url(self) -> str:
        return self.envoy.url

    def metrics(self) -> str:
        return self.epp.metrics_text()

    def worker_pids(self) -> dict[int, int]:
        """Worker index -> pid, from the supervisor's children's environment."""
        out: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != self.epp.process.pid:
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            except (OSError, ValueError, IndexError):
                continue
            if b"EPP_WORKER_INDEX" in env:
                out[int(env[b"EPP_WORKER_INDEX"])] = int(entry)
        return out


def wait_workers_ready(epp: EppProcess, n: int = 2, within: float = 60.0) -> None:
    """`epp.start()` returns when the pod is ready: one worker. The tests want every one."""
    want = {f'worker="{i}"': 1.0 for i in range(n)}
    deadline = time.monotonic() + within
    while parse_prometheus(epp.metrics_text(), "epp_worker_ready") != want:
        assert time.monotonic() < deadline, f"{n} workers ready within {within}s"
        time.sleep(0.1)


def start(workdir: Path, cleanup: Cleanup, sim: SimConfig = E2E_SIM) -> WorkerStack:
    workdir.mkdir(parents=True, exist_ok=True)
    configs = [dataclasses.replace(sim, kv_events=f"tcp://{HOST}:0", kv_replay=f"tcp://{HOST}:0")] * 2
    sims = SimBackends(configs)
    cleanup.push("sims", sims.stop)
    sims.start()
    endpoints_file = workdir / "endpoints.yaml"
    entries = [
        {"address": a, "model": c.served_model, "kvEvents": e, "kvReplay": r}
        for a, c, e, r in zip(
            sims.addresses, configs, sims.kv_endpoints, sims.kv_replay_endpoints, strict=True
        )
    ]
    endpoints_file.write_text(yaml.safe_dump({"endpoints": entries}))
    epp = EppProcess(
        workdir,
        endpoints_file=endpoints_file,
        # A 1 s --drain-delay (default 5 s): the SIGTERM test's ~4 s streams must outlive the
        # delay, so the workers' drain itself is what lets them finish.
        extra_args=[
            *("--kv-events", "connect", "--workers", "2"),
            *("--drain-delay", "1s", "--drain-timeout", "30s"),
        ],
    )
    cleanup.add_log("epp log", epp.process.log_path)
    cleanup.push("epp", epp.stop)
    epp.start()
    wait_workers_ready(epp)
    listen, admin = free_ports(2)
    params = GatewayParams(
        listen_port=listen,
        admin_port=admin,
        epp_addresses=(epp.grpc_address,),
        pods_mode=PodsMode.ORIGINAL_DST,
        route_timeout=60.0,
        epp_streams_per_connection=1,
        access_log_path=str(workdir / "access.log"),
    )
    envoy = EnvoyGateway(workdir, params)
    cleanup.add_log("envoy log", envoy.log_path)
    cleanup.push("envoy", envoy.stop)
    envoy.start()
    return WorkerStack(sims, epp, envoy)


async def complete(session: aiohttp.ClientSession, url: str, i: int, max_tokens: int = 20) -> int:
    reply = await request(
        session,
        "POST",
        f"{url}/v1/completions",
        body={"model": "sim-model", "prompt": f"{PROMPT} #{i}", "max_tokens": max_tokens, "stream": True},
    )
    assert reply.status == 200, (reply.status, reply.text[:500])
    assert "[DONE]" in reply.text
    return reply.status


async def test_two_workers_share_the_port_metrics_events_and_restarts(
    tmp_path: Path, cleanup: Cleanup, session: aiohttp.ClientSession
) -> None:
    stack = start(tmp_path, cleanup)
    # One subscriber per pod's KV-event publisher: the supervisor's (epp.workers.shared_kv).
    await eventually(lambda: min(stack.sims.kv_subscriptions()) >= 1, within=20, what="a subscriber per pod")
    await wait_routable(session, stack.url)
    sent = 1  # wait_routable's
    for round_ in range(2):
        await asyncio.gather(*(complete(session, stack.url, 100 * round_ + i) for i in range(16)))
        sent += 16

    text = stack.metrics()
    per_worker = parse_prometheus(text, "epp_worker_requests_total")
    assert set(per_worker) == {'worker="0"', 'worker="1"'}
    assert min(per_worker.values()) > 0, per_worker  # both workers routed streams
    routed = sum(parse_prometheus(text, "inference_objective_request_total").values())
    assert routed == sum(per_worker.values()) >= sent - 1, (routed, per_worker, sent)
    assert parse_prometheus(text, "epp_workers") == {"": 2.0}
    # GIE's series keep their type line: one family, no per-worker label.
    assert "# TYPE inference_objective_request_total counter" in text
    assert "worker=" not in "".join(line for line in text.splitlines() if line.startswith("inference_"))

    # The pod consumed the KV events once, into the index both workers read.
    assert max(stack.sims.kv_subscriptions()) == 1, stack.sims.kv_subscriptions()
    assert sum(parse_prometheus(text, "epp_kv_events_blocks_total").values()) > 0
    for index in (0, 1):
        async with session.get(
            f"http://{HOST}:{stack.epp.metrics_port}/worker/metrics", headers={"X-Epp-Worker": str(index)}
        ) as resp:
            assert resp.status == 200
            assert resp.headers["X-Epp-Worker"] == str(index)
            own = await resp.text()
        assert parse_prometheus(own, "epp_kv_index_entries")[""] > 0, (index, own[:2000])

    # The debug endpoints answer through the supervisor, from the worker the header names.
    async with session.get(
        f"http://{HOST}:{stack.epp.metrics_port}/debug/endpoints", headers={"X-Epp-Worker": "1"}
    ) as resp:
        assert resp.status == 200
        assert resp.headers["X-Epp-Worker"] == "1"
        assert len((await resp.json())["endpoints"]) == 2
    # Every worker's log lines say which worker wrote them.
    log = stack.epp.process.log_text(max_chars=200_000)
    assert '"worker":0' in log.replace(" ", "") and '"worker":1' in log.replace(" ", "")
    # The pod scrapes the model servers once, in the supervisor; the workers follow its scrapes.
    scrapers = [line for line in log.splitlines() if "scraping /metrics of" in line]
    assert len(scrapers) == 1 and '"worker"' not in scrapers[0], scrapers
    # Each process froze its start-up objects for the garbage collector once serving (epp.garbage).
    settled = [line for line in log.splitlines() if "start-up objects frozen" in line]
    assert sum('"worker"' not in line for line in settled) == 1, settled  # the supervisor
    assert sum('"worker":' in line.replace(" ", "") for line in settled) == 2, settled
    for index in (0, 1):
        async with session.get(
            f"http://{HOST}:{stack.epp.metrics_port}/debug/endpoints", headers={"X-Epp-Worker": str(index)}
        ) as resp:
            listed = (await resp.json())["endpoints"]
        assert all(0 <= ep["metrics_age_seconds"] < 2 for ep in listed), (index, listed)

    # A crashed worker is restarted (and counted); the pod keeps serving meanwhile.
    pids = stack.worker_pids()
    assert set(pids) == {0, 1}
    os.kill(pids[1], signal.SIGKILL)
    # Streams a crashed worker had answered fail (none are here). New ones sent at once must not:
    # the kernel gives Envoy's new connections to the live worker, and a stream that fails on a
    # connection to the dead one before epp answered is tried again (the generated config's
    # ext-proc retries).
    for batch in range(3):
        await asyncio.gather(*(complete(session, stack.url, 300 + 8 * batch + i) for i in range(8)))
    await eventually(
        lambda: parse_prometheus(stack.metrics(), "epp_worker_restarts_total").get('worker="1"') == 1.0,
        within=20,
        what="worker 1 restarted",
    )
    await eventually(
        lambda: parse_prometheus(stack.metrics(), "epp_worker_ready").get('worker="1"') == 1.0,
        within=30,
        what="worker 1 ready again",
    )
    assert stack.worker_pids()[1] != pids[1]
    assert stack.worker_pids()[0] == pids[0]
    after = sum(parse_prometheus(stack.metrics(), "inference_objective_request_total").values())
    assert after >= routed + 24, (after, routed)  # the dead worker's count did not vanish


async def test_sigterm_drains_streams_on_every_worker(
    tmp_path: Path, cleanup: Cleanup, session: aiohttp.ClientSession
) -> None:
    # 4 ms per token: a 1000-token stream runs ~4 s, long enough to be cut by a drain that fails.
    stack = start(tmp_path, cleanup, dataclasses.replace(E2E_SIM, time_scale=0.2))
    await wait_routable(session, stack.url)
    streams = [asyncio.create_task(complete(session, stack.url, i, max_tokens=1000)) for i in range(16)]
    before = parse_prometheus(stack.metrics(), "epp_worker_requests_total")

    def both_streaming() -> bool:
        text = stack.metrics()
        now = parse_prometheus(text, "epp_worker_requests_total")
        routed = all(now.get(k, 0) > before.get(k, 0) for k in ('worker="0"', 'worker="1"'))
        # Every stream in flight: one SIGTERM catches before it reaches epp is refused (as it
        # should be: the pod is going away), which is not what this test is about.
        return routed and sum(parse_prometheus(text, "epp_extproc_active_streams").values()) == 16

    await eventually(both_streaming, within=20, what="16 streams in flight, on both workers")
    os.kill(stack.epp.process.pid, signal.SIGTERM)
    assert await asyncio.gather(*streams) == [200] * 16  # every stream ran to its end
    proc = stack.epp.process.proc
    assert proc is not None
    await eventually(lambda: proc.poll() is not None, within=30, what="the supervisor exits")
    assert proc.returncode == 0
    assert "stream(s) cut" in stack.epp.process.log_text()
    assert "0 stream(s) cut" in stack.epp.process.log_text()


def test_the_workers_present_one_certificate_and_write_no_files(
    tmp_path: Path, cleanup: Cleanup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TLS with epp's self-signed default: the supervisor makes the pod's one certificate, so a
    # client sees the same one whichever worker the kernel hands its connection to. And nothing
    # goes to a temp dir: GIE's chart runs epp on a read-only root without a writable /tmp.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    epp = EppProcess(tmp_path, endpoints=["127.0.0.1:1"], secure=True, extra_args=["--workers", "2"])
    cleanup.add_log("epp log", epp.process.log_path)
    cleanup.push("epp", epp.stop)
    epp.start(wait="serving")
    wait_workers_ready(epp)
    certs = {ssl.get_server_certificate((HOST, epp.grpc_port), timeout=5) for _ in range(16)}
    assert len(certs) == 1
    assert parse_prometheus(epp.metrics_text(), "epp_workers") == {"": 2.0}  # the sockets work
    assert list(tmp.iterdir()) == []


def test_a_config_every_worker_refuses_stops_the_pod(tmp_path: Path, cleanup: Cleanup) -> None:
    epp = EppProcess(
        tmp_path, endpoints=["127.0.0.1:1"], extra_args=["--workers", "2", "--config-text", "plugins: 7"]
    )
    cleanup.push("epp", epp.stop)
    epp.process.start()
    proc = epp.process.proc
    assert proc is not None
    assert proc.wait(timeout=60) == 2  # the workers' own exit code, not a restart loop
    log = epp.process.log_text()
    assert "before it started serving" in log
    assert "restarting" not in log
