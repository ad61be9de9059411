"""epp's mode-override gateway through a real Envoy 1.40: off-sample responses stream to the client
without passing through epp (with `--response-sample-headers=sampled`, nor their headers), and
their booking is still released once, when the response ends.

`epp serve --response-sample-ratio 0 --response-sample-min-interval 0` makes every request
off-sample (the per-endpoint floor off too); the config is the one
`epp envoy-config` prints by default (request body BUFFERED, response body STREAMED,
`allow_mode_override`).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import time
from collections.abc import Callable

import aiohttp

from e2e.harness import (
    E2E_SIM,
    Stack,
    StackOptions,
    eventually,
    parse_prometheus,
    request,
    sse_events,
    wait_routable,
)

StackFactory = Callable[..., Stack]
MODEL = "sim-model"
# 20 ms of simulated decode per token at time_scale 1: 40 tokens stream for ~0.8 s.
SLOW_SIM = E2E_SIM.__class__(time_scale=1.0)
STREAM = {
    "model": MODEL,
    "prompt": "tell me a story " * 20,
    "max_tokens": 40,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def stack_for(stacks: StackFactory, ratio: str, n_backends: int = 1, *, headers: str = "all") -> Stack:
    return stacks(
        StackOptions(
            n_backends=n_backends,
            sim_configs=[SLOW_SIM] * n_backends,
            mode_override=True,
            epp_args=[
                "--response-sample-ratio",
                ratio,
                "--response-sample-min-interval",
                "0",
                f"--response-sample-headers={headers}",
            ],
        )
    )


def metric_sum(stack: Stack, name: str, match: str = "") -> float:
    values = parse_prometheus(stack.epp.metrics_text(), name)
    return sum(v for k, v in values.items() if match in k)


def inflight(stack: Stack) -> float:
    return sum(stack.epp.inflight().values())


def running(stack: Stack) -> float:
    return metric_sum(stack, "inference_objective_running_requests")


def ext_proc_msgs(stack: Stack) -> int:
    return int(stack.envoy.stats().get("http.gateway.ext_proc.stream_msgs_sent", "0"))


async def open_stream(session: aiohttp.ClientSession, stack: Stack) -> aiohttp.ClientResponse:
    resp = await session.post(stack.url + "/v1/completions", json=STREAM)
    assert resp.status == 200
    assert (await resp.content.readline()).startswith(b"data: ")  # the first token arrived
    return resp


async def test_off_sample_streams_skip_epp_and_release_once_at_the_end(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stack_for(stacks, "0")
    await wait_routable(session, stack.url)
    await eventually(lambda: inflight(stack) == 0, within=5.0, what="idle")
    msgs_before = ext_proc_msgs(stack)
    ttft_before = metric_sum(stack, "inference_objective_request_ttft_seconds_count")
    skipped_before = metric_sum(stack, "epp_response_bodies_skipped_total", 'result="skipped"')

    streams = [await open_stream(session, stack) for _ in range(3)]
    # Booked through the stream, not released when the response headers went by.
    assert inflight(stack) == 3 and running(stack) == 3
    bodies = []
    ends = []
    for resp in streams:
        bodies.append((await resp.read()).decode())
        ends.append(time.monotonic())
        resp.release()
    for text in bodies:
        events = sse_events("data: x\n\n" + text)  # the first line was read already
        assert events[-1] == "[DONE]" and any('"usage"' in e for e in events)
    # Released exactly once each: the running gauge (never clamped) lands on 0, not below.
    await eventually(lambda: inflight(stack) == 0, within=5.0, interval=0.005, what="in-flight back to 0")
    lag = time.monotonic() - ends[-1]
    assert running(stack) == 0
    await asyncio.sleep(0.3)
    assert inflight(stack) == 0 and running(stack) == 0
    # Per request epp got request headers, the buffered body and the response headers: no chunk.
    assert ext_proc_msgs(stack) - msgs_before == 3 * 3, stack.envoy.stats()
    assert metric_sum(stack, "inference_objective_request_ttft_seconds_count") == ttft_before
    text = stack.epp.metrics_text()
    assert not any(parse_prometheus(text, "epp_extproc_stream_errors_total").values())
    skipped = parse_prometheus(text, "epp_response_bodies_skipped_total")
    assert skipped.get('result="skipped"') == skipped_before + 3, skipped
    assert not skipped.get('result="ignored"'), skipped
    print(f"release lag after the client's last byte: <= {lag * 1000:.1f} ms (poll every 5 ms)")


async def test_off_sample_streams_skip_epp_from_their_request_headers(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    # --response-sample-headers=sampled: Envoy honours the override on the request-headers answer,
    # sends epp no response message, and still ends the stream when the HTTP stream ends.
    stack = stack_for(stacks, "0", headers="sampled")
    await wait_routable(session, stack.url)
    await eventually(lambda: inflight(stack) == 0, within=5.0, what="idle")
    msgs_before = ext_proc_msgs(stack)
    skipped_before = metric_sum(stack, "epp_response_bodies_skipped_total", 'result="skipped"')
    streams = [await open_stream(session, stack) for _ in range(3)]
    assert inflight(stack) == 3 and running(stack) == 3  # booked through the stream
    for resp in streams[:2]:
        text = (await resp.read()).decode()
        resp.release()
        assert sse_events("data: x\n\n" + text)[-1] == "[DONE]"
    streams[2].close()  # a client reset mid-stream
    await eventually(lambda: inflight(stack) == 0, within=5.0, interval=0.005, what="in-flight back to 0")
    await asyncio.sleep(0.3)
    assert inflight(stack) == 0 and running(stack) == 0  # released once each
    # Per request epp got the request headers and the buffered body only.
    assert ext_proc_msgs(stack) - msgs_before == 3 * 2, stack.envoy.stats()
    skipped = parse_prometheus(stack.epp.metrics_text(), "epp_response_bodies_skipped_total")
    assert skipped.get('result="skipped"') == skipped_before + 3, skipped
    assert not any(parse_prometheus(stack.epp.metrics_text(), "epp_extproc_stream_errors_total").values())


async def test_sampled_streams_still_report_usage_and_ttft(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stack_for(stacks, "1")
    await wait_routable(session, stack.url)
    # The probe's own stream ends after its client read it: its TTFT lands then (CI once counted
    # it after the baseline was read).
    await eventually(lambda: inflight(stack) == 0, within=5.0, what="the probe's stream ended")
    msgs_before = ext_proc_msgs(stack)
    ttft_before = metric_sum(stack, "inference_objective_request_ttft_seconds_count")
    resp = await open_stream(session, stack)
    await resp.read()
    resp.release()
    await eventually(lambda: inflight(stack) == 0, within=5.0, what="in-flight back to 0")
    assert ext_proc_msgs(stack) - msgs_before > 3  # the body passed through epp
    await eventually(
        lambda: metric_sum(stack, "inference_objective_output_tokens_sum") == 40,
        within=5.0,
        what="usage in epp's metrics",
    )
    assert metric_sum(stack, "inference_objective_request_ttft_seconds_count") == ttft_before + 1


async def test_client_reset_mid_stream_releases_once(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stack_for(stacks, "0")
    await wait_routable(session, stack.url)
    resp = await open_stream(session, stack)
    assert inflight(stack) == 1
    resp.close()  # drops the connection mid-stream
    await eventually(lambda: inflight(stack) == 0, within=5.0, interval=0.01, what="in-flight back to 0")
    await asyncio.sleep(0.3)
    assert running(stack) == 0
    # The gateway still serves, and books again.
    reply = await request(session, "POST", stack.url + "/v1/completions", body={**STREAM, "max_tokens": 3})
    assert reply.status == 200
    await eventually(lambda: inflight(stack) == 0, within=5.0, what="in-flight back to 0")
    assert running(stack) == 0


async def test_sigterm_drains_an_off_sample_stream_to_its_end(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stack_for(stacks, "0")
    await wait_routable(session, stack.url)
    resp = await open_stream(session, stack)
    proc = stack.epp.process.proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGTERM)
    text = (await resp.read()).decode()
    resp.release()
    assert sse_events("data: x\n\n" + text)[-1] == "[DONE]"  # the stream was not cut
    # epp exits once its last stream has ended, well before the drain timeout.
    code = await asyncio.to_thread(proc.wait, 10.0)
    assert code == 0, stack.epp.process.log_path.read_text()[-3000:]


async def test_a_request_body_over_a_mebibyte_reaches_epp(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    # Envoy buffers the request body here; at its default 1 MiB limit it would answer 413 itself.
    stack = stack_for(stacks, "0")
    await wait_routable(session, stack.url)
    body = json.dumps({"model": MODEL, "prompt": "x" * (3 << 20), "max_tokens": 1}).encode()
    async with session.post(
        stack.url + "/v1/completions",
        data=io.BytesIO(body),  # aiohttp warns about large raw bytes
        headers={"content-type": "application/json", "content-length": str(len(body))},
    ) as resp:
        text = await resp.text()
        assert resp.status != 413, text
        assert json.loads(text)  # an answer from epp or the model server, not Envoy's
    await eventually(lambda: inflight(stack) == 0, within=5.0, what="in-flight back to 0")
