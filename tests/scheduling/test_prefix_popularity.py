"""prefix_popularity.Popularity: decaying counts and shares, bounded in time as well as size."""

from __future__ import annotations

import pytest

from epp.scheduling.plugins.prefix_popularity import Popularity


def test_counts_and_shares_decay_with_the_window() -> None:
    p = Popularity(60.0)
    for t in range(10):
        p.add("hot", float(t))
    p.add("cold", 9.0)
    assert p.count("hot", 9.0) == pytest.approx(
        sum(2.718281828 ** (-(9 - t) / 60) for t in range(10)), rel=1e-6
    )
    assert p.share("hot", 9.0) > p.share("cold", 9.0)
    assert p.count("hot", 9.0 + 600.0) < 1e-3


def test_keys_unseen_for_the_horizon_are_forgotten() -> None:
    """An hour of prompts new from their first block, 40 a second (DEGRADE's soak rate): the table
    holds the last 5 windows' keys, not CAPACITY's 100,000 (~25 MB)."""
    window = 60.0
    p = Popularity(window)
    rate = 40
    for i in range(3600 * rate):
        p.add(i, i / rate)
    assert len(p._counts) <= rate * Popularity.HORIZON * window + 1
    p.add("recent", 3600.0)
    assert p.count("recent", 3600.0) == pytest.approx(1.0)
