"""Each built-in scorer, table-driven: endpoint state in, one score per endpoint out."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.scheduling import framework

from . import builders

E = builders.endpoint


@pytest.mark.parametrize(
    ("waiting", "expected"),
    [
        ([0, 5, 10], [1.0, 0.5, 0.0]),
        ([3, 3, 3], [1.0, 1.0, 1.0]),  # all equal: nothing to prefer
        ([7], [1.0]),
        ([4, 0], [0.0, 1.0]),
        ([2, 6, 4, 10], [1.0, 0.5, 0.75, 0.0]),
    ],
)
def test_queue_scorer(waiting: list[int], expected: list[float]) -> None:
    eps = [E(f"e{i}", waiting=w) for i, w in enumerate(waiting)]
    assert builders.plugin("queue-scorer").score({}, builders.request(), eps) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("running", "expected"),
    [
        ([0, 5, 10], [1.0, 0.5, 0.0]),
        ([1, 1], [1.0, 1.0]),
        ([9, 3], [0.0, 1.0]),
    ],
)
def test_running_requests_size_scorer(running: list[int], expected: list[float]) -> None:
    eps = [E(f"e{i}", running=r, waiting=100 - i) for i, r in enumerate(running)]  # waiting is not read
    scorer = builders.plugin("running-requests-size-scorer")
    assert scorer.score({}, builders.request(), eps) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("kv", "expected"),
    [
        ([0.0, 0.25, 1.0], [1.0, 0.75, 0.0]),
        ([0.5], [0.5]),
        ([1.2], [-0.2]),  # out of range on purpose: the framework clamps, see test_framework
    ],
)
def test_kv_cache_utilization_scorer(kv: list[float], expected: list[float]) -> None:
    eps = [E(f"e{i}", kv=k) for i, k in enumerate(kv)]
    scorer = builders.plugin("kv-cache-utilization-scorer")
    assert scorer.score({}, builders.request(), eps) == pytest.approx(expected)


# (running, waiting, max_lora) per endpoint, target adapter, expected scores
LORA_CASES: list[tuple[list[tuple[set[str], set[str], int]], str, list[float]]] = [
    # active wins; a free slot beats an adapter only waiting; full and absent scores 0
    (
        [({"a"}, set(), 2), (set(), set(), 2), ({"b", "c"}, {"a"}, 2), ({"b", "c"}, set(), 2)],
        "a",
        [1.0, 0.8, 0.6, 0.0],
    ),
    # a free slot counts running and waiting adapters together
    ([({"b"}, {"c"}, 3), ({"b"}, {"c"}, 2)], "a", [0.8, 0.0]),
    # active beats everything even when slots are free
    ([({"a"}, set(), 4), (set(), set(), 4)], "a", [1.0, 0.8]),
    # waiting but a slot is free: the free slot decides (GIE's order)
    ([(set(), {"a"}, 4)], "a", [0.8]),
    # no endpoint supports LoRA: the target is a base model, every endpoint is as good
    ([(set(), set(), 0), (set(), set(), 0)], "base", [1.0, 1.0]),
    # LoRA-capable pool, request for the base model: ranked by free slots like GIE
    ([(set(), set(), 1), ({"b"}, set(), 1)], "base", [0.8, 0.0]),
]


@pytest.mark.parametrize(("state", "target", "expected"), LORA_CASES)
def test_lora_affinity_scorer(
    state: list[tuple[set[str], set[str], int]], target: str, expected: list[float]
) -> None:
    eps = [E(f"e{i}", running_loras=r, waiting_loras=w, max_lora=m) for i, (r, w, m) in enumerate(state)]
    scorer = builders.plugin("lora-affinity-scorer")
    assert scorer.score({}, builders.request(target_model=target), eps) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("parameters", "requests", "tokens", "expected"),
    [
        (None, [0, 2, 4], [900, 0, 0], [1.0, 0.5, 0.0]),  # default mode: requests
        ({"mode": "requests"}, [1, 1], [0, 500], [1.0, 1.0]),
        ({"mode": "tokens"}, [5, 0, 0], [0, 1000, 500], [1.0, 0.0, 0.5]),
        ({"mode": "tokens"}, [0, 0], [0, 0], [1.0, 1.0]),
    ],
)
def test_inflight_load_scorer(
    parameters: dict[str, Any] | None, requests: list[int], tokens: list[int], expected: list[float]
) -> None:
    eps = [
        E(f"e{i}", inflight_requests=r, inflight_tokens=t)
        for i, (r, t) in enumerate(zip(requests, tokens, strict=True))
    ]
    scorer = builders.plugin("inflight-load-scorer", parameters)
    assert scorer.score({}, builders.request(), eps) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("parameters", "tokens", "expected"),
    [
        (None, [0, 4194304 // 2, 4194304, 9_000_000], [1.0, 0.5, 0.0, 0.0]),  # default threshold
        ({"queueThresholdTokens": 1000}, [0, 250, 1000, 1500], [1.0, 0.75, 0.0, 0.0]),
        ({"queueThresholdTokens": 1000}, [100, 100], [0.9, 0.9]),  # absolute scale, not min-max
    ],
)
def test_token_load_scorer(
    parameters: dict[str, Any] | None, tokens: list[int], expected: list[float]
) -> None:
    eps = [E(f"e{i}", inflight_tokens=t) for i, t in enumerate(tokens)]
    scorer = builders.plugin("token-load-scorer", parameters)
    assert scorer.score({}, builders.request(), eps) == pytest.approx(expected)


@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=64))
def test_lower_is_better_maps_min_to_one_max_to_zero_and_keeps_order(values: list[int]) -> None:
    scores = framework.lower_is_better(values)
    assert len(scores) == len(values)
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert scores[values.index(min(values))] == 1.0
    if min(values) != max(values):
        assert scores[values.index(max(values))] == 0.0
    for a, sa in zip(values, scores, strict=True):
        for b, sb in zip(values, scores, strict=True):
            if a < b:
                assert sa > sb
