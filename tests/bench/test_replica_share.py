"""Active-active replicas learn their share of the traffic (`epp bench --replicas N`): each
replica's `predicted-ttft-scorer` books its prefill about N times, from the pods' scraped
finished-request counters, with nothing shared between replicas but the scrapes (with
`trafficShare: auto`, which is opt-in)."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from epp.bench import replicas
from epp.bench.policies import POLICIES, Policy
from epp.scheduling.plugins.predicted_ttft_scorer import PredictedTTFTScorer

from . import helpers


@dataclasses.dataclass(frozen=True, slots=True)
class _Learning(Policy):
    """The policy with its TTFT-pricing scorer learning the traffic share."""

    def config_text(self) -> str:
        text = POLICIES[self.name].config_text()
        for scorer in ("request-latency-scorer", "predicted-ttft-scorer"):
            line = f"  - type: {scorer}\n"
            if line in text:
                learn = "    parameters:\n      trafficShare: auto\n"
                text = text.replace(line, line + learn, 1)
                # A scorer that had parameters already keeps one `parameters:` key.
                return text.replace(learn + "    parameters:\n", learn)
        raise AssertionError(f"{self.name}: no TTFT-pricing scorer")


def _scales(n: int, policy: str) -> list[float]:
    base = POLICIES[policy]
    run = replicas.ReplicatedRun(
        helpers.small(7, scale=0.03),
        _Learning(base.name, base.description, base.kv_events),
        replicas=n,
        profile=helpers.PROFILE,
        pods=helpers.PODS,
        seed=7,
    )
    run.run()
    found = [
        scorer
        for d in run.directors
        for profile in d.scheduler.profiles
        for scorer, _ in profile.scorers
        if isinstance(scorer, PredictedTTFTScorer)
    ]
    assert len(found) == n
    return [s._share.scale for s in found]


@pytest.mark.parametrize("policy", ["epp", "epp-ttft"])
def test_four_replicas_each_learn_a_quarter_share(policy: str) -> None:
    scales = _scales(4, policy)
    assert all(3.0 <= s <= 5.0 for s in scales), scales
    assert 3.5 <= statistics.median(scales) <= 4.5, scales


def test_one_replica_learns_it_is_alone() -> None:
    assert _scales(1, "epp") == [pytest.approx(1.0, abs=0.15)]
