"""Precise prefix-cache routing against real vLLM: epp's predictions checked by vLLM's own reports.

Each prediction is epp's explain row (`POST /debug/score`) for a pod, taken just before the
request; each truth is what that pod's vLLM answers in `usage.prompt_tokens_details.cached_tokens`
and, for which pod served a request sent through Envoy, the pod whose
`vllm:prefix_cache_queries_total` counter moved. Between requests the test waits until epp has
indexed the last request's blocks from real KV events (`stack.settle`), never for a fixed time.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import openai
import pytest

from e2e.harness import parse_prometheus
from e2e.vllm.stack import (
    MODEL,
    NUM_BLOCKS,
    Pod,
    VllmStack,
    cached_tokens,
    complete_on,
    post,
    prediction,
    request_body,
    settle,
    wait_for,
)
from e2e.vllm.texts import sentence_soup
from epp.api.requests import Api, InferenceRequest
from epp.datastore.endpoints import Endpoint, EndpointSpec
from epp.observability import metrics
from epp.prewarm.sender import Sender

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

BLOCK = 32


def queries(stack: VllmStack) -> dict[str, float]:
    """Each pod's vLLM prefix-cache query counter (tokens looked up): it moves on the pod that served."""
    return {
        p.address: sum(parse_prometheus(p.server.metrics_text(), "vllm:prefix_cache_queries_total").values())
        for p in stack.pods
    }


def served_by(stack: VllmStack, before: dict[str, float]) -> Pod:
    moved: list[Pod] = []

    def one_moved() -> bool:
        after = queries(stack)
        moved[:] = [p for p in stack.pods if after[p.address] > before[p.address]]
        return len(moved) == 1

    wait_for(one_moved, within=10, what=f"no single pod counted the request: {moved}")
    return moved[0]


def send(client: openai.OpenAI, prompt: str | dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of one request through Envoy: a completion, or a chat body."""
    if isinstance(prompt, dict):
        chat = client.chat.completions.create(model=MODEL, messages=prompt["messages"], max_tokens=1)
        usage = chat.usage
    else:
        usage = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1).usage
    assert usage is not None and usage.prompt_tokens_details is not None, usage
    return usage.prompt_tokens, int(usage.prompt_tokens_details.cached_tokens or 0)


def test_shared_prefix_goes_to_the_pod_holding_it_and_epp_predicts_vllms_cached_tokens(
    stack: VllmStack,
) -> None:
    """Four tenants, each a ~530-token handbook, six questions each, through Envoy with the
    OpenAI client: tenants 0-1 as completions, 2-3 as chat (the handbook as the system message,
    rendered by the model's template). The first request of a tenant goes wherever load puts it;
    every later one must go to that pod, where vLLM reports a hit, and epp's predicted cached
    tokens for the pod that served must equal vLLM's report on every request."""
    rng = random.Random(7)
    client = stack.client(timeout=120)
    tenants = [f"Tenant {t} handbook. " + sentence_soup(rng, 420) for t in range(4)]
    holder: dict[int, str] = {}
    rows: list[dict[str, Any]] = []
    for question in range(6):
        for t, handbook in enumerate(tenants):
            ask = f"Question {question}: {sentence_soup(rng, 12)}"
            prompt: str | dict[str, Any] = f"{handbook}\n{ask}"
            if t >= 2:
                messages = [{"role": "system", "content": handbook}, {"role": "user", "content": ask}]
                prompt = {"model": MODEL, "messages": messages}
            explained = stack.explain(*request_body(prompt))
            before = queries(stack)
            prompt_tokens, actual = send(client, prompt)
            pod = served_by(stack, before)
            rows.append(
                {
                    "tenant": t,
                    "question": question,
                    "pod": pod.address,
                    "pick": explained["pick"],
                    "predicted": prediction(explained, pod)["cached_tokens"],
                    "actual": actual,
                    "prompt_tokens": prompt_tokens,
                    "epp_tokens": explained["request_tokens"],
                }
            )
            holder.setdefault(t, pod.address)
            settle(stack, pod, prompt)
    report = "\n".join(str(r) for r in rows)
    agree = sum(r["predicted"] == r["actual"] for r in rows)
    print(f"predicted == actual cached tokens on {agree} of {len(rows)} requests")
    assert all(r["prompt_tokens"] == r["epp_tokens"] for r in rows), report
    later = [r for r in rows if r["question"] > 0]
    assert all(r["pod"] == holder[r["tenant"]] == r["pick"] for r in later), report
    assert all(r["actual"] >= 16 * BLOCK for r in later), report  # the handbook hit
    assert agree == len(rows), report


def test_evicted_blocks_are_no_longer_predicted(stack: VllmStack) -> None:
    """Four 37-block prompts on one pod whose cache holds `NUM_BLOCKS` (128): the oldest loses
    its tail blocks (vLLM evicts least recently freed first, a request's blocks tail first). epp
    must stop predicting them, and what it still predicts must be what vLLM then reuses."""
    pod = stack.pods[1]
    rng = random.Random(11)
    prompts = [[rng.randrange(100, 8000) for _ in range(37 * BLOCK + 1)] for _ in range(4)]
    assert NUM_BLOCKS < 4 * 37
    removed_before = stack.kv_counter("epp_kv_events_blocks_total", pod, kind="removed")
    first, *rest = prompts
    complete_on(pod, first)
    assert settle(stack, pod, first)["matched_blocks"] == 37
    for prompt in rest:
        complete_on(pod, prompt)
        settle(stack, pod, prompt)
    assert stack.kv_counter("epp_kv_events_blocks_total", pod, kind="removed") >= removed_before + 20
    row = prediction(stack.explain({"model": MODEL, "prompt": first}), pod)
    assert row["matched_blocks"] < 37, row
    again = complete_on(pod, first)
    assert cached_tokens(again) == row["cached_tokens"], (row, again["usage"])


def test_reset_prefix_cache_drops_the_pods_entries(stack: VllmStack) -> None:
    """POST /reset_prefix_cache -> AllBlocksCleared -> epp forgets the pod's blocks. vLLM sends
    the event with its next engine step (reference notes: it is held back on an idle engine), so
    another request follows the reset; its own blocks must be indexed after the clear, not lost."""
    pod = stack.pods[0]
    rng = random.Random(13)
    old = [rng.randrange(100, 8000) for _ in range(20 * BLOCK + 5)]
    new = [rng.randrange(100, 8000) for _ in range(10 * BLOCK + 5)]
    complete_on(pod, old)
    settle(stack, pod, old)
    pod.server.post_json("/reset_prefix_cache")  # raises unless 200
    complete_on(pod, new)
    settle(stack, pod, new)  # the batch that carries AllBlocksCleared and then the new blocks
    row = prediction(stack.explain({"model": MODEL, "prompt": old}), pod)
    assert row["matched_blocks"] == 0, row
    again = complete_on(pod, old)
    assert cached_tokens(again) == row["cached_tokens"] == 0, again["usage"]


def test_a_prewarm_with_epps_token_ids_gives_the_chat_a_hit_in_vllm(stack: VllmStack) -> None:
    """epp's pre-warm (epp.prewarm.sender) of a chat's first blocks, sent as epp's own token ids
    for that chat, leaves vLLM holding exactly those blocks: the chat itself, sent afterwards
    straight to that pod, is answered with them as cached tokens."""
    rng = random.Random(11)
    messages = [
        {"role": "system", "content": "Prewarm handbook. " + sentence_soup(rng, 420)},
        {"role": "user", "content": "Which section covers refunds?"},
    ]
    body = {"model": MODEL, "messages": messages, "max_tokens": 1}
    ids = stack.tokenize(body, "/v1/chat/completions")["token_ids"]
    warm = (len(ids) - 40) // BLOCK * BLOCK  # the system prompt's whole blocks, not the question
    pod = stack.pods[2]
    host, port = pod.address.rsplit(":", 1)
    endpoint = Endpoint(spec=EndpointSpec(name="pod-2", address=host, port=int(port)), hostport=pod.address)
    request = InferenceRequest("prewarm-e2e", Api.CHAT, "/v1/chat/completions", {}, model=MODEL)
    request.target_model = MODEL
    request.token_ids = ids

    async def prewarm() -> None:
        sender = Sender(timeout=120.0)
        try:
            assert sender.verdict(endpoint) == "send"
            sender.send(endpoint, request, warm)
            await asyncio.wait_for(sender.idle(), 120.0)
        finally:
            await sender.close()

    ok = metrics.prewarm_requests.labels("ok")._value.get()
    asyncio.run(prewarm())
    assert metrics.prewarm_requests.labels("ok")._value.get() == ok + 1
    answer = post(f"{pod.url}/v1/chat/completions", body)
    assert cached_tokens(answer) == warm
