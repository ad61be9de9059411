"""The workload's hit-rate ceiling: what an earlier request's prompt or reply left computed, in
full blocks, capped as vLLM caps a hit, and never below what a router's requests found."""

from __future__ import annotations

import math

import pytest

from epp.bench import hard, report
from epp.bench.fast import FastRun
from epp.bench.policies import POLICIES
from epp.bench.records import RequestRecord
from epp.bench.reuse import ReuseBound
from epp.bench.workload import Fleet, Prompt, Workload
from epp.sim.profiles import Profile, get_profile

A100 = get_profile("codellama-13b-a100")
QWEN = get_profile("qwen3-32b-tp2-h100")


def fleet(profile: Profile) -> Fleet:
    return Fleet(8, profile.num_gpu_blocks * profile.block_size, profile.max_model_len)


def prompt(ids: list[int], reply: list[int] | None = None) -> Prompt:
    return Prompt(ids, len(reply) if reply else 8, "g", 0, output_token_ids=reply)


def test_a_request_finds_the_full_blocks_an_earlier_prompt_computed() -> None:
    bound = ReuseBound(16)
    base = list(range(100))
    assert bound.add(prompt(base)) == 0  # nothing computed before it
    assert bound.add(prompt([*base[:40], 7, 7, 7])) == 32  # 40 shared tokens: two full blocks
    assert bound.add(prompt(base)) == 96  # all six full blocks: 99 tokens before the last
    # A prompt of exactly two blocks computes its last token: one block found, not two.
    assert bound.add(prompt(base[:32])) == 16
    # Blocks chain: the same tokens after a different first block are not the same prefix.
    assert bound.add(prompt([-1] * 16 + base[16:48])) == 0


def test_a_reply_is_computed_but_its_last_token_is_not() -> None:
    bound = ReuseBound(16)
    first = list(range(24))
    reply = list(range(1000, 1009))  # 24 + 8 computed tokens: two full blocks
    assert bound.add(prompt(first, reply)) == 0
    assert bound.add(prompt([*first, *reply, *range(2000, 2100)])) == 32
    # A reply of 8 tokens leaves 24 + 7 computed: the second block was never full.
    other = list(range(5000, 5024))
    assert bound.add(prompt(other, reply[:8])) == 0
    assert bound.add(prompt([*other, *reply[:8], *range(3000, 3100)])) == 16


def test_a_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block_size must be > 0"):
        ReuseBound(0)


def test_the_ceiling_is_nan_when_a_record_does_not_know_its_reuse() -> None:
    rec = RequestRecord(0.0, 0, "", 100, 0, 8, status=200, first_token=0.1, finish=0.2)
    assert math.isnan(report._rates([rec])["hit_rate_ceiling"])  # inference-perf's records
    rec.reusable_tokens = 50
    assert report._rates([rec])["hit_rate_ceiling"] == 0.5


def _run(wl: Workload, policy: str, profile: Profile) -> tuple[list[RequestRecord], dict[str, float]]:
    result = FastRun(wl, POLICIES[policy], profile=profile, pods=8, seed=1).run()
    served = [r for r in result.records if r.status == 200]
    assert served and not result.stopped_early
    return served, report.summarize(result, [])


@pytest.mark.parametrize("policy", ["epp", "sglang-cache-aware"])
def test_no_request_finds_more_than_the_ceiling(policy: str) -> None:
    """Agentic: each step's prompt carries the previous step's reply, which only the engine
    computed. bursty with epp: its pre-warms copy prefixes, which a request then finds."""
    cases = [
        (hard.Agentic(seed=1, scale=0.1, fleet=fleet(QWEN)), QWEN),
        (hard.BurstyTenants(seed=1, scale=0.2, fleet=fleet(A100)), A100),
    ]
    for wl, profile in cases:
        served, summary = _run(wl, policy, profile)
        assert all(r.reusable_tokens is not None and r.cached_tokens <= r.reusable_tokens for r in served)
        # Routing reaches most of it here, and a reply's blocks are part of it on agentic.
        assert summary["hit_rate"] <= summary["hit_rate_ceiling"] < summary["hit_rate"] + 0.1
        if policy != "epp":  # no pre-warms: the pods' counters count the requests alone
            assert summary["fleet_hit_rate"] <= summary["hit_rate_ceiling"]
