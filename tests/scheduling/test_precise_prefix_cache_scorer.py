"""precise-prefix-cache-scorer: index matches -> scores, key seeds per endpoint, tiers, speculative
entries, explain facts, and conformance with the KV events of a real vLLM."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp import clock as epp_clock
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Datastore, Endpoint
from epp.kvcache.events import BlockStored, EventBatch, decode_batch
from epp.kvcache.index import BlockIndex
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import precise_prefix_cache_scorer as mod

from . import builders

VECTORS = Path(__file__).parent.parent / "kvcache" / "data" / "vllm-0.32-cpu-capture-1.json"


def stored(tokens: list[int], *, block_size: int = 16, medium: str | None = "gpu", **kw: Any) -> BlockStored:
    n = len(tokens) // block_size
    base = kw.pop("hash_base", 1000)
    return BlockStored(
        block_hashes=[base + i for i in range(n)],
        parent_block_hash=None,
        token_ids=tokens,
        block_size=block_size,
        lora_id=None,
        medium=medium,
        lora_name=kw.pop("lora_name", None),
        extra_keys=kw.pop("extra_keys", None),
    )


def feed(index: BlockIndex, pod: str, *events: BlockStored, model: str = "m") -> None:
    index.apply(pod, EventBatch(0.0, list(events), 0), model=model)


def request(
    tokens: list[int] | None, *, target_model: str = "m", cache_salt: str | None = None
) -> InferenceRequest:
    req = builders.request(target_model=target_model)
    req.token_ids = tokens
    req.cache_salt = cache_salt
    return req


def scorer(index: BlockIndex, **params: Any) -> tuple[Any, interfaces.Handle]:
    """The plugin built as the config builds it, with `params`."""
    handle = builders.handle(index)
    plugin = registry.default.build("precise-prefix-cache-scorer", "precise", params, handle)
    return plugin, handle


def toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_scores_the_leading_run_over_request_blocks() -> None:
    index = BlockIndex()
    prompt = toks(64)  # 4 blocks of 16
    feed(index, "pod-0", stored(prompt[:64]))
    feed(index, "pod-1", stored(prompt[:32]))
    feed(index, "pod-2", stored(toks(64, start=500)))  # other content
    plugin, _ = scorer(index)
    eps = builders.pool(4)
    cycle: interfaces.CycleState = {}
    assert plugin.score(cycle, request([*prompt, 9, 9, 9]), eps) == [1.0, 0.5, 0.0, 0.0]
    facts = plugin.explain(cycle)
    assert facts["request"] == {"request_blocks": 4, "request_tokens": 67, "block_size": 16}
    assert facts["endpoints"] == {
        "pod-0": {"matched_blocks": 4, "tier": "gpu", "cached_tokens": 64},
        "pod-1": {"matched_blocks": 2, "tier": "gpu", "cached_tokens": 32},
    }


def test_no_tokens_or_less_than_a_block_scores_zero() -> None:
    index = BlockIndex()
    feed(index, "pod-0", stored(toks(32)))
    plugin, _ = scorer(index)
    eps = builders.pool(2)
    assert plugin.score({}, request(None), eps) == [0.0, 0.0]
    assert plugin.score({}, request(toks(15)), eps) == [0.0, 0.0]
    cycle: interfaces.CycleState = {}
    plugin.score(cycle, request([]), eps)
    assert plugin.explain(cycle)["request"]["request_blocks"] == 0


def test_offloaded_blocks_weigh_less() -> None:
    index = BlockIndex()
    prompt = toks(64)
    feed(index, "pod-0", stored(prompt, medium="GPU"))
    feed(index, "pod-1", stored(prompt, medium="CPU"))
    plugin, _ = scorer(index, offloadWeight=0.5)
    cycle: interfaces.CycleState = {}
    assert plugin.score(cycle, request(prompt), builders.pool(2)) == [1.0, 0.5]
    assert plugin.explain(cycle)["endpoints"]["pod-1"]["tier"] == "offload"


def test_block_size_comes_from_events_then_metrics_then_the_parameter() -> None:
    index = BlockIndex()
    prompt = toks(64)
    feed(index, "pod-0", stored(prompt, block_size=32))
    plugin, _ = scorer(index)
    eps = builders.pool(2)
    eps[1].metrics.block_size = 8
    cycle: interfaces.CycleState = {}
    assert plugin.score(cycle, request(prompt), eps) == [1.0, 0.0]
    assert plugin.explain(cycle)["request"]["block_size"] == 32
    # A fixed blockSize that differs from the events' keys nothing they stored.
    fixed, _ = scorer(index, blockSize=16)
    assert fixed.score({}, request(prompt), eps) == [0.0, 0.0]


def test_cached_tokens_use_each_endpoints_block_size() -> None:
    index = BlockIndex()
    prompt = toks(100)
    feed(index, "pod-0", stored(prompt[:32], block_size=16))
    feed(index, "pod-1", stored(prompt[:64], block_size=32))
    plugin, _ = scorer(index)
    cycle: interfaces.CycleState = {}
    plugin.score(cycle, request(prompt), builders.pool(2))
    found = plugin.explain(cycle)["endpoints"]
    assert found["pod-0"]["cached_tokens"] == 32 and found["pod-1"]["cached_tokens"] == 64


def test_lora_adapter_and_cache_salt_select_their_own_blocks() -> None:
    index = BlockIndex()
    prompt = toks(32)
    feed(index, "pod-0", stored(prompt, lora_name="adapter", extra_keys=[("adapter",), None]), model="base")
    feed(index, "pod-1", stored(prompt, extra_keys=[("s3cret",), None]), model="base")
    feed(index, "pod-2", stored(prompt), model="base")
    plugin, _ = scorer(index)
    eps = builders.pool(3)
    assert plugin.score({}, request(prompt, target_model="adapter"), eps) == [1.0, 0.0, 0.0]
    assert plugin.score({}, request(prompt, target_model="base", cache_salt="s3cret"), eps) == [0.0, 1.0, 0.0]
    assert plugin.score({}, request(prompt, target_model="base"), eps) == [0.0, 0.0, 1.0]


def test_an_adapter_the_pod_reports_running_is_one_even_with_the_base_model_unknown() -> None:
    index = BlockIndex()
    prompt = toks(32)
    feed(index, "pod-0", stored(prompt, lora_name="sql", extra_keys=[("sql",), None]), model="")
    feed(index, "pod-1", stored(prompt), model="")
    plugin, _ = scorer(index)
    eps = builders.pool(2)
    # Unknown base model, adapter not seen: taken for the base model (vLLM would not hit).
    assert plugin.score({}, request(prompt, target_model="sql"), eps) == [0.0, 1.0]
    eps[0].metrics.running_loras = frozenset({"sql"})
    eps[1].metrics.waiting_loras = frozenset({"sql"})
    assert plugin.score({}, request(prompt, target_model="sql"), eps) == [1.0, 0.0]


def test_model_unknown_to_the_index_falls_back_to_the_endpoint_spec() -> None:
    """Speculative entries on a pod without events yet are keyed with the configured model."""
    index = BlockIndex()
    plugin, _ = scorer(index)
    eps = builders.pool(1)
    req = request(toks(32), target_model="base")
    plugin.score({}, req, eps)
    plugin.pre_request(req, _result(eps[0]))
    assert plugin.score({}, request(toks(32), target_model="base"), eps) == [1.0]


def _result(primary: Endpoint) -> interfaces.SchedulingResult:
    return interfaces.SchedulingResult("default", {"default": interfaces.ProfileResult("default", [primary])})


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as s:
        yield s


class Clock:
    """A virtual clock for `epp.clock.use`."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_speculative_entries_hold_until_the_ttl(stack: contextlib.ExitStack) -> None:
    clock = Clock()
    stack.enter_context(epp_clock.use(clock))
    index = BlockIndex()
    plugin, _ = scorer(index, speculativeTTLSeconds=2.0)
    eps = builders.pool(3)
    prompt = toks(64)
    first = request(prompt)
    assert plugin.score({}, first, eps) == [0.0, 0.0, 0.0]
    plugin.pre_request(first, _result(eps[1]))
    # A burst sibling sharing the first 2 blocks follows the first request.
    cycle: interfaces.CycleState = {}
    assert plugin.score(cycle, request(prompt[:32] + toks(32, 900)), eps) == [0.0, 0.5, 0.0]
    assert plugin.explain(cycle)["endpoints"]["pod-1"]["tier"] == "speculative"
    # The real event lands: the index now answers (and outlives the speculative entry).
    feed(index, "pod-1", stored(prompt))
    clock.now += 2.5
    cycle = {}
    assert plugin.score(cycle, request(prompt), eps) == [0.0, 1.0, 0.0]
    assert plugin.explain(cycle)["endpoints"]["pod-1"]["tier"] == "gpu"
    # Never confirmed: gone after the TTL.
    other = request(toks(64, 5000))
    plugin.score({}, other, eps)
    plugin.pre_request(other, _result(eps[2]))
    assert plugin.score({}, request(toks(64, 5000)), eps) == [0.0, 0.0, 1.0]
    clock.now += 2.01
    assert plugin.score({}, request(toks(64, 5000)), eps) == [0.0, 0.0, 0.0]


def test_a_re_added_key_keeps_its_later_deadline(stack: contextlib.ExitStack) -> None:
    clock = Clock()
    stack.enter_context(epp_clock.use(clock))
    plugin, _ = scorer(BlockIndex(), speculativeTTLSeconds=2.0)
    eps = builders.pool(1)
    for _ in range(2):
        req = request(toks(32))
        plugin.score({}, req, eps)
        plugin.pre_request(req, _result(eps[0]))
        clock.now += 1.5
    # The first deadline (101.5... now 103) passed, the second (103.5) has not.
    assert plugin.score({}, request(toks(32)), eps) == [1.0]


def test_speculation_off_and_removed_endpoints_drop_entries() -> None:
    off, _ = scorer(BlockIndex(), speculativeTTLSeconds=0)
    eps = builders.pool(1)
    req = request(toks(32))
    off.score({}, req, eps)
    off.pre_request(req, _result(eps[0]))
    assert off.score({}, request(toks(32)), eps) == [0.0]

    plugin, handle = scorer(BlockIndex())
    ds = handle.datastore
    ds.sync("test", [ep.spec for ep in builders.pool(2)])
    eps = ds.candidates()
    req = request(toks(32))
    plugin.score({}, req, eps)
    plugin.pre_request(req, _result(eps[0]))
    assert plugin.score({}, request(toks(32)), eps) == [1.0, 0.0]
    ds.sync("test", [eps[1].spec])
    assert plugin.score({}, request(toks(32)), ds.candidates()) == [0.0]
    # A request pre_request never scored (another profile) records nothing.
    plugin.pre_request(request(toks(32)), _result(ds.candidates()[0]))
    assert plugin.score({}, request(toks(32)), ds.candidates()) == [0.0]


def test_max_prefix_blocks_limits_the_keys() -> None:
    index = BlockIndex()
    prompt = toks(64)
    feed(index, "pod-0", stored(prompt[:16]))
    plugin, _ = scorer(index, maxPrefixBlocksToMatch=2)
    assert plugin.score({}, request(prompt), builders.pool(1)) == [0.5]


def test_a_prompt_nobody_holds_has_a_home_endpoint() -> None:
    index = BlockIndex()
    plugin, _ = scorer(index, homeScore=0.5)
    eps = builders.pool(8)
    cycle: interfaces.CycleState = {}
    scores = plugin.score(cycle, request(toks(64)), eps)
    assert sorted(scores) == [0.0] * 7 + [0.5]
    home = eps[scores.index(0.5)].name
    assert plugin.explain(cycle)["endpoints"] == {
        home: {"matched_blocks": 0, "tier": "home", "cached_tokens": 0}
    }
    # The same first block: the same home, whatever follows, and in any endpoint order.
    assert plugin.score({}, request([*toks(16), *toks(48, 700)]), eps[::-1]) == scores[::-1]
    # Spread: different prompts have different homes, and every prompt has one (hashes may be
    # negative: none may be missed).
    homes = {plugin.score({}, request(toks(32, 1000 * i)), eps).index(0.5) for i in range(40)}
    assert len(homes) >= 6
    for i in range(200):
        assert sorted(plugin.score({}, request(toks(32, 7 * i)), eps[:2])) == [0.0, 0.5]
    # Once any endpoint holds a block, matches decide alone.
    feed(index, "pod-3", stored(toks(16)))
    assert plugin.score({}, request(toks(64)), eps) == [0.0, 0.0, 0.0, 0.25, 0.0, 0.0, 0.0, 0.0]


def test_homes_agree_across_processes() -> None:
    """Independent epp replicas must pick the same home: no salted str hash in it."""
    code = (
        "from tests.scheduling.test_precise_prefix_cache_scorer import scorer, request, toks;"
        "from tests.scheduling import builders; from epp.kvcache.index import BlockIndex;"
        "p, _ = scorer(BlockIndex(), homeScore=1.0);"
        "print(p.score({}, request(toks(64, 3)), builders.pool(16)).index(1.0))"
    )
    picks = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(picks) == 1, picks


def test_needs_an_index() -> None:
    with pytest.raises(registry.ConfigError, match="needs vLLM KV events"):
        registry.default.build(
            "precise-prefix-cache-scorer", "p", {}, interfaces.Handle(datastore=Datastore())
        )


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"gpuWeight": 1.5}, "$.gpuWeight"),
        ({"blockSize": -1}, "$.blockSize"),
        ({"speculativeTTLs": 1}, "unknown field `speculativeTTLs`"),
        ({"speculativeTTL": 1}, "$.speculativeTTL"),
    ],
)
def test_bad_parameters(params: dict[str, Any], fragment: str) -> None:
    with pytest.raises(registry.ConfigError, match=fragment.replace("$", r"\$").replace(".", r"\.")):
        scorer(BlockIndex(), **params)


@pytest.mark.parametrize(
    ("prompt", "blocks", "size", "expected"),
    [(100, 3, 32, 96), (96, 3, 32, 64), (97, 3, 32, 96), (10, 0, 16, 0), (0, 2, 16, 0), (64, 4, 16, 48)],
)
def test_cached_tokens_as_vllm_reports_them(prompt: int, blocks: int, size: int, expected: int) -> None:
    assert mod.cached_tokens(prompt, blocks, size) == expected


DATA = json.loads(VECTORS.read_text())


@pytest.mark.parametrize("capture", DATA["captures"], ids=[c["name"] for c in DATA["captures"]])
def test_conformance_with_real_vllm_events(capture: dict[str, Any]) -> None:
    """The frames a real vLLM 0.32 published for each step of the captured scenario (every hash
    setting captured), fed in order: after each, the requests seen so far match as far as vLLM
    itself still caches them."""
    steps = {s["step"].split(":")[0]: s.get("prompt_token_ids") for s in DATA["steps"]}
    p1, p2, p3, e1 = steps["P1"], steps["P2"], steps["P3"], steps["E1"]
    index = BlockIndex()
    plugin, _ = scorer(index)
    eps = builders.pool(2)
    frames = [bytes.fromhex(m["payload_hex"]) for m in capture["messages"]]

    def blocks(tokens: list[int]) -> int:
        cycle: interfaces.CycleState = {}
        plugin.score(cycle, request(tokens, target_model="tiny"), eps)
        found = plugin.explain(cycle)["endpoints"]
        assert set(found) <= {"pod-0"}  # pod-1 never had events
        return int(found["pod-0"]["matched_blocks"]) if found else 0

    def apply(i: int) -> None:
        index.apply("pod-0", decode_batch(frames[i]), model="")

    apply(0)  # P1: 3 full blocks of 32
    assert (blocks(p1), blocks(p2)) == (3, 2)
    apply(1)  # P2 adds its own third block under P1's second
    assert (blocks(p1), blocks(p2)) == (3, 3)
    apply(2)  # P3: 30 prompt tokens + 8 generated: the block completed during decode
    assert blocks(p3) == 0  # its prompt alone has no full block
    apply(3)
    apply(4)
    assert blocks(e1) == 15
    apply(5)  # E3 evicts P1, P2, P3 and the last 7 blocks of E1 (freed tail first)
    assert (blocks(p1), blocks(p2), blocks(e1)) == (0, 0, 8)
    apply(6)  # /reset_prefix_cache, then P1 again
    assert (blocks(p1), blocks(p2), blocks(e1)) == (3, 2, 0)
    # What vLLM will report as cached for P1 now: 3 blocks of 32 (100 tokens, last one computed).
    cycle: interfaces.CycleState = {}
    plugin.score(cycle, request(p1, target_model="tiny"), eps)
    assert plugin.explain(cycle)["endpoints"]["pod-0"]["cached_tokens"] == 96


def test_keys_prepared_ahead_score_as_keys_computed_in_score() -> None:
    """`prepare` (the Preparer stage, in a worker thread for long prompts) computes the keys that
    `score` would: the same scores and facts, its keys taken once, and never more than
    PREPARED_MAX requests' keys kept."""
    index = BlockIndex()
    prompt = toks(4096)
    feed(index, "pod-0", stored(prompt[:2048]))
    feed(index, "pod-1", stored(prompt[:1024], block_size=32), model="m")
    eps = builders.pool(3)
    plain, _ = scorer(index)
    ahead, _ = scorer(index)
    req = request(prompt)
    cycle_plain: interfaces.CycleState = {}
    expected = plain.score(cycle_plain, req, eps)
    ahead.prepare(req, eps)
    assert len(ahead._prepared) == 1
    cycle_ahead: interfaces.CycleState = {}
    assert ahead.score(cycle_ahead, req, eps) == expected == [0.5, 0.25, 0.0]
    assert ahead.explain(cycle_ahead) == plain.explain(cycle_plain)
    assert not ahead._prepared  # taken
    # Keys prepared for other token ids (replaced since) are not used.
    ahead.prepare(req, eps)
    req.token_ids = toks(4096, start=10_000)
    assert ahead.score({}, req, eps) == [0.0, 0.0, 0.0] and not ahead._prepared
    for i in range(mod.PREPARED_MAX + 5):
        r = request(prompt)
        r.request_id = f"never-scored-{i}"
        ahead.prepare(r, eps)
    assert len(ahead._prepared) == mod.PREPARED_MAX


class _Ids(list[int]):
    """Token ids that can be weakly referenced, to see whether the scorer keeps them alive."""


def test_the_scorer_keeps_no_request_or_ids_alive() -> None:
    """Keys prepared for a request never scored (its stream cancelled while they were computed,
    or a profile it did not run) held the request's token ids until PREPARED_MAX others came; the
    last request scored stayed alive (with its body) until the next one. Entries are also bounded
    by their keys in all."""
    index = BlockIndex()
    eps = builders.pool(2)
    plugin, _ = scorer(index)
    never = request(_Ids(toks(4096)))
    gone = weakref.ref(never.token_ids)
    plugin.prepare(never, eps)
    assert len(plugin._prepared) == 1
    del never
    gc.collect()
    assert gone() is None
    routed = request(_Ids(toks(4096, start=50_000)))
    routed.request_id = "routed"
    plugin.prepare(routed, eps)
    plugin.score({}, routed, eps)
    plugin.pre_request(routed, _result(eps[0]))
    ids = weakref.ref(routed.token_ids)
    del routed
    gc.collect()
    assert ids() is None
    # 300 prompts of 4,096 tokens are 76,800 keys: bounded at a fifth of that, the oldest go.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mod, "PREPARED_MAX_KEYS", 256 * 60)
        for i in range(300):
            r = request(toks(4096))
            r.request_id = f"never-scored-{i}"
            plugin.prepare(r, eps)
    assert plugin._prepared_keys == 256 * 60 == sum(mod._count(k) for _, k in plugin._prepared.values())
    assert next(reversed(plugin._prepared)) == "never-scored-299"


# --- speculative keys past DENSE_BLOCKS are kept sparse ------------------------------------------


def _exact_run(chains: list[list[int]], keys: list[int]) -> int:
    """The leading `keys` some chain holds, walked key by key (what the scorer found before)."""
    held = {k for chain in chains for k in chain}
    run = 0
    while run < len(keys) and keys[run] in held:
        run += 1
    return run


def _chain(prefix: list[int], n: int, salt: int) -> list[int]:
    """`n` keys whose first len(prefix) are `prefix`: a chained key stands for its whole prefix."""
    return (prefix + [salt * 1_000_000 + i for i in range(len(prefix), n)])[:n]


@settings(max_examples=300, deadline=None)
@given(
    held=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 60)), min_size=1, max_size=4),
    shared=st.integers(0, 40),
    n=st.integers(1, 60),
)
def test_a_sparse_speculative_run_is_exact_to_the_stride(
    held: list[tuple[int, int]], shared: int, n: int
) -> None:
    """Held chains share a base prefix for their first `s` keys; the prompt shares `shared` of
    them. The run found is the walk's, rounded down to a kept key: exact below DENSE_BLOCKS and
    for a chain held whole, never more than the walk, never SPARSE_STRIDE or more below it."""
    base = list(range(1, 61))
    chains = [_chain(base[:s], length, salt=j + 1) for j, (s, length) in enumerate(held)]
    keys = _chain(base[:shared], n, salt=99)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mod, "DENSE_BLOCKS", 8)
        patch.setattr(mod, "SPARSE_STRIDE", 4)
        spec = mod._Speculative()
        for chain in chains:
            if chain:
                spec.add("pod", chain, deadline=1.0)
        found = spec.runs(keys, ["pod"]).get("pod", 0)
    exact = _exact_run(chains, keys)
    assert found <= exact
    assert exact - found < 4
    if exact <= 8 or keys in chains:
        assert found == exact


def test_a_long_prompt_adds_a_sparse_speculative_entry() -> None:
    """A 200k-token prompt's 12.5k keys: the dense head and one in SPARSE_STRIDE are added on
    the loop, not all of them; the same prompt still finds its whole run."""
    spec = mod._Speculative()
    keys = list(range(1, 12_501))
    spec.add("pod", keys, deadline=1.0)
    stored = len(spec._by_pod["pod"].keys)
    assert stored <= mod.DENSE_BLOCKS + (len(keys) - mod.DENSE_BLOCKS) // mod.SPARSE_STRIDE + 1
    assert spec.runs(keys, ["pod"]) == {"pod": len(keys)}
    spec.expire(2.0)
    assert not spec


def test_speculative_keys_expire_with_their_latest_entry_and_stay_bounded() -> None:
    """A key re-added by a later entry outlives the earlier one; a pod goes once its last entry
    has expired; a pod never idle keeps its dead keys to a bound (compaction), not forever."""
    spec = mod._Speculative()
    old, shared = [101, 102, 103], [201, 202]
    spec.add("pod", [*old, 1], deadline=1.0)
    spec.add("pod", shared, deadline=1.5)
    spec.add("pod", [*shared, 7], deadline=2.0)
    spec.expire(1.2)
    assert spec.runs([*old, 1], ["pod"]) == {}
    assert spec.runs([*shared, 7], ["pod"]) == {"pod": 3}
    spec.expire(1.7)
    assert spec.runs(shared, ["pod"]) == {"pod": 2}  # 1.5's entry expired, 2.0's holds them
    spec.drop("pod")
    spec.add("pod", [9], deadline=3.0)
    spec.expire(2.5)  # the dropped pod's entry expiring leaves the new one alone
    assert spec.runs([9], ["pod"]) == {"pod": 1}
    spec.expire(3.0)
    assert not spec

    steady = mod._Speculative()
    for i in range(200):  # each request's own 100 keys, after a shared head, one TTL of 10 apart
        steady.expire(float(i))
        steady.add("pod", [1, 2, 3] + [i * 1000 + j for j in range(100)], deadline=i + 10.0)
    held = steady._by_pod["pod"].keys
    live = 3 + 10 * 100
    assert len(held) <= 2 * live + mod.COMPACT_MIN_KEYS
    assert steady.runs([1, 2, 3], ["pod"]) == {"pod": 3}
