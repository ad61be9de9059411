"""epp refuses (400) exactly where a real vLLM 0.32 refuses for context length, with the same words.

The fleet serves `--max-model-len` MAX_MODEL_LEN; epp learns it from the pods' `GET /v1/models`
(its tokenizer's `model_max_length` is 131072, so a refusal at MAX_MODEL_LEN can only come from the
pods' cards). Each case is asked of a vLLM directly and of epp (`/debug/tokenize`): the statuses,
the messages of refusals (vLLM's without its " (parameter=..., value=...)" suffix) and the prompt
ids of accepted requests must be equal. One refusal goes through Envoy too: epp answers it, with
vLLM's message, and no pod sees the request.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from e2e.vllm.fleet import MAX_MODEL_LEN
from e2e.vllm.stack import MODEL, VllmStack, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

N = MAX_MODEL_LEN
_SUFFIX = re.compile(r" \(parameter=[^)]*\)$")


def ids(n: int) -> list[int]:
    return [100 + i % 500 for i in range(n)]


def comp(prompt: str | list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, **extra}


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


# (path, body): the boundary from both sides, with and without max_tokens / max_completion_tokens.
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
CASES: list[tuple[str, dict[str, Any]]] = [
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N - 1)}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N - 1), "max_tokens": N}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N - 1), "max_tokens": N + 1}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N)}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N), "max_tokens": 1}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N + 1)}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N + 50), "max_tokens": 1}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(10), "max_tokens": N + 1}),
    (COMPLETIONS, {"model": MODEL, "prompt": [ids(10), ids(N + 5)], "max_tokens": 1}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N + 50), "truncate_prompt_tokens": 10, "max_tokens": 1}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N + 50), "truncate_prompt_tokens": -1, "max_tokens": 1}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N + 50), "truncate_prompt_tokens": N}),
    (COMPLETIONS, {"model": MODEL, "prompt": ids(N + 50), "truncate_prompt_tokens": N + 1}),
    (COMPLETIONS, comp(ids(300), truncate_prompt_tokens=7, truncation_side="right", max_tokens=1)),
    (COMPLETIONS, {"model": MODEL, "prompt": "word " * (N + 100), "max_tokens": 1}),
    (COMPLETIONS, comp("hello world, " * 40, truncate_prompt_tokens=9, max_tokens=1)),
    (COMPLETIONS, comp("hello world, " * 40, truncate_prompt_tokens=9, truncation_side="left", max_tokens=1)),
    (CHAT, chat("word " * (N + 100), max_tokens=1)),
    (CHAT, chat("a short question", max_tokens=N + 1)),
    (CHAT, chat("a short question", max_completion_tokens=N + 1, max_tokens=1)),
    (CHAT, chat("a short question", max_completion_tokens=1, max_tokens=N + 1)),
    (CHAT, chat("word " * (N + 100), truncate_prompt_tokens=20, max_tokens=1)),
]  # fmt: skip


def ask_vllm(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """(200, the engine prompt's ids) or (status, vLLM's message without its parameter suffix)."""
    data = json.dumps({**body, "return_token_ids": True}).encode()
    req = urllib.request.Request(url + path, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            message = json.loads(err.read())["error"]["message"]
        return err.code, _SUFFIX.sub("", message)
    got = answer.get("prompt_token_ids") or answer["choices"][0]["prompt_token_ids"]
    return 200, list(got)


def ask_epp(stack: VllmStack, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    answer = stack.tokenize(body, path)
    if "status" in answer:
        return answer["status"], json.loads(answer["error"])["error"]["message"]
    return 200, answer["token_ids"]


def describe(got: tuple[int, Any]) -> str:
    status, what = got
    return f"{status} {what}" if status != 200 else f"200 ({len(what)} ids)"


def test_epp_learns_max_model_len_from_the_pods(stack: VllmStack) -> None:
    # The cards are read when a pod's scrape loop starts; a longer wait would mean they never were.
    wait_for(
        lambda: ask_epp(stack, COMPLETIONS, {"model": MODEL, "prompt": ids(N)})[0] == 400,
        within=30,
        what=f"epp never refused a {N}-token prompt (max_model_len not learned from /v1/models)",
    )


def test_refusals_and_ids_match_vllm_at_the_boundary(stack: VllmStack) -> None:
    pod = stack.pods[0]
    outcomes: list[str] = []
    bad: list[str] = []
    for path, body in CASES:
        theirs = ask_vllm(pod.url, path, body)
        ours = ask_epp(stack, path, body)
        outcomes.append(describe(theirs))
        if theirs != ours:
            shown = {k: (f"<{len(v)} items>" if isinstance(v, list) else v) for k, v in body.items()}
            bad.append(f"{path} {shown}\n  vLLM {describe(theirs)}\n  epp  {describe(ours)}")
    print("context-length outcomes:", json.dumps(outcomes))
    assert not bad, f"{len(bad)} of {len(CASES)} cases differ:\n" + "\n".join(bad)
    assert (
        sum(o.startswith("400") for o in outcomes) >= 10 and sum(o.startswith("200") for o in outcomes) >= 8
    )


def test_a_refused_request_is_answered_by_epp_through_the_gateway(stack: VllmStack) -> None:
    client = stack.client(timeout=120)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=ids(N + 10), max_tokens=1)
    message = caught.value.message
    assert caught.value.status_code == 400
    assert f"maximum context length is {N} tokens. However, your prompt contains {N + 10} input" in message
    # vLLM would have added " (parameter=input_tokens, value=...)": epp answered, no pod was asked.
    assert "(parameter=" not in message
