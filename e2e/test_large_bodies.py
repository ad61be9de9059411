"""A real `epp serve` paces large bodies and parses them in its body-parser process (issue 19):
the flags reach the limits, a second large body waits unread for the one lane, the waits are
counted, and small requests pass meanwhile."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from e2e.harness import EppProcess, parse_prometheus
from epp.sim.engine import SimConfig
from epp.sim.fleet import SimFleet
from tests.extproc import helpers as h

SMALL = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _chat(n: int) -> bytes:
    msgs = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "w " * 400}
        for i in range(n)
    ]
    return json.dumps({"model": "sim-model", "messages": msgs}).encode()


def _routed(resp: object) -> bool:
    return not resp.HasField("immediate_response")  # type: ignore[attr-defined]


async def _exchange(addr: str, big: bytes) -> None:
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        sized = h.post_headers(**{"content-length": str(len(big))})
        first = stub.Process()  # takes the one lane once its bytes pass --large-body-min-bytes
        await first.write(h.headers_msg(sized))
        sent = 200_000
        await first.write(h.body_msg(big[:sent], eos=False))
        await asyncio.sleep(0.2)
        second = stub.Process()
        await second.write(h.headers_msg(sized))
        await second.write(h.body_msg(big))
        waiting = asyncio.ensure_future(second.read())
        small = stub.Process()
        await small.write(h.headers_msg(h.post_headers()))
        await small.write(h.body_msg(SMALL))
        assert _routed(await asyncio.wait_for(small.read(), 10))
        # The first upload goes on arriving (more often than the lane's idle second): it keeps the
        # lane, and the second body waits unread.
        for _ in range(5):
            await asyncio.sleep(0.3)
            await first.write(h.body_msg(big[sent : sent + 10_000], eos=False))
            sent += 10_000
            assert not waiting.done()
        await first.write(h.body_msg(big[sent:]))
        assert _routed(await asyncio.wait_for(first.read(), 30))
        resp = await asyncio.wait_for(waiting, 30)
        assert _routed(resp)
        for call in (first, second, small):
            call.cancel()


def test_serve_paces_large_bodies_and_parses_them_elsewhere(tmp_path: Path) -> None:
    sims = SimFleet([SimConfig(time_scale=0.02, name=f"s{i}") for i in range(2)])
    sims.start()
    args = [
        "--kv-events",
        "connect",
        "--body-parser-min-bytes",
        "64Ki",
        "--large-body-min-bytes",
        "128Ki",
        "--max-concurrent-large-bodies",
        "1",
        "--max-model-len",
        "sim-model=10000000",
    ]
    epp = EppProcess(tmp_path, endpoints=sims.addresses, extra_args=args)
    try:
        epp.start(wait="serving")
        big = _chat(600)  # ~500 kB, 600 messages: parsed and rendered by the body parser
        assert len(big) > 256 << 10
        asyncio.run(_exchange(epp.grpc_address, big))
        text = epp.metrics_text()
        assert parse_prometheus(text, "epp_large_body_waits_total")[""] >= 1
        assert parse_prometheus(text, "epp_body_parser_restarts_total")[""] == 0
        assert "Traceback" not in epp.process.log_text()
    finally:
        epp.stop()
        sims.stop()
