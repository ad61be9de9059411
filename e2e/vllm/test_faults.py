"""Faults between real vLLMs and epp: lost KV-event messages, a dropped subscription, a restarted
pod, a pod killed mid-stream. These run last (conftest `_MODULE_ORDER`) and in file order: the
restart and the kill change the fleet.

The first three use pod-2, whose events reach epp through the suite's `Forwarder` (stack.py): it
swallows messages or closes epp's connection on demand, and keeps epp's connection up while the
vLLM behind it restarts, so epp sees only the sequence numbers start again. Each test proves the
repair the only way it can be seen: blocks that exist solely in what was lost are in epp's index
afterwards (a replay brought them), or blocks of a dead process are not (a purge dropped them),
and vLLM's cached-token report for a re-sent prompt equals epp's prediction.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from e2e.vllm.fleet import STARTUP_TIMEOUT
from e2e.vllm.stack import (
    MODEL,
    Pod,
    VllmStack,
    cached_tokens,
    complete_on,
    prediction,
    settle,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

BLOCK = 32


def ids_prompt(rng: random.Random, blocks: int) -> list[int]:
    return [rng.randrange(100, 8000) for _ in range(blocks * BLOCK + 3)]


def assert_prediction_is_vllms(stack: VllmStack, pod: Pod, prompt: list[int]) -> dict[str, Any]:
    row = prediction(stack.explain({"model": MODEL, "prompt": prompt}), pod)
    again = complete_on(pod, prompt)
    assert cached_tokens(again) == row["cached_tokens"], (row, again["usage"])
    return row


def forwarder_of(stack: VllmStack) -> tuple[Pod, Any]:
    pod = stack.pods[2]
    assert pod.forwarder is not None
    return pod, pod.forwarder


def test_lost_messages_are_a_gap_repaired_by_replay(stack: VllmStack) -> None:
    pod, fwd = forwarder_of(stack)
    rng = random.Random(21)
    lost, after = ids_prompt(rng, 8), ids_prompt(rng, 4)
    gaps = stack.kv_counter("epp_kv_events_gaps_total", pod)
    replays = stack.kv_counter("epp_kv_events_replays_total", pod, outcome="ok")
    _, dropped = fwd.counts()
    fwd.drop(1)
    complete_on(pod, lost)
    wait_for(lambda: fwd.counts()[1] > dropped, within=10, what="the forwarder never saw the batch to drop")
    complete_on(pod, after)  # its batch arrives with seq = last + 2
    wait_for(
        lambda: (
            stack.kv_counter("epp_kv_events_gaps_total", pod) > gaps
            and stack.kv_counter("epp_kv_events_replays_total", pod, outcome="ok") > replays
        ),
        within=30,
        what="epp did not detect the gap and replay it",
    )
    assert settle(stack, pod, lost)["matched_blocks"] == 8  # only the replay carried these
    settle(stack, pod, after)
    assert assert_prediction_is_vllms(stack, pod, lost)["cached_tokens"] == 8 * BLOCK


def test_dropped_subscription_is_rebuilt_from_the_replay_buffer(stack: VllmStack) -> None:
    """epp's connection is closed; a request's events go nowhere meanwhile. After the reconnect,
    epp treats the stream as new (the publisher might have restarted): purge, replay from 0."""
    pod, fwd = forwarder_of(stack)
    rng = random.Random(22)
    unseen = ids_prompt(rng, 6)
    replays = stack.kv_counter("epp_kv_events_replays_total", pod, outcome="ok")
    _, dropped = fwd.counts()
    fwd.cut()
    complete_on(pod, unseen)
    wait_for(lambda: fwd.counts()[1] > dropped, within=10, what="no batch went nowhere during the cut")
    fwd.restore()
    # epp's SUB reconnects on its own schedule; its first live message after that starts the
    # rebuild. Each attempt sends a new prompt until a replay has completed.
    deadline = time.monotonic() + 60
    while stack.kv_counter("epp_kv_events_replays_total", pod, outcome="ok") <= replays:
        assert time.monotonic() < deadline, "no replay after the subscription came back"
        complete_on(pod, ids_prompt(rng, 1))
        try:
            wait_for(
                lambda: stack.kv_counter("epp_kv_events_replays_total", pod, outcome="ok") > replays,
                within=2,
                what="replay",
            )
        except AssertionError:
            continue
    assert settle(stack, pod, unseen)["matched_blocks"] == 6
    assert_prediction_is_vllms(stack, pod, unseen)


def test_restarted_pod_sequence_reset_purges_its_blocks(stack: VllmStack) -> None:
    pod, _ = forwarder_of(stack)
    rng = random.Random(23)
    before_restart = ids_prompt(rng, 10)
    complete_on(pod, before_restart)
    settle(stack, pod, before_restart)
    resets = stack.kv_counter("epp_kv_events_resets_total", pod)
    pod.server.stop()
    pod.server.start()
    pod.server.wait_healthy(time.monotonic() + STARTUP_TIMEOUT)
    # Down, its scrapes failed and epp excluded it; it is a candidate again after a good scrape.
    wait_for(
        lambda: any(
            row["endpoint"] == pod.address
            for row in stack.explain({"model": MODEL, "prompt": before_restart})["endpoints"]
        ),
        within=30,
        what="the restarted pod routable again",
    )
    stale = prediction(stack.explain({"model": MODEL, "prompt": before_restart}), pod)
    print(f"before the restarted pod's first event, epp predicts {stale['matched_blocks']} blocks there")
    # The new process numbers its batches from 0 again: epp counts a reset and purges.
    deadline = time.monotonic() + 60
    fresh = ids_prompt(rng, 3)
    while True:
        complete_on(pod, fresh)
        try:
            wait_for(
                lambda: stack.kv_counter("epp_kv_events_resets_total", pod) > resets, within=3, what="reset"
            )
            break
        except AssertionError:
            assert time.monotonic() < deadline, "epp never saw the restarted publisher's sequence reset"
            fresh = ids_prompt(rng, 3)
    settle(stack, pod, fresh)
    row = assert_prediction_is_vllms(stack, pod, before_restart)
    assert row["matched_blocks"] == 0, row


def test_pod_killed_mid_stream(stack: VllmStack) -> None:
    """A streaming completion's pod is SIGKILLed (every process of it). The client's stream must
    end (not hang), epp's in-flight count must return to zero, and the pod must leave the pool:
    first as unroutable (its scrapes fail), then gone once the endpoints file no longer lists it."""
    client = stack.client(timeout=60)
    # Under load the tiny model may finish all its tokens before the kill lands (the booking is
    # gone once the pods are frozen): nothing was killed then, and the request is sent again.
    for attempt in range(3):
        victim, chunks, ending = _stream_and_kill(stack, client)
        if victim is not None and not ending.startswith("finished"):
            break
        print(f"attempt {attempt + 1}: the stream ended before the kill ({chunks} chunks: {ending})")
        if victim is not None:  # killed after its last token: bring it back, try again
            _restart(stack, victim)
    else:
        raise AssertionError("three streams in a row ended before their pod could be killed")
    assert victim is not None

    def inflight() -> dict[str, float]:
        return stack.epp_metric("epp_endpoint_inflight_requests")

    # The victim's series must be there and read 0 (an absent series would pass vacuously).
    wait_for(
        lambda: any(victim.address in k for k in inflight()) and all(v == 0 for v in inflight().values()),
        within=30,
        what=f"epp's in-flight gauge never returned to 0: {inflight()}",
    )
    wait_for(
        lambda: not stack.endpoints()[victim.address]["routable"],
        within=30,
        what="the killed pod stayed routable",
    )
    survivors = [p for p in stack.pods if p is not victim]
    stack.write_endpoints(survivors)
    wait_for(lambda: victim.address not in stack.endpoints(), within=30, what="the pod never left the pool")
    for i in range(4):
        answer = client.completions.create(model=MODEL, prompt=f"After the crash {i}", max_tokens=1)
        assert answer.choices, answer


MAX_TOKENS = 1500


def _restart(stack: VllmStack, pod: Pod) -> None:
    pod.server.start()
    pod.server.wait_healthy(time.monotonic() + STARTUP_TIMEOUT)
    wait_for(
        lambda: bool(stack.endpoints().get(pod.address, {}).get("routable")),
        within=30,
        what="the restarted pod routable again",
    )


def _stream_and_kill(stack: VllmStack, client: Any) -> tuple[Pod | None, int, str]:
    """Stream a long completion and SIGKILL the pod epp booked it on, once booked (after its
    first chunk, or 0.1 s). Returns the pod killed (None when the request had ended by the time
    the pods were frozen), the chunks the client read, and how its stream ended."""
    first_chunk = threading.Event()
    ended = threading.Event()
    killed: list[Pod] = []
    failed: list[BaseException] = []

    def busy_pods() -> list[Pod]:
        rows = stack.endpoints()
        return [p for p in stack.pods if rows.get(p.address, {}).get("inflight_requests", 0) > 0]

    def kill_the_busy_pod() -> None:
        # Watch epp's booking, not the client's first chunk: under load the tiny model (~1k
        # tokens/s) twice generated all its tokens before the client saw one. Once booked, the
        # kill waits for the first chunk or 0.1 s at most, then freezes every pod (generation
        # halts at once) and kills the booked one.
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if busy_pods():
                        break
                except OSError as exc:  # epp's debug port slow to answer under load: ask again
                    print(f"polling epp's endpoints: {exc!r}")
                assert time.monotonic() < deadline, "epp never booked the request on a pod"
                time.sleep(0.005)
            first_chunk.wait(0.1)
            for pod in stack.pods:
                pod.server.freeze()
            try:
                # epp's booking outlives the pod's last token by the time its response end takes
                # to reach epp: a stream that still ends with every pod frozen had already been
                # generated whole (CI once read all 1500 tokens after the kill): not a kill mid-stream.
                if ended.wait(2.0):
                    return
                busy = busy_pods()
                assert len(busy) <= 1, stack.endpoints()
                if busy:
                    busy[0].server.kill()
                    killed.append(busy[0])
            finally:
                for pod in stack.pods:
                    pod.server.thaw()
        except BaseException as exc:  # reported by the test's thread
            failed.append(exc)

    killer = threading.Thread(target=kill_the_busy_pod, name="killer", daemon=True)
    killer.start()
    chunks = 0
    ending = "ended with no finish reason"
    started = time.monotonic()
    try:
        # Killed before its response headers, the request is a 503 from Envoy; after, a
        # truncated stream. Either way it must end.
        stream = client.completions.create(
            model=MODEL,
            prompt="Tell a very long story about a garden rake.",
            max_tokens=MAX_TOKENS,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        try:
            for chunk in stream:
                chunks += 1
                first_chunk.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    ending = f"finished ({chunk.choices[0].finish_reason})"
        finally:
            stream.close()  # the truncated response still holds its connection
    except Exception as exc:  # what a truncated stream, or a 503, looks like to the client
        ending = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    finally:
        ended.set()
    killer.join(timeout=60)
    print(f"stream of {chunks} chunks ended after {time.monotonic() - started:.1f} s: {ending}")
    assert not killer.is_alive(), "the killer thread hung"
    assert not failed, failed
    return (killed[0] if killed else None), chunks, ending
