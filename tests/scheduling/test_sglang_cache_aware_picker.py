"""sglang-cache-aware-picker: SGLang's cache_aware rule (peers.md 2.2), who wins when."""

from __future__ import annotations

from typing import Any

import pytest

from epp.scheduling import config as sched_config
from epp.scheduling import registry

from . import builders

E = builders.endpoint


def picker(**params: Any) -> Any:
    return builders.plugin("sglang-cache-aware-picker", params)


def pick(p: Any, pairs: list[tuple[Any, float]]) -> list[str]:
    return [ep.name for ep in p.pick({}, builders.request(), builders.scored(*pairs))]


def test_a_match_above_the_threshold_wins_over_a_less_loaded_endpoint() -> None:
    a, b = E("a", inflight_requests=10), E("b", inflight_requests=0)
    assert pick(picker(), [(a, 0.8), (b, 0.0)]) == ["a"]


def test_a_match_at_or_below_the_threshold_goes_to_the_least_loaded() -> None:
    a, b = E("a", inflight_requests=10), E("b", inflight_requests=3)
    assert pick(picker(), [(a, 0.3), (b, 0.0)]) == ["b"]  # 0.3 is not > 0.3
    assert pick(picker(cacheThreshold=0.2), [(a, 0.3), (b, 0.0)]) == ["a"]


def test_imbalance_beyond_both_bounds_overrides_the_cache() -> None:
    hot, cold = E("hot", inflight_requests=100), E("cold", inflight_requests=10)
    # 100 - 10 = 90 > 64 and 100 > 15: imbalanced, the least loaded wins despite a full match.
    assert pick(picker(), [(hot, 1.0), (cold, 0.0)]) == ["cold"]


@pytest.mark.parametrize(
    ("hot", "cold"),
    [
        (74, 10),  # difference 64 is not > 64
        (150, 101),  # difference 49 <= 64 (and 150 < 1.5 * 101)
        (200, 134),  # difference 66 > 64 but 200 < 1.5 * 134 = 201
    ],
)
def test_imbalance_needs_both_the_absolute_and_the_relative_bound(hot: int, cold: int) -> None:
    h, c = E("hot", inflight_requests=hot), E("cold", inflight_requests=cold)
    assert pick(picker(), [(h, 1.0), (c, 0.0)]) == ["hot"]


def test_equal_matches_go_to_the_less_loaded_holder() -> None:
    a, b, c = E("a", inflight_requests=5), E("b", inflight_requests=2), E("c", inflight_requests=0)
    assert pick(picker(), [(a, 0.9), (b, 0.9), (c, 0.1)]) == ["b"]


def test_misses_spread_by_requests_processed_when_loads_tie() -> None:
    # SGLang issue #32983: with ties broken by index every miss went to replica 0. Here the
    # processed count rotates them while in-flight counts stay equal (nothing booked in a unit test).
    p = picker()
    eps = builders.pool(3)
    got = [pick(p, [(ep, 0.0) for ep in eps])[0] for _ in range(6)]
    assert got == ["pod-0", "pod-1", "pod-2", "pod-0", "pod-1", "pod-2"]


def test_fallbacks_follow_the_primary_least_loaded_first() -> None:
    a, b, c = E("a", inflight_requests=9), E("b", inflight_requests=4), E("c", inflight_requests=1)
    assert pick(picker(maxNumOfEndpoints=3), [(a, 1.0), (b, 0.0), (c, 0.0)]) == ["a", "c", "b"]


def test_in_a_profile_the_prefix_score_drives_it() -> None:
    # prefix-cache-scorer at weight 1 + this picker: the second request of a prompt follows the first.
    handle = builders.handle()
    # The approximate scorer records only endpoints its datastore knows.
    handle.datastore.sync("test", [ep.spec for ep in builders.pool(4)])
    eps = handle.datastore.candidates()
    text = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: prefix-cache-scorer
  - type: sglang-cache-aware-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: prefix-cache-scorer
      - pluginRef: sglang-cache-aware-picker
"""
    cfg = sched_config.load_config(text, handle)
    req = builders.request()
    req.token_ids = list(range(64))
    for ep, load in zip(eps, [3, 2, 1, 0], strict=True):
        ep.inflight_requests = load  # pod-3 least loaded: the cold pick
    first = cfg.scheduler.schedule(req, eps)
    for hook in cfg.pre_request:
        hook.pre_request(req, first)
    assert first.targets[0].name == "pod-3"
    eps[3].inflight_requests = 5  # now the busiest, but within the balance bounds
    second = cfg.scheduler.schedule(req, eps)
    assert second.targets[0].name == "pod-3"


def test_parameters_are_checked() -> None:
    with pytest.raises(registry.ConfigError, match="balanceRelThreshold"):
        picker(balanceRelThreshold=0.5)
    with pytest.raises(registry.ConfigError, match="cacheThreshold"):
        picker(cacheThreshold=1.5)


def test_no_candidates_no_pick() -> None:
    assert picker().pick({}, builders.request(), []) == []
