"""prefix-cache-scorer: block hashing, consecutive-prefix matching, LRU, purge, parameters."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.api.requests import Api, InferenceRequest
from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import prefix_cache_scorer

Scorer = prefix_cache_scorer.PrefixCacheScorer
BLOCK = 64  # characters per block with the default blockSizeTokens 16
_ids = itertools.count()


def pool(n: int) -> tuple[Datastore, list[Endpoint]]:
    ds = Datastore()
    added, _ = ds.sync(
        "test", [EndpointSpec(name=f"ep{i}", address=f"10.0.0.{i}", port=8000) for i in range(n)]
    )
    return ds, added


def make(ds: Datastore, **params: Any) -> Scorer:
    plugin = registry.default.build("prefix-cache-scorer", "prefix", params, interfaces.Handle(datastore=ds))
    assert isinstance(plugin, Scorer)
    return plugin


def chat(*texts: str, model: str = "llama") -> InferenceRequest:
    return InferenceRequest(
        request_id=str(next(_ids)),
        api=Api.CHAT,
        path="/v1/chat/completions",
        headers={},
        model=model,
        target_model=model,
        prompt_texts=list(texts),
    )


def tokens(*ids: list[int], model: str = "llama") -> InferenceRequest:
    return InferenceRequest(
        request_id=str(next(_ids)),
        api=Api.COMPLETIONS,
        path="/v1/completions",
        headers={},
        model=model,
        target_model=model,
        prompt_token_ids=list(ids),
        token_ids=ids[0],  # as parse_request sets it: a batch's first prompt
    )


def result(target: Endpoint, **other_profiles: Endpoint) -> interfaces.SchedulingResult:
    profiles = {"default": interfaces.ProfileResult("default", [target])}
    for name, ep in other_profiles.items():
        profiles[name] = interfaces.ProfileResult(name, [ep])
    return interfaces.SchedulingResult("default", profiles)


def route(
    plugin: Scorer, request: InferenceRequest, endpoints: list[Endpoint], target: Endpoint
) -> list[float]:
    """What the framework and the director do: score, then (the decision made) pre_request."""
    scores = plugin.score({}, request, endpoints)
    plugin.pre_request(request, result(target))
    return scores


SYSTEM = "You are a helpful assistant. Answer briefly and cite sources. " * 40  # 2480 chars


def test_registered_with_gie_type_name_and_protocols() -> None:
    assert "prefix-cache-scorer" in registry.default
    ds, _ = pool(1)
    plugin = make(ds)
    assert plugin.type == "prefix-cache-scorer" and plugin.name == "prefix"
    assert isinstance(plugin, interfaces.Scorer) and isinstance(plugin, interfaces.PreRequest)


def test_shared_system_prompt_scores_one_on_its_endpoint_and_zero_elsewhere() -> None:
    ds, eps = pool(3)
    plugin = make(ds)
    req = chat(SYSTEM, "What is the capital of France?")
    assert route(plugin, req, eps, eps[1]) == [0.0, 0.0, 0.0]  # cold index
    assert plugin.score({}, chat(SYSTEM, "What is the capital of France?"), eps) == [0.0, 1.0, 0.0]


def test_partial_match_ratio_counts_leading_blocks() -> None:
    ds, eps = pool(2)
    plugin = make(ds)
    system = "s" * (10 * BLOCK)
    route(plugin, chat(system, "a" * (2 * BLOCK)), eps, eps[0])
    # Same 10 system blocks, 2 different user blocks: 10 of 12 match.
    assert plugin.score({}, chat(system, "b" * (2 * BLOCK)), eps) == [pytest.approx(10 / 12), 0.0]
    # A trailing partial block is a block of its own: 10 full + 1 partial = 11, 10 match.
    assert plugin.score({}, chat(system, "b" * 10), eps) == [pytest.approx(10 / 11), 0.0]


def test_match_is_of_leading_blocks_only() -> None:
    ds, eps = pool(1)
    plugin = make(ds)
    route(plugin, chat("a" * BLOCK, "b" * BLOCK, "c" * BLOCK), eps, eps[0])
    # The second and third blocks have the same text, but the chain makes them different blocks.
    assert plugin.score({}, chat("x" * BLOCK, "b" * BLOCK, "c" * BLOCK), eps) == [0.0]


def test_several_endpoints_each_get_their_own_consecutive_count() -> None:
    ds, eps = pool(4)
    plugin = make(ds)
    a, b, c, d = ("a" * BLOCK, "b" * BLOCK, "c" * BLOCK, "d" * BLOCK)
    route(plugin, chat(a, b, c, d), eps, eps[0])
    route(plugin, chat(a, b, "x" * BLOCK), eps, eps[1])
    route(plugin, chat(a, "y" * BLOCK), eps, eps[2])
    assert plugin.score({}, chat(a, b, c, d), eps) == [1.0, 0.5, 0.25, 0.0]


def test_different_model_never_matches() -> None:
    ds, eps = pool(2)
    plugin = make(ds)
    route(plugin, chat(SYSTEM, model="llama"), eps, eps[0])
    assert plugin.score({}, chat(SYSTEM, model="mistral"), eps) == [0.0, 0.0]
    assert plugin.score({}, chat(SYSTEM, model="llama"), eps) == [1.0, 0.0]


def test_prompt_shorter_than_one_block_is_neither_scored_nor_recorded() -> None:
    ds, eps = pool(2)
    plugin = make(ds)
    route(plugin, chat("hi"), eps, eps[0])
    assert plugin.score({}, chat("hi"), eps) == [0.0, 0.0]
    assert plugin.indexed_blocks() == 0
    # A request without a prompt at all (header-only) likewise.
    assert plugin.score({}, chat(), eps) == [0.0, 0.0]


def test_chat_messages_are_concatenated_in_order() -> None:
    ds, eps = pool(1)
    plugin = make(ds)
    route(plugin, chat("a" * 40, "b" * 100), eps, eps[0])
    assert plugin.score({}, chat("a" * 40 + "b" * 100), eps) == [1.0]
    assert plugin.score({}, chat("b" * 100, "a" * 40), eps) == [0.0]


def test_hashes_go_to_cycle_state_and_pre_request_reuses_them(monkeypatch: pytest.MonkeyPatch) -> None:
    ds, eps = pool(2)
    plugin = make(ds)
    req = chat(SYSTEM)
    cycle: interfaces.CycleState = {}
    plugin.score(cycle, req, eps)
    hashes = cycle["prefix"]
    assert hashes == plugin.block_hashes(req) and len(hashes) == -(-len(SYSTEM) // BLOCK)

    calls = 0
    original = plugin.block_hashes

    def counting(request: InferenceRequest, endpoints: Any = ()) -> list[int]:
        nonlocal calls
        calls += 1
        return original(request, endpoints)

    monkeypatch.setattr(plugin, "block_hashes", counting)
    plugin.pre_request(req, result(eps[0]))
    assert calls == 0
    # A request that was not the last one scored is hashed afresh, and still recorded.
    other = chat("z" * 200)
    plugin.pre_request(other, result(eps[1]))
    assert calls == 1
    assert plugin.score({}, other, eps) == [0.0, 1.0]


def test_max_prefix_blocks_bounds_the_hashed_prefix() -> None:
    ds, eps = pool(1)
    plugin = make(ds, maxPrefixBlocksToMatch=4)
    assert len(plugin.block_hashes(chat("a" * (10 * BLOCK)))) == 4
    route(plugin, chat("a" * (4 * BLOCK), "first tail " * 50), eps, eps[0])
    assert plugin.score({}, chat("a" * (4 * BLOCK), "second tail " * 50), eps) == [1.0]


def test_lru_evicts_least_recent_blocks_at_capacity_tail_first() -> None:
    ds, eps = pool(1)
    plugin = make(ds, lruCapacityPerServer=4)
    a = chat("a" * (4 * BLOCK))
    route(plugin, a, eps, eps[0])
    assert plugin.held_blocks(eps[0]) == 4
    route(plugin, chat("b" * (2 * BLOCK)), eps, eps[0])
    assert plugin.held_blocks(eps[0]) == 4
    # Two of a's blocks were evicted, its tail ones: the leading half still matches.
    assert plugin.score({}, a, eps) == [0.5]
    # Recording `a` again touches its surviving blocks, so the b blocks are the ones to go.
    route(plugin, a, eps, eps[0])
    assert plugin.score({}, a, eps) == [1.0]
    assert plugin.score({}, chat("b" * (2 * BLOCK)), eps) == [0.0]
    assert plugin.indexed_blocks() == 4


def test_a_prompt_longer_than_the_capacity_keeps_its_leading_blocks() -> None:
    ds, eps = pool(1)
    plugin = make(ds, lruCapacityPerServer=3)
    route(plugin, chat("q" * (8 * BLOCK)), eps, eps[0])
    assert plugin.score({}, chat("q" * (8 * BLOCK)), eps) == [3 / 8]


@pytest.mark.parametrize(
    ("auto_tune", "num_gpu_blocks", "block_size", "capacity"),
    [
        (True, 3, 16, 3),
        (True, 3, 32, 6),  # vLLM blocks twice our size hold twice as many of ours
        (True, 3, 0, 3),  # block size not reported: assume ours
        (True, 0, 16, 5),  # not reported: lruCapacityPerServer
        (False, 3, 16, 5),
    ],
)
def test_auto_tune_takes_capacity_from_the_kv_cache_size(
    auto_tune: bool, num_gpu_blocks: int, block_size: int, capacity: int
) -> None:
    ds, eps = pool(1)
    eps[0].metrics.num_gpu_blocks = num_gpu_blocks
    eps[0].metrics.block_size = block_size
    plugin = make(ds, lruCapacityPerServer=5, autoTune=auto_tune)
    route(plugin, chat("c" * (20 * BLOCK)), eps, eps[0])
    assert plugin.held_blocks(eps[0]) == capacity


def test_removed_endpoint_is_purged() -> None:
    ds, eps = pool(3)
    plugin = make(ds)
    req = chat(SYSTEM)
    route(plugin, req, eps, eps[0])
    route(plugin, req, eps, eps[1])  # shared blocks: two owners each
    route(plugin, chat("only on ep0 " * 20), eps, eps[0])
    n_system = len(plugin.block_hashes(req))
    assert plugin.indexed_blocks() > n_system

    ds.sync("test", [eps[1].spec, eps[2].spec])
    assert plugin.held_blocks(eps[0]) == 0
    assert plugin.indexed_blocks() == n_system
    assert plugin.score({}, req, [eps[1], eps[2]]) == [1.0, 0.0]

    ds.sync("test", [eps[2].spec])
    assert plugin.indexed_blocks() == 0


def test_endpoint_recreated_under_the_same_name_starts_cold() -> None:
    ds, eps = pool(1)
    plugin = make(ds)
    req = chat(SYSTEM)
    route(plugin, req, eps, eps[0])
    (new,), (old,) = ds.sync("test", [EndpointSpec(name="ep0", address="10.0.1.9", port=8000)])
    assert old is eps[0]
    assert plugin.score({}, req, [new]) == [0.0]
    assert plugin.indexed_blocks() == 0


def test_endpoint_unknown_to_the_datastore_is_not_recorded() -> None:
    ds, _ = pool(1)
    plugin = make(ds)
    stray = Endpoint(spec=EndpointSpec(name="gone", address="10.9.9.9", port=1), hostport="10.9.9.9:1")
    route(plugin, chat(SYSTEM), [stray], stray)
    assert plugin.indexed_blocks() == 0


def test_prefill_profile_target_is_recorded_too() -> None:
    ds, eps = pool(3)
    plugin = make(ds)
    req = chat(SYSTEM)
    plugin.score({}, req, eps)
    plugin.pre_request(req, result(eps[0], prefill=eps[2]))
    assert plugin.score({}, req, eps) == [1.0, 0.0, 1.0]


def test_token_id_prompts_hash_blocks_of_ids() -> None:
    ds, eps = pool(2)
    plugin = make(ds)
    ids = list(range(1000, 1048))  # 3 blocks of 16
    assert len(plugin.block_hashes(tokens(ids))) == 3
    route(plugin, tokens(ids), eps, eps[1])
    assert plugin.score({}, tokens(ids), eps) == [0.0, 1.0]
    assert plugin.score({}, tokens(ids[:32] + [7] * 16), eps) == [0.0, pytest.approx(2 / 3)]
    assert plugin.score({}, tokens(ids, model="other"), eps) == [0.0, 0.0]
    # 40 ids: 2 full blocks and a partial one, the full ones matching.
    assert plugin.score({}, tokens(ids[:40]), eps) == [0.0, pytest.approx(2 / 3)]
    # In a batch, each prompt is its own sequence: the first one is scored.
    assert plugin.score({}, tokens(ids[:32] + [7] * 16, ids), eps) == [0.0, pytest.approx(2 / 3)]
    # Fewer ids than one block: no hashes.
    assert plugin.block_hashes(tokens(ids[:15])) == []


def test_block_size_tokens_sets_the_character_block() -> None:
    ds, _ = pool(1)
    plugin = make(ds, blockSizeTokens=8)  # 32 characters
    assert len(plugin.block_hashes(chat("x" * 31))) == 0
    assert len(plugin.block_hashes(chat("x" * 64))) == 2
    assert len(plugin.block_hashes(chat("x" * 65))) == 3
    assert len(plugin.block_hashes(tokens(list(range(17))))) == 3


@pytest.mark.parametrize(
    "params",
    [
        {"blockSize": 16},  # GIE's legacy name, rejected there too
        {"hashBlockSize": 64, "blockSizeTokens": 16},  # two names of one size
        {"hashBlockSize": 0},
        {"maxPrefixTokensToMatch": -1},
        {"blockSizeTokens": 0},
        {"maxPrefixBlocksToMatch": -1},
        {"lruCapacityPerServer": 0},
        {"blockSizeTokens": "16"},
        {"autoTune": "yes"},
    ],
)
def test_bad_parameters_are_rejected(params: dict[str, Any]) -> None:
    ds, _ = pool(1)
    with pytest.raises(registry.ConfigError, match=next(iter(params))):
        make(ds, **params)


def test_defaults_are_gie_defaults() -> None:
    ds, _ = pool(1)
    plugin = make(ds)
    # 16 tokens (64 characters) per block, 256 blocks at most.
    assert len(plugin.block_hashes(tokens(list(range(16 * 300))))) == 256
    assert len(plugin.block_hashes(tokens(list(range(33))))) == 3
    assert len(plugin.block_hashes(chat("x" * 129))) == 3
    p = Scorer.Params()
    assert (p.maxPrefixBlocksToMatch, p.lruCapacityPerServer, p.autoTune) == (256, 31250, True)


def test_gie_v1_0_hash_block_size_is_characters_per_block() -> None:
    ds, _ = pool(1)
    plugin = make(ds, hashBlockSize=5, maxPrefixBlocksToMatch=256)
    assert len(plugin.block_hashes(chat("x" * 12))) == 3  # 5 + 5 + a partial 2
    assert len(plugin.block_hashes(chat("x" * 4))) == 0  # shorter than a block
    # Token ids, which GIE v1.0 never hashed, are cut at 5 // 4 = 1 token per block.
    assert len(plugin.block_hashes(tokens([1, 2, 3]))) == 3


def test_max_prefix_tokens_to_match_overrides_blocks_in_whole_blocks() -> None:
    ds, _ = pool(1)
    plugin = make(ds, blockSizeTokens=16, maxPrefixBlocksToMatch=256, maxPrefixTokensToMatch=40)
    assert len(plugin.block_hashes(tokens(list(range(1000))))) == 2  # 40 // 16


# --- the index against a naive model -------------------------------------------------------------

_PROMPTS = [
    "".join(parts)
    for parts in itertools.product(["A" * BLOCK, "B" * BLOCK], ["C" * BLOCK, "D" * 30], ["E" * BLOCK])
]


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, len(_PROMPTS) - 1), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    capacity=st.integers(1, 8),
)
def test_index_matches_a_naive_lru_model(ops: list[tuple[int, int, bool]], capacity: int) -> None:
    ds, eps = pool(4)
    plugin = make(ds, lruCapacityPerServer=capacity)
    model: dict[Endpoint, list[int]] = {ep: [] for ep in eps}  # least recent first
    live = list(eps)
    for prompt, target, remove in ops:
        req = chat(_PROMPTS[prompt])
        hashes = plugin.block_hashes(req)
        expected = []
        for ep in live:
            held = set(model[ep])
            k = next((i for i, h in enumerate(hashes) if h not in held), len(hashes))
            expected.append(k / len(hashes))
        assert plugin.score({}, req, live) == pytest.approx(expected)
        if remove and len(live) > 1:
            gone = live.pop(target % len(live))
            model[gone] = []
            ds.sync("test", [ep.spec for ep in live])
            continue
        ep = live[target % len(live)]
        plugin.pre_request(req, result(ep))
        lru = model[ep]
        for h in reversed(hashes):
            if h in lru:
                lru.remove(h)
            lru.append(h)
        del lru[: max(0, len(lru) - capacity)]
    for ep in eps:
        assert plugin.held_blocks(ep) == len(model[ep])
    assert plugin.indexed_blocks() == len({h for ep in live for h in model[ep]})
