"""The real peer routers see `epp sim` as they see vLLM 0.32: nothing they log differs.

`epp bench --mode live` runs smg, sglang-router and vllm-router in front of simulated pods, and
their numbers mean something only if they treat those pods as vLLM: a router that cannot register
a worker, reads no load, falls back to another rule or finds no KV events says so in its log (a
WARN or ERROR line), or routes worse without a word. So each arm (`epp.bench.peers.PEERS`,
started by the benchmark's own `PeerGateway`) runs twice with the same requests: in front of two
of the session's real vLLM pods, then of two `epp sim` pods serving the same model name,
tokenizer and block size. Every request must succeed on both, every WARN or ERROR line the router logs against
the simulator (addresses, numbers and timestamps masked) must also appear against vLLM, and a
router that reads KV events must have subscribed to every simulated pod's (a subscriber on the
wrong topic or socket gets nothing and says nothing).

Each arm stays up for `HOLD_S`, past smg's 10 s load-monitor period, so its first reading of the
pods' /metrics is in the log.

The one difference allowed (`KNOWN`) comes from how these vLLM pods run, not from the simulator:
they set `VLLM_SERVER_DEV_MODE=1` (for /reset_prefix_cache), which also serves `/server_info`; a
production vLLM answers it 404, as the simulator does, and sglang-router then warns that it falls
back to SGLang's older route (docs/simulator.md#the-routes-against-vllm-032).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

import pytest

from e2e.vllm.fleet import BLOCK_SIZE
from e2e.vllm.stack import MODEL, VllmStack
from epp.bench.gateways import PeerGateway
from epp.bench.peers import PEERS, Peer, peers_dir
from epp.gateway.processes import HOST
from epp.sim.engine import SimConfig
from epp.sim.fleet import SimFleet

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

HOLD_S = 11.0
# The readiness probe waits this long: smg answers a request that comes before it has registered
# its workers with 503 and logs an ERROR, on vLLM or the simulator alike, as registration races it.
SETTLE_S = 3.0
KNOWN = (re.compile(r"Endpoint '/server_info' returned N, falling back to '/get_server_info'"),)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LEVEL = re.compile(r"\b(WARN|WARNING|ERROR)\b")
_STAMP = re.compile(r"^\S*\d{4}-\d\d-\d\d[T ][\d:.]+Z?\s*")
_ADDRESS = re.compile(r"(tcp://)?(\d{1,3}\.){3}\d{1,3}(:\d+)?|localhost:\d+")
_NUMBER = re.compile(r"\d+(\.\d+)?")


def notices(log: str) -> set[str]:
    """The WARN and ERROR lines of a router's log, timestamps gone and addresses and numbers
    masked (ports, ids and counts differ from run to run)."""
    out = set()
    for line in _ANSI.sub("", log).splitlines():
        if line.startswith("===") or not _LEVEL.search(line):
            continue
        text = _NUMBER.sub("N", _ADDRESS.sub("ADDR", _STAMP.sub("", line.strip())))
        out.add(text)
    return out


async def _requests(base: str) -> list[int]:
    """The same few requests on every arm: completions, chat, a streamed chat, a shared prefix."""
    import aiohttp

    prefix = "The quick brown fox jumps over the lazy dog near the river bank. " * 12
    bodies = [
        ("/v1/completions", {"model": MODEL, "prompt": prefix + "One", "max_tokens": 4}),
        ("/v1/completions", {"model": MODEL, "prompt": prefix + "Two", "max_tokens": 4}),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": prefix}], "max_tokens": 4},
        ),
        (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "stream": True,
            },
        ),
    ]
    statuses = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for path, body in bodies:
            async with session.post(
                base + path, data=json.dumps(body), headers={"content-type": "application/json"}
            ) as r:
                await r.read()
                statuses.append(r.status)
    return statuses


def _arm(
    peer: Peer, workers: list[str], kv_events: list[str | None], workdir: Path, label: str
) -> tuple[list[int], set[str]]:
    gateway = PeerGateway(peer, peers_dir())
    log = workdir / f"{peer.name}-{label}.log"
    started = time.monotonic()
    try:
        base = gateway.launch(
            workers, kv_events, block_size=BLOCK_SIZE, model=MODEL, log=log, label=label, settle_s=SETTLE_S
        )
        statuses = asyncio.run(_requests(base))
        time.sleep(max(0.0, HOLD_S - (time.monotonic() - started)))
        # Read before the stop: what a router logs while shutting down is not about its workers.
        seen = notices(log.read_text(errors="replace"))
    finally:
        gateway.stop()
    return statuses, seen


@pytest.mark.parametrize("name", sorted(PEERS))
def test_peer_logs_nothing_against_the_simulator_it_does_not_against_vllm(
    name: str, stack: VllmStack, tmp_path: Path
) -> None:
    peer = PEERS[name]
    if not peer.installed(peers_dir()):
        message = f"no {peer.venv} venv under {peers_dir()}: run `bash scripts/peers-env` first"
        if os.environ.get("CI") == "true":  # scripts/test builds them under CI: never a silent skip
            pytest.fail(message)
        pytest.skip(message)
    pods = stack.pods[:2]  # their publishers are bound directly (pod-2's goes through a forwarder)
    on_vllm = _arm(peer, [p.url for p in pods], [p.kv_events for p in pods], tmp_path, "vllm")
    configs = [
        SimConfig(name=f"sim-{i}", served_model=MODEL, block_size=BLOCK_SIZE, kv_events=f"tcp://{HOST}:0")
        for i in range(2)
    ]
    with SimFleet(configs) as fleet:
        workers = [f"http://{a}" for a in fleet.addresses]
        on_sim = _arm(peer, workers, list(fleet.kv_endpoints), tmp_path, "sim")
        subscribed = fleet.kv_subscriptions()
    if peer.kv_events:  # a subscriber on the wrong topic or socket would log nothing
        assert all(subscribed), f"{name} did not subscribe to every pod's KV events: {subscribed}"
    assert on_vllm[0] == [200] * 4, on_vllm
    assert on_sim[0] == [200] * 4, on_sim
    only_sim = {line for line in on_sim[1] - on_vllm[1] if not any(k.search(line) for k in KNOWN)}
    assert not only_sim, {"only against epp sim": sorted(only_sim), "against vLLM": sorted(on_vllm[1])}
