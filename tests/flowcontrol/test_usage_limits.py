"""The usage-limit policies' ceilings (llm-d's formulas)."""

from __future__ import annotations

import pytest

from epp.flowcontrol import usage_limits


def ceilings(policy: usage_limits.UsageLimitPolicy, saturation: float, priorities: list[int]) -> list[float]:
    out = [1.0] * len(priorities)
    policy.compute(saturation, priorities, out)
    return out


def test_static() -> None:
    assert ceilings(usage_limits.Static("s", 0.8), 0.5, [10, 0, -1]) == [0.8, 0.8, 0.8]


def test_priority_holdback_by_rank_and_by_value() -> None:
    by_rank = usage_limits.PriorityHoldback("h", min_ceiling=0.4, max_ceiling=0.9)
    assert ceilings(by_rank, 0.0, [100, 5, -1]) == pytest.approx([0.9, 0.65, 0.4])
    assert ceilings(by_rank, 0.0, [3]) == [0.9]
    by_value = usage_limits.PriorityHoldback("h", min_ceiling=0.4, max_ceiling=0.9, by_value=True)
    assert ceilings(by_value, 0.0, [10, 0, -10]) == pytest.approx([0.9, 0.65, 0.4])
    assert ceilings(by_value, 0.0, [10, 8]) == pytest.approx([0.9, 0.4])


def test_soft_reflective_ceiling() -> None:
    policy = usage_limits.SoftReflectiveCeiling("s")
    # Below every reflective ceiling (1 - i * s / (N - 1)): all open, no tick.
    assert ceilings(policy, 0.3, [2, 1, 0]) == [1.0, 1.0, 1.0]
    assert policy.tick == 0
    # Saturated: every band but the top one is shut.
    assert ceilings(policy, 1.0, [2, 1, 0]) == [1.0, 0.0, 0.0]
    # 0.75: band 2's reflective ceiling (0.25) is passed, band 1's (0.625) too; they open together
    # one call in round(0.75 / 0.25) = 3.
    seen = [ceilings(policy, 0.75, [2, 1, 0]) for _ in range(6)]
    assert seen.count([1.0, 1.0, 1.0]) == 2 and seen.count([1.0, 0.0, 0.0]) == 4
    assert ceilings(policy, 0.9, [0]) == [1.0]
