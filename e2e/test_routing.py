"""End-to-end routing contract: client -> real Envoy -> epp (ext_proc) -> simulated vLLM replicas.

Written against the protocol contract (GIE EPP protocol plus epp's error mapping), not against
epp's internals: every assertion is made on what a client, a backend, or epp's /metrics can see.
The sims echo the destination header they received (`x-sim-received-destination`) and name
themselves (`x-sim-server` = their ip:port), which is how "landed on the backend epp picked" is
checked.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from e2e.harness import (
    DESTINATION_HEADER,
    Reply,
    Stack,
    eventually,
    request,
    sse_events,
    wait_routable,
)
from epp.gateway.envoy import BodyMode, PodsMode
from epp.gateway.processes import free_ports
from epp.sim.engine import SimConfig, output_tokens

pytestmark = pytest.mark.e2e

BODY_MODES = [
    pytest.param(BodyMode.FULL_DUPLEX_STREAMED, id="duplex"),
    pytest.param(BodyMode.BUFFERED, id="buffered"),
]
MODEL = "sim-model"

StackFactory = Callable[..., Stack]


def chat_body(text: str = "Say hello.", *, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}],
        "max_tokens": max_tokens,
        **extra,
    }


def completion_body(text: str = "Once upon a time", *, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": text, "max_tokens": max_tokens, **extra}


def assert_routed(reply: Reply, stack: Stack) -> None:
    """200 from a sim, and the sim that served is the one named by the header epp set."""
    assert reply.status == 200, f"{reply.status}: {reply.text[:300]}"
    assert reply.served_by in stack.sims.addresses, reply.headers
    assert reply.received_destination == reply.served_by, reply.headers


def assert_one_line_error(reply: Reply, status: int) -> None:
    assert reply.status == status, f"expected {status}, got {reply.status}: {reply.text[:300]}"
    lines = reply.text.strip().splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"reason should be one non-empty line: {reply.text!r}"


def assert_only_named_destinations(stack: Stack) -> None:
    """Every request a sim received named that sim (no unrouted or misrouted request)."""
    for addr, stats in stack.sims.stats_by_address().items():
        assert set(stats["destinations"]) <= {addr}, (addr, stats["destinations"])


# --- routing --------------------------------------------------------------------------------------


@pytest.mark.parametrize("body_mode", BODY_MODES)
async def test_requests_land_on_the_backend_epp_picked(
    stacks: StackFactory, session: aiohttp.ClientSession, body_mode: BodyMode
) -> None:
    stack = stacks(body_mode=body_mode)
    await wait_routable(session, stack.url)
    cases = [
        ("/v1/chat/completions", chat_body),
        ("/v1/completions", completion_body),
    ]
    served: set[str] = set()
    for path, make in cases:
        for i in range(4):
            body = make(f"request {i}: " + "lorem ipsum " * (20 * i), max_tokens=3)
            reply = await request(session, "POST", stack.url + path, body=body)
            assert_routed(reply, stack)
            payload = reply.json()
            assert payload["model"] == MODEL
            assert payload["usage"]["completion_tokens"] == 3
            served.add(reply.served_by)
    assert served
    assert_only_named_destinations(stack)


async def test_responses_and_embeddings_are_routed(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stacks()
    await wait_routable(session, stack.url)
    reply = await request(
        session, "POST", stack.url + "/v1/responses", body={"model": MODEL, "input": "Hi there"}
    )
    assert_routed(reply, stack)
    assert reply.json()["object"] == "response"
    reply = await request(
        session, "POST", stack.url + "/v1/embeddings", body={"model": MODEL, "input": "Hi there"}
    )
    assert_routed(reply, stack)
    assert reply.json()["data"][0]["object"] == "embedding"


@pytest.mark.parametrize("body_mode", BODY_MODES)
async def test_get_models_is_routed(
    stacks: StackFactory, session: aiohttp.ClientSession, body_mode: BodyMode
) -> None:
    stack = stacks(body_mode=body_mode)
    reply = await wait_routable(session, stack.url)
    assert_routed(reply, stack)
    assert [m["id"] for m in reply.json()["data"]] == [MODEL]


@pytest.mark.parametrize("body_mode", BODY_MODES)
@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_sse_stream_arrives_intact(
    stacks: StackFactory, session: aiohttp.ClientSession, body_mode: BodyMode, api: str
) -> None:
    stack = stacks(body_mode=body_mode)
    await wait_routable(session, stack.url)
    n = 40
    extra = {"stream": True, "stream_options": {"include_usage": True}}
    if api == "chat":
        path, body = "/v1/chat/completions", chat_body("Tell a story.", max_tokens=n, **extra)
    else:
        path, body = "/v1/completions", completion_body("Tell a story.", max_tokens=n, **extra)
    reply = await request(session, "POST", stack.url + path, body=body)
    assert_routed(reply, stack)
    assert reply.headers.get("content-type", "").startswith("text/event-stream")
    events = sse_events(reply.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    if api == "chat":
        texts = [c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]]
        # role chunk + n tokens + finish chunk, then the usage chunk
        assert len(chunks) == n + 3
    else:
        texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
        assert len(chunks) == n + 2
    assert "".join(texts) == "".join(output_tokens(n))
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == n
    assert all(c["model"] == MODEL for c in chunks)


@pytest.mark.parametrize("body_mode", BODY_MODES)
async def test_client_forged_destination_is_overwritten(
    stacks: StackFactory, session: aiohttp.ClientSession, body_mode: BodyMode
) -> None:
    stack = stacks(body_mode=body_mode)
    await wait_routable(session, stack.url)
    (dead_port,) = free_ports(1)  # if Envoy honoured the forged header it would get 503 here
    forged = {DESTINATION_HEADER: f"127.0.0.1:{dead_port}"}
    for _ in range(3):
        reply = await request(
            session, "POST", stack.url + "/v1/chat/completions", body=chat_body(), headers=forged
        )
        assert_routed(reply, stack)
    reply = await request(session, "GET", stack.url + "/v1/models", headers=forged)
    assert_routed(reply, stack)
    assert_only_named_destinations(stack)


# --- errors epp answers itself ---------------------------------------------------------------------


@pytest.mark.parametrize("body_mode", BODY_MODES)
async def test_bad_input_matrix(
    stacks: StackFactory, session: aiohttp.ClientSession, body_mode: BodyMode
) -> None:
    stack = stacks(body_mode=body_mode, epp_args=["--max-body-bytes", "65536"])
    await wait_routable(session, stack.url)
    chat = stack.url + "/v1/chat/completions"
    cases: list[tuple[str, dict[str, Any], int]] = [
        ("invalid JSON", {"data": b'{"model": "sim-model", "messages": ['}, 400),
        ("JSON not an object", {"data": b'["sim-model"]'}, 400),
        ("missing model", {"body": {"messages": [{"role": "user", "content": "hi"}]}}, 400),
        ("missing messages", {"body": {"model": MODEL}}, 400),
        ("body over --max-body-bytes", {"body": chat_body("x" * 100_000)}, 413),
    ]
    failures: list[str] = []
    for name, kwargs, status in cases:
        reply = await request(session, "POST", chat, **kwargs)
        try:
            assert_one_line_error(reply, status)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    completions = await request(session, "POST", stack.url + "/v1/completions", body={"model": MODEL})
    try:
        assert_one_line_error(completions, 400)
    except AssertionError as exc:
        failures.append(f"completions without prompt: {exc}")
    assert not failures, "\n".join(failures)
    # epp answered all of them: no backend saw an inference request.
    assert all(s["inference_requests"] == 0 for s in stack.sims.stats())
    # and the gateway still routes good requests afterwards
    assert_routed(await request(session, "POST", chat, body=chat_body()), stack)


async def test_no_endpoints_gives_503(stacks: StackFactory, session: aiohttp.ClientSession) -> None:
    stack = stacks(endpoints_source="empty-file", epp_wait="listening")
    reply = await request(session, "POST", stack.url + "/v1/chat/completions", body=chat_body())
    assert_one_line_error(reply, 503)
    assert all(s["requests"] == 0 for s in stack.sims.stats())


HEADER_FILTER_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: header-based-testing-filter
  - pluginRef: max-score-picker
"""


async def test_everything_filtered_out_gives_429(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stacks(epp_args=["--config-text", HEADER_FILTER_CONFIG])
    url = stack.url + "/v1/chat/completions"
    # Control: naming the backends' IP keeps them, so the filter itself is not what fails.
    deadline = time.monotonic() + 15
    while True:
        ok = await request(
            session, "POST", url, body=chat_body(), headers={"test-epp-endpoint-selection": "127.0.0.1"}
        )
        if ok.status == 200 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert_routed(ok, stack)
    # 192.0.2.1 (TEST-NET-1) names no backend: every endpoint is filtered out.
    reply = await request(
        session, "POST", url, body=chat_body(), headers={"test-epp-endpoint-selection": "192.0.2.1"}
    )
    assert_one_line_error(reply, 429)


# --- in-flight bookkeeping under client aborts --------------------------------------------------------

SLOW_DECODE = SimConfig(time_scale=0.02, decode_per_token=0.1)  # 2 ms per token after scaling


def _inflight_total(stack: Stack) -> float:
    return sum(stack.epp.inflight().values())


async def _settled(stack: Stack) -> None:
    """epp's in-flight gauge back to 0 for every endpoint, and the sims idle."""
    await eventually(
        lambda: _inflight_total(stack) == 0, within=10, what="epp_endpoint_inflight_requests == 0"
    )
    assert all(v == 0 for v in stack.epp.inflight().values()), stack.epp.inflight()
    await eventually(
        lambda: all(s["running"] == 0 and s["waiting"] == 0 for s in stack.sims.stats()),
        within=10,
        what="sims idle",
    )


@pytest.mark.parametrize("body_mode", BODY_MODES)
async def test_client_disconnect_mid_stream_releases_inflight(
    stacks: StackFactory, session: aiohttp.ClientSession, body_mode: BodyMode
) -> None:
    stack = stacks(body_mode=body_mode, sim_configs=[SLOW_DECODE, SLOW_DECODE])
    await wait_routable(session, stack.url)
    body = chat_body("Write a long essay.", max_tokens=3000, stream=True)  # ~6 s if read to the end
    async with session.post(
        stack.url + "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=30)
    ) as resp:
        assert resp.status == 200
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10)
        assert first.startswith(b"data: ")
        assert _inflight_total(stack) >= 1, "the open stream should be counted in flight"
        resp.close()  # drop the connection mid-stream
    await _settled(stack)
    assert sum(s["aborted"] for s in stack.sims.stats()) >= 1


async def test_repeated_aborted_requests_leave_no_inflight(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    slow_prefill = SimConfig(time_scale=0.02, prefill_per_char=2.5e-4, decode_per_token=0.1)
    stack = stacks(sim_configs=[slow_prefill, slow_prefill])
    await wait_routable(session, stack.url)
    url = stack.url + "/v1/chat/completions"
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 1000  # ~45k chars: ~0.2 s prefill

    async def abort_mid_stream(i: int) -> None:
        body = chat_body(f"{i} stream", max_tokens=2000, stream=True)
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10)
            resp.close()

    async def abort_during_prefill(i: int) -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(request(session, "POST", url, body=chat_body(f"{i} {long_prompt}")), 0.05)

    async def abort_right_away(i: int) -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                request(session, "POST", url, body=chat_body(f"{i} now", max_tokens=500)), 0.002
            )

    kinds = [abort_mid_stream, abort_during_prefill, abort_right_away]
    deadline = time.monotonic() + 60
    for i in range(30):  # bounded in count and in time
        assert time.monotonic() < deadline, "abort loop took too long"
        await kinds[i % len(kinds)](i)
    # A burst of concurrent aborts as well.
    burst = [asyncio.create_task(abort_mid_stream(100 + i)) for i in range(8)]
    await asyncio.wait_for(asyncio.gather(*burst), timeout=30)
    await _settled(stack)
    # The gateway still works afterwards.
    assert_routed(await request(session, "POST", url, body=chat_body()), stack)
    await _settled(stack)


# --- fallback endpoints (override_host + retries) ------------------------------------------------------

PICK_TWO_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
  parameters:
    maxNumOfEndpoints: 2
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
"""


@pytest.mark.parametrize("fault", ["reset", "503", "refused"])
async def test_fallback_list_survives_a_dead_primary(
    stacks: StackFactory, session: aiohttp.ClientSession, fault: str
) -> None:
    # The healthy replica reports a long queue, so the queue scorer ranks the faulty one first and
    # epp answers "faulty,healthy"; Envoy's override_host + retry must end on the healthy one.
    healthy = SimConfig(time_scale=0.02, extra_waiting=50)
    if fault == "refused":
        # Nothing listens there; epp may or may not still rank it (scrapes fail), so this variant
        # only checks that no request fails.
        (dead_port,) = free_ports(1)
        stack = stacks(
            sim_configs=[healthy],
            extra_endpoints=[f"127.0.0.1:{dead_port}"],
            pods_mode=PodsMode.OVERRIDE_HOST,
            epp_args=["--config-text", PICK_TWO_CONFIG],
        )
    else:
        faulty = (
            SimConfig(time_scale=0.02, fault_reset=True)
            if fault == "reset"
            else SimConfig(time_scale=0.02, fault_status=503)
        )
        stack = stacks(
            sim_configs=[faulty, healthy],
            pods_mode=PodsMode.OVERRIDE_HOST,
            epp_args=["--config-text", PICK_TWO_CONFIG],
        )
    healthy_addr = stack.sims.addresses[-1]
    await asyncio.sleep(0.5)  # let epp scrape the replicas' queues a few times
    for i in range(6):
        reply = await request(session, "POST", stack.url + "/v1/chat/completions", body=chat_body(f"q{i}"))
        assert reply.status == 200, f"{reply.status}: {reply.text[:300]}"
        assert reply.served_by == healthy_addr
        listed = reply.received_destination.split(",")
        assert healthy_addr in listed, listed
    if fault != "refused":
        faulty_addr = stack.sims.addresses[0]
        assert reply.received_destination.split(",") == [faulty_addr, healthy_addr]
        faulty_stats = stack.sims.stats()[0]
        assert faulty_stats["faults"] >= 6, faulty_stats


# --- epp failure and recovery ---------------------------------------------------------------------------


async def test_epp_killed_mid_load_holds_new_requests_and_recovers(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    stack = stacks()
    await wait_routable(session, stack.url)
    url = stack.url + "/v1/chat/completions"
    results: list[tuple[float, float, int | str]] = []  # (start, end, status or exception name)
    stop = asyncio.Event()

    async def load(worker: int) -> None:
        i = 0
        end_by = time.monotonic() + 60  # hard bound even if the test body stalls
        while not stop.is_set() and time.monotonic() < end_by:
            i += 1
            t0 = time.monotonic()
            try:
                r = await request(session, "POST", url, body=chat_body(f"w{worker} #{i}"), total=10)
                outcome: int | str = r.status
            except (TimeoutError, aiohttp.ClientError) as exc:
                outcome = type(exc).__name__
            results.append((t0, time.monotonic(), outcome))
            await asyncio.sleep(0.01)

    workers = [asyncio.create_task(load(w)) for w in range(4)]
    try:
        await asyncio.sleep(1.0)
        killed_at = time.monotonic()
        await asyncio.to_thread(stack.epp.kill)
        await asyncio.sleep(1.0)
        restart_at = time.monotonic()
        await asyncio.to_thread(stack.epp.start)
        ready_at = time.monotonic()
        await eventually(
            lambda: any(s > ready_at and o == 200 for s, _, o in results),
            within=20,
            what="200 after restart",
        )
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), timeout=30)

    before = [o for s, e, o in results if e < killed_at]
    down = [o for s, e, o in results if e > killed_at and s < restart_at]  # in flight or sent
    assert before and all(o == 200 for o in before), before
    assert down, "no request while epp was down"
    # Fail closed, never 500: the generated Envoy retries a stream that cannot reach epp (the
    # new process routes it) and answers 503 with a reason once the retries are spent. A
    # response the killed epp was following is lost with it: a 503 if its headers had not gone
    # out, a cut body (the client's ClientPayloadError) if they had, which only a request in
    # flight at the kill can meet (docs/reliability.md).
    assert set(down) <= {200, 503, "ClientPayloadError"} and 200 in down, f"while epp was down: {down}"
    cut = [s for s, e, o in results if o == "ClientPayloadError"]
    assert all(s < killed_at for s in cut), f"a request sent after the kill was cut: {cut}, {killed_at}"
    after = [o for s, e, o in results if s > ready_at]
    assert 200 in after


async def test_fail_open_serves_every_new_request_while_epp_is_down(
    stacks: StackFactory, session: aiohttp.ClientSession
) -> None:
    """`envoy.failOpen` (llm-d's `router.proxy.failOpen`): with epp gone, a request goes on at
    once to the pod with the fewer requests; back up, epp routes again."""
    stack = stacks(pods_mode=PodsMode.OVERRIDE_HOST, failure_mode_allow=True, mode_override=True)
    await wait_routable(session, stack.url)
    url = stack.url + "/v1/chat/completions"
    reply = await request(session, "POST", url, body=chat_body("with epp"))
    assert reply.status == 200 and reply.received_destination, reply.text[:300]
    await asyncio.to_thread(stack.epp.kill)
    served = []
    for i in range(12):
        t0 = time.monotonic()
        reply = await request(session, "POST", url, body=chat_body(f"without epp {i}"), total=10)
        assert reply.status == 200, f"{reply.status}: {reply.text[:300]}"
        assert time.monotonic() - t0 < 2, "failing open waited"
        assert not reply.received_destination  # nobody named a pod: Envoy's fallback chose
        served.append(reply.served_by)
    assert set(served) == set(stack.sims.addresses), served
    await asyncio.to_thread(stack.epp.start)
    reply = await request(session, "POST", url, body=chat_body("with epp again"))
    assert reply.status == 200 and reply.received_destination, reply.text[:300]


# --- TLS to epp ---------------------------------------------------------------------------------------------


async def test_tls_between_envoy_and_epp(stacks: StackFactory, session: aiohttp.ClientSession) -> None:
    stack = stacks(epp_tls=True)
    await wait_routable(session, stack.url)
    reply = await request(session, "POST", stack.url + "/v1/chat/completions", body=chat_body())
    assert_routed(reply, stack)
    reply = await request(
        session, "POST", stack.url + "/v1/chat/completions", body=chat_body(stream=True, max_tokens=5)
    )
    assert_routed(reply, stack)
    assert sse_events(reply.text)[-1] == "[DONE]"
