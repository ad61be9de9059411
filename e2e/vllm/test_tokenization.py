"""epp's token ids equal the ids vLLM feeds its engine, on a few hundred varied requests.

epp's side is `POST /debug/tokenize` on its metrics port: exactly the ids epp scores. vLLM's side
is the request itself sent through Envoy with the OpenAI client and `"return_token_ids": true`,
which answers the engine prompt's ids (`prompt_token_ids`); vLLM's POST /tokenize takes another
path (reference notes, vllm-chat-preprocessing.md) and is not used. Requests come from
`chat_requests.cases`: completions, and chat in five template styles.

Outcomes per request: equal ids; both refuse (vLLM 400, and epp answers an error or no ids);
epp has ids where vLLM refused (counted, reported; routing a request the server will refuse costs
nothing); anything else is a mismatch and fails the test, listed with both id lists.
"""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import openai
import pytest

from e2e.vllm.chat_requests import Case, cases
from e2e.vllm.stack import VllmStack

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

SEED = 20261122
PER_STYLE = 45
COMPLETIONS = 50


def vllm_ids(client: openai.OpenAI, case: Case) -> list[int] | str:
    """The engine prompt ids vLLM reports, or the error text of a 400."""
    body = dict(case.body)
    model = body.pop("model")
    extra = {"return_token_ids": True, **body}
    try:
        if case.path == "/v1/completions":
            prompt = extra.pop("prompt")
            completion = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body=extra)
            choice_extra = completion.choices[0].model_extra or {}
            return list(choice_extra["prompt_token_ids"])
        messages = extra.pop("messages")
        chat = client.chat.completions.create(model=model, messages=messages, max_tokens=1, extra_body=extra)
        return list((chat.model_extra or {})["prompt_token_ids"])
    except openai.BadRequestError as err:
        return f"400 {err.message}"


def compare(stack: VllmStack, client: openai.OpenAI, case: Case) -> dict[str, Any]:
    theirs = vllm_ids(client, case)
    mine = stack.tokenize(case.body, case.path)
    ours = mine.get("token_ids")
    if isinstance(theirs, str):
        outcome = "both refuse" if ours is None else "epp ids, vLLM refuses"
    else:
        outcome = "equal" if ours == theirs else "mismatch"
    return {"outcome": outcome, "case": case, "vllm": theirs, "epp": mine}


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_epp_tokenizes_like_vllms_engine(stack: VllmStack) -> None:
    all_cases = cases(SEED, PER_STYLE, COMPLETIONS)
    client = stack.client(timeout=120)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: compare(stack, client, c), all_cases))
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print("tokenization outcomes:", json.dumps(counts))
    bad = [r for r in results if r["outcome"] == "mismatch"]
    lines = []
    for r in bad[:8]:
        ours = r["epp"].get("token_ids")
        at = first_difference(ours or [], r["vllm"])
        lines.append(
            f"{r['case'].describe()}\n  epp  {r['epp'] if ours is None else ours[max(0, at - 5) : at + 10]}"
            f"\n  vLLM {r['vllm'][max(0, at - 5) : at + 10]} (first difference at {at}; lengths "
            f"{len(ours or [])} / {len(r['vllm'])})"
        )
    assert not bad, f"{len(bad)} of {len(results)} requests tokenized differently:\n" + "\n".join(lines)
    assert counts.get("equal", 0) >= 200, counts
    assert counts.get("both refuse", 0) + counts.get("epp ids, vLLM refuses", 0) >= 2, counts


def test_completions_without_special_tokens(stack: VllmStack) -> None:
    """vLLM's completions endpoint takes `add_special_tokens` (default true): false means no BOS."""
    client = stack.client(timeout=120)
    prompts = ["Hello there, how are you?", "  leading spaces", "<s> a literal BOS string", "12345 numbers"]
    results = [
        compare(
            stack,
            client,
            Case("/v1/completions", {"model": "tiny", "prompt": p, "add_special_tokens": False}),
        )
        for p in prompts
    ]
    assert [r["outcome"] for r in results] == ["equal"] * len(prompts), [
        (r["epp"].get("token_ids"), r["vllm"]) for r in results
    ]
