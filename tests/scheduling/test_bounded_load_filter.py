"""bounded-load-filter: Ranvier's divert rule, in-flight > median * 2 + 2 (peers.md 5.2)."""

from __future__ import annotations

from typing import Any

import pytest

from epp.scheduling import registry

from . import builders


def keep(loads: list[int], **params: Any) -> list[int]:
    eps = [builders.endpoint(f"pod-{i}", inflight_requests=n) for i, n in enumerate(loads)]
    f = builders.plugin("bounded-load-filter", params)
    return [ep.inflight_requests for ep in f.filter({}, builders.request(), eps)]


@pytest.mark.parametrize(
    ("loads", "kept"),
    [
        ([0, 0, 0, 2], [0, 0, 0, 2]),  # median 0: the floor of 2 keeps a pod with 2
        ([0, 0, 0, 3], [0, 0, 0]),  # 3 > 0 * 2 + 2
        ([4, 4, 5, 10], [4, 4, 5, 10]),  # median 4.5: bound 11
        ([4, 4, 5, 12], [4, 4, 5]),  # 12 > 11
        ([1, 2, 30], [1, 2]),  # odd count: median 2, bound 6
        ([7], [7]),
        ([], []),
    ],
)
def test_endpoints_above_twice_the_median_plus_the_floor_go(loads: list[int], kept: list[int]) -> None:
    assert keep(loads) == kept


def test_parameters_change_the_bound() -> None:
    assert keep([4, 4, 5, 10], loadImbalanceFactor=1.5, loadImbalanceFloor=0) == [4, 4, 5]
    with pytest.raises(registry.ConfigError, match="loadImbalanceFactor"):
        keep([1], loadImbalanceFactor=0.5)


def test_the_least_loaded_endpoint_always_stays() -> None:
    for loads in ([0, 100, 100, 100], [50, 100, 1000], [3, 3]):
        assert min(loads) in keep(loads)
