"""SIGTERM drains epp: readiness NOT_SERVING at once, new streams served for --drain-delay and
refused after it, in-flight streams finish.

Real processes: simulated vLLM pods decoding slowly, `epp serve`, and Envoy 1.40 with the
generated config (e2e/harness.py). A 600-token streamed chat completion is the in-flight stream:
in GIE's (full-duplex) mode its whole response passes through one ext-proc stream, so a drain
that cut streams would lose the tail and `[DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e.harness import (
    Cleanup,
    Stack,
    StackOptions,
    grpc_health_status,
    sse_events,
    start_stack,
)
from epp.flags import DEFAULT_DRAIN_DELAY_S
from epp.gateway.params import GatewayParams
from epp.sim.engine import SimConfig, output_tokens

pytestmark = pytest.mark.e2e

TOKENS = 600
# 10 ms per decoded token: the 600-token stream takes ~6 s, longer than the fixed 5 s drain epp
# had before --drain-timeout.
SLOW = SimConfig(time_scale=0.5, decode_per_token=0.02)


def _longest_retry_hold() -> float:
    """The longest the generated Envoy holds a request whose ext-proc stream finds no epp: its
    retries' back-off intervals at their upper bounds (Envoy jitters each in [0, bound])."""
    p = GatewayParams(listen_port=0, admin_port=0)
    return sum(min(p.epp_retry_base_interval * 2**k, p.epp_retry_max_interval) for k in range(p.epp_retries))


def body(max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "Write a long essay."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def wait_exit(stack: Stack, within: float) -> tuple[int, float]:
    started = time.monotonic()
    while stack.epp.process.alive():
        if time.monotonic() - started > within:
            raise AssertionError(f"epp still running {within}s after SIGTERM")
        await asyncio.sleep(0.05)
    rc = stack.epp.process.returncode
    assert rc is not None
    return rc, time.monotonic() - started


def start(tmp_path: Path, cleanup: Cleanup, drain: str, delay: str | None = "0s") -> Stack:
    """`delay` None: epp's default --drain-delay."""
    args = ["--drain-timeout", drain, *(["--drain-delay", delay] if delay is not None else [])]
    options = StackOptions(n_backends=1, sim_configs=[SLOW], epp_args=args)
    return start_stack(tmp_path, cleanup, options)


async def test_sigterm_lets_a_long_stream_finish(
    tmp_path: Path, cleanup: Cleanup, session: aiohttp.ClientSession
) -> None:
    stack = start(tmp_path, cleanup, "30s", delay="1.5s")
    url = stack.url + "/v1/chat/completions"
    async with session.post(url, json=body(TOKENS), timeout=aiohttp.ClientTimeout(total=60)) as resp:
        assert resp.status == 200
        head = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10)
        os.kill(stack.epp.process.pid, signal.SIGTERM)
        sigterm_at = time.monotonic()

        # Readiness turns NOT_SERVING while the stream is still running.
        status = "SERVING"
        while status == "SERVING" and time.monotonic() - sigterm_at < 2:
            status = grpc_health_status(stack.epp.health_port, "inference-extension")
            await asyncio.sleep(0.02)
        assert status == "NOT_SERVING"

        # During the drain delay new streams are still served (the gateway has not noticed yet).
        async with session.post(
            url, json=body(4, stream=False), timeout=aiohttp.ClientTimeout(total=10)
        ) as served:
            assert served.status == 200, await served.text()
        assert time.monotonic() - sigterm_at < 1.5

        # After it, no new streams: a request sent now does not get routed by this epp. Envoy
        # retries the refused ext-proc connection with back-off (~8 s here, up to ~16 s) before it
        # answers 503: a 10 s client timeout failed this test once in CI.
        await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - sigterm_at)))
        async with session.post(
            url,
            json=body(4, stream=False),
            timeout=aiohttp.ClientTimeout(total=_longest_retry_hold() + 10),
        ) as refused:
            assert refused.status >= 500, await refused.text()

        rest = await resp.read()
    streamed_for = time.monotonic() - sigterm_at
    events = sse_events((head + rest).decode())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "".join(output_tokens(TOKENS))
    assert streamed_for > 5.0, (
        f"the stream ended {streamed_for:.1f}s after SIGTERM: too short to prove a drain"
    )

    rc, _ = await wait_exit(stack, within=10)
    assert rc == 0
    log = stack.epp.process.log_text()
    assert "0 stream(s) cut" in log, log[-2000:]


async def test_the_grace_ends_the_drain(
    tmp_path: Path, cleanup: Cleanup, session: aiohttp.ClientSession
) -> None:
    stack = start(tmp_path, cleanup, "1s")
    url = stack.url + "/v1/chat/completions"
    async with session.post(url, json=body(TOKENS), timeout=aiohttp.ClientTimeout(total=60)) as resp:
        assert resp.status == 200
        await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10)
        os.kill(stack.epp.process.pid, signal.SIGTERM)
        rc, took = await wait_exit(stack, within=10)
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()  # cut: Envoy resets the response when its ext-proc stream dies
    assert rc == 0
    assert 0.9 < took < 5, took
    assert "1 stream(s) cut" in stack.epp.process.log_text()


async def test_an_idle_epp_exits_right_after_the_drain_delay(tmp_path: Path, cleanup: Cleanup) -> None:
    stack = start(tmp_path, cleanup, "130s", delay=None)
    os.kill(stack.epp.process.pid, signal.SIGTERM)
    rc, took = await wait_exit(stack, within=15)
    assert rc == 0 and DEFAULT_DRAIN_DELAY_S - 0.2 < took < DEFAULT_DRAIN_DELAY_S + 3, took


async def test_sigint_skips_the_drain_delay(tmp_path: Path, cleanup: Cleanup) -> None:
    stack = start(tmp_path, cleanup, "130s", delay=None)
    os.kill(stack.epp.process.pid, signal.SIGINT)  # a terminal's Ctrl-C
    rc, took = await wait_exit(stack, within=10)
    assert rc == 0 and took < 3, took


async def test_a_second_signal_ends_the_drain(
    tmp_path: Path, cleanup: Cleanup, session: aiohttp.ClientSession
) -> None:
    stack = start(tmp_path, cleanup, "60s", delay=None)  # the second signal comes in the delay
    url = stack.url + "/v1/chat/completions"
    async with session.post(url, json=body(TOKENS), timeout=aiohttp.ClientTimeout(total=60)) as resp:
        assert resp.status == 200
        await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10)
        os.kill(stack.epp.process.pid, signal.SIGTERM)
        await asyncio.sleep(0.5)
        assert stack.epp.process.alive()  # draining
        os.kill(stack.epp.process.pid, signal.SIGINT)
        rc, took = await wait_exit(stack, within=10)
    assert rc == 0 and took < 5, took
    log = stack.epp.process.log_text()
    assert "second signal: cancelling the 1 ext-proc stream(s) still in flight" in log, log[-2000:]
