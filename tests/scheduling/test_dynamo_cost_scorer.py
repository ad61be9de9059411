"""dynamo-cost-scorer: Dynamo's cost `weight * prefill blocks + decode blocks`, lowest wins
(peers.md 4.1); decode blocks from its own bookings, shared blocks counted once."""

from __future__ import annotations

from typing import Any

import pytest

from epp.api.requests import InferenceRequest
from epp.kvcache.events import BlockStored, EventBatch
from epp.kvcache.index import BlockIndex
from epp.scheduling import interfaces, registry

from . import builders


def feed(index: BlockIndex, pod: str, tokens: list[int], *, block_size: int = 4) -> None:
    n = len(tokens) // block_size
    ev = BlockStored(
        block_hashes=[sum(map(ord, pod)) * 100 + i for i in range(n)],  # any per-pod engine hashes
        parent_block_hash=None,
        token_ids=tokens[: n * block_size],
        block_size=block_size,
    )
    index.apply(pod, EventBatch(0.0, [ev]), model="m")


def scorer(index: BlockIndex, **params: Any) -> Any:
    return registry.default.build("dynamo-cost-scorer", "dynamo", params, builders.handle(index))


def request(tokens: list[int], rid: str = "req-1") -> InferenceRequest:
    req = builders.request(target_model="m")
    req.request_id = rid
    req.token_ids = tokens
    req.prompt_tokens_estimate = len(tokens)
    return req


def route(s: Any, req: InferenceRequest, eps: list[Any], to: Any) -> None:
    """Score, then book `req` on `to` as the Director does after a pick."""
    s.score({}, req, eps)
    s.pre_request(
        req, interfaces.SchedulingResult("default", {"default": interfaces.ProfileResult("default", [to])})
    )


def test_overlap_prices_the_prefill_and_the_argmin_scores_one() -> None:
    # A 10-block prompt (block size 4); each worker holds a different leading run.
    index = BlockIndex()
    prompt = list(range(40))
    feed(index, "w1", prompt[:8])  # 2 blocks
    feed(index, "w2", prompt[:32])  # 8 blocks
    feed(index, "w3", prompt[:24])  # 6 blocks
    eps = [builders.endpoint(n) for n in ("w1", "w2", "w3")]
    s = scorer(index)
    # Nothing active: decode = the request's own 10 blocks. w1 8 + 10, w2 2 + 10, w3 4 + 10.
    assert s.costs(request(prompt), eps) == [18.0, 12.0, 14.0]
    assert s.score({}, request(prompt), eps) == [0.0, 1.0, 4 / 6]


def test_active_requests_add_their_distinct_blocks_until_they_finish() -> None:
    index = BlockIndex()
    a, b = builders.endpoint("a"), builders.endpoint("b")
    s = scorer(index, blockSize=4)
    other = [1000 + i for i in range(40)]  # 10 blocks sharing nothing with `prompt`
    route(s, request(other, "r1"), [a, b], a)
    assert s.active_blocks("a") == 10
    prompt = list(range(40))
    # a: prefill 10 + decode (10 active + 10 new) = 30; b: 10 + 10 = 20
    assert s.costs(request(prompt), [a, b]) == [30.0, 20.0]
    s.response_complete(request(other, "r1"), interfaces.RequestOutcome(endpoint=a))
    assert s.active_blocks("a") == 0
    assert s.costs(request(prompt), [a, b]) == [20.0, 20.0]


def test_shared_prefix_blocks_count_once() -> None:
    # Dynamo's assume-kv-reuse: two requests on one 8-block system prompt occupy 8 + 2 + 2 blocks.
    index = BlockIndex()
    a = builders.endpoint("a")
    s = scorer(index, blockSize=4)
    system = list(range(32))
    route(s, request([*system, 100, 101, 102, 103, 104, 105, 106, 107], "r1"), [a], a)
    route(s, request([*system, 200, 201, 202, 203, 204, 205, 206, 207], "r2"), [a], a)
    assert s.active_blocks("a") == 12
    # A third on the same system prompt adds only its own 2 blocks: 12 + 2 = 14 decode blocks.
    third = [*system, 300, 301, 302, 303, 304, 305, 306, 307]
    assert s.costs(request(third, "r3"), [a]) == [10.0 + 14.0]
    s.response_complete(request([], "r1"), interfaces.RequestOutcome(endpoint=a))
    assert s.active_blocks("a") == 10


def test_weight_trades_overlap_against_load() -> None:
    index = BlockIndex()
    prompt = list(range(40))
    feed(index, "cached", prompt)  # all 10 blocks cached
    cached, idle = builders.endpoint("cached"), builders.endpoint("idle")
    s1, s2 = scorer(index, blockSize=4), scorer(index, blockSize=4, overlapScoreWeight=2.0)
    for s in (s1, s2):  # 12 unrelated active blocks on the cached pod
        route(s, request([5000 + i for i in range(48)], "busy"), [cached], cached)
    req = request(prompt)
    # weight 1: cached 0 + (12 + 10) = 22, idle 10 + 10 = 20 -> idle wins
    assert s1.score({}, req, [cached, idle]) == [0.0, 1.0]
    # weight 2: cached 0 + 22 = 22, idle 20 + 10 = 30 -> cached wins
    assert s2.score({}, req, [cached, idle]) == [1.0, 0.0]


def test_only_the_leading_run_counts_and_blocks_round_up() -> None:
    index = BlockIndex()
    prompt = list(range(42))  # 10 full blocks + 2 tokens: 11 blocks
    feed(index, "a", [999, *prompt[1:40]])  # differs in the first block: no leading run
    feed(index, "b", prompt[:20])  # 5 leading blocks
    eps = [builders.endpoint("a"), builders.endpoint("b")]
    # a: 11 + 11 = 22; b: (11 - 5) + 11 = 17
    assert scorer(index).costs(request(prompt), eps) == [22.0, 17.0]


def test_without_token_ids_the_estimate_prices_prefill_with_no_overlap() -> None:
    req = builders.request(target_model="m")
    req.prompt_tokens_estimate = 32
    eps = [builders.endpoint("a"), builders.endpoint("b")]
    assert scorer(BlockIndex()).costs(req, eps) == [4.0, 4.0]  # block size 16: 2 + 2 each


def test_needs_kv_events() -> None:
    with pytest.raises(registry.ConfigError, match="needs vLLM KV events"):
        registry.default.build("dynamo-cost-scorer", "d", None, builders.handle(None))
