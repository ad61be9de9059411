"""The hard workloads: sized as documented, seeded, and the mixed fleet really mixed."""

from __future__ import annotations

import itertools

import pytest

from epp.bench import hard
from epp.bench.fast import FastRun
from epp.bench.policies import POLICIES
from epp.bench.workload import AtLoad, ClosedLoop, Fleet, OpenLoop, Workload
from epp.sim.profiles import get_profile

A100 = get_profile("codellama-13b-a100")
FLEET = Fleet(8, A100.num_gpu_blocks * A100.block_size, A100.max_model_len)


def _first(wl: Workload, n: int) -> list[tuple[float, tuple[int, ...], int]]:
    assert isinstance(wl, OpenLoop)
    return [(t, tuple(p.token_ids[:8]), p.max_tokens) for t, p in itertools.islice(wl.arrivals(), n)]


@pytest.mark.parametrize("cls", [hard.KVPressure, hard.BurstyTenants, hard.MixedFleet])
def test_open_loop_hard_workloads_are_seeded(cls: type[OpenLoop]) -> None:
    one, two = cls(seed=3, scale=0.05, fleet=FLEET), cls(seed=3, scale=0.05, fleet=FLEET)
    assert _first(one, 50) == _first(two, 50)
    assert _first(cls(seed=4, scale=0.05, fleet=FLEET), 50) != _first(one, 50)


def test_kv_pressure_holds_a_working_set_past_the_fleets_kv() -> None:
    wl = hard.KVPressure(seed=1, scale=0.05, fleet=FLEET)
    distinct = sum(len(p) for p in wl.prefixes)
    assert 2.3 < distinct / (FLEET.pods * FLEET.kv_tokens_per_pod) < 2.7
    # Zipf(1.0): the most popular prefix is drawn far more often than the median one.
    ranks = [int(p.group.split("-")[1]) for _, p in itertools.islice(wl.arrivals(), 2000)]
    assert ranks.count(0) > 20 * max(1, ranks.count(len(wl.prefixes) // 2))


def test_bursty_tenants_burst_and_rest() -> None:
    wl = hard.BurstyTenants(seed=2, scale=1.0, fleet=FLEET)
    times = [t for t, p in wl.arrivals() if p.group == "tenant-0"]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Bursts at 2 req/s and quiet spells at 0.05 req/s: short gaps and long ones both occur.
    assert sum(g < 1.0 for g in gaps) > 10 and any(g > 10.0 for g in gaps)
    overall = [t for t, _ in wl.arrivals()]
    assert overall == sorted(overall)


def test_agentic_sessions_grow_by_tool_output_and_carry_the_reply() -> None:
    qwen = get_profile("qwen3-32b-tp2-h100")
    wl = hard.Agentic(
        seed=5, scale=1.0, fleet=Fleet(8, qwen.num_gpu_blocks * qwen.block_size, qwen.max_model_len)
    )
    assert isinstance(wl, ClosedLoop)
    t, first = wl.next_request(0, 0.0) or pytest.fail("no first request")
    _, second = wl.next_request(0, t + 1.0) or pytest.fail("no second request")
    assert first.output_token_ids is not None
    prior = [*first.token_ids, *first.output_token_ids]
    assert list(second.token_ids[: len(prior)]) == prior and second.shared_tokens == len(prior)
    assert 200 <= len(second.token_ids) - len(prior) <= 4000
    assert all(len(p.token_ids) < wl.limit for p in (first, second))


def test_a_mixed_fleet_runs_each_pods_profile() -> None:
    wl = hard.MixedFleet(seed=1, scale=0.01, fleet=FLEET)
    assert wl.pod_profiles is not None
    profiles = [get_profile(name) for name in wl.pod_profiles]
    run = FastRun(wl, POLICIES["round-robin"], profile=A100, pods=8, seed=1, pod_profiles=profiles)
    assert [e.profile.name for e in run.engines] == list(wl.pod_profiles)
    result = run.run()
    assert result.records and all(r.status == 200 for r in result.records)
    with pytest.raises(ValueError, match="7 pod profiles for 8 pods"):
        FastRun(wl, POLICIES["round-robin"], profile=A100, pods=8, seed=1, pod_profiles=profiles[:7])


def test_rolling_restart_restarts_every_pod_two_at_most_at_once() -> None:
    wl = hard.RollingRestart(seed=1, scale=0.2, fleet=FLEET)  # 120 s
    assert wl.duration == pytest.approx(120.0)
    assert sorted(pod for _, pod, _ in wl.pod_restarts) == list(range(8))
    assert all(24.0 <= t <= 96.0 + 1e-9 and down == 20.0 for t, _, down in wl.pod_restarts)
    for t, _, _ in wl.pod_restarts:  # pods down at each restart's start, itself included
        assert sum(s <= t < s + d for s, _, d in wl.pod_restarts) <= 2
    order = [pod for _, pod, _ in hard.RollingRestart(seed=2, scale=0.2, fleet=FLEET).pod_restarts]
    assert order != [pod for _, pod, _ in wl.pod_restarts]  # the order is the seed's
    fast = AtLoad(wl, 2.0)
    assert fast.pod_restarts == tuple((t / 2, pod, down / 2) for t, pod, down in wl.pod_restarts)


@pytest.mark.parametrize("policy", ["epp", "sglang-cache-aware"])
def test_a_restarted_pod_fails_its_streams_and_is_not_routed_while_down(policy: str) -> None:
    wl = hard.RollingRestart(seed=1, scale=0.1, fleet=FLEET)  # 60 s, a restart every ~5 s
    result = FastRun(wl, POLICIES[policy], profile=A100, pods=8, seed=1).run()
    records = result.records
    for t, pod, down in wl.pod_restarts:
        routed = [(r.routed, r) for r in records if r.pod == pod and r.routed is not None]
        assert not [r for at, r in routed if t <= at < t + down], (pod, t)
        warmed = [w for w in result.prewarm_log or [] if w.pod == pod]
        assert not [w for w in warmed if t <= w.at < t + down], (pod, t)
        # Back in rotation: requests, or (epp, the last pod back 1.5 s before the end) pre-warms
        # of the prefixes it is to hold.
        back = [r for at, r in routed if at >= t + down] + [w for w in warmed if w.at >= t + down]
        assert back, "never routed to again once back"
        cut = [r for at, r in routed if at < t and r.status == 0]
        assert all(r.finish is None for r in cut)
    # Requests in flight on a restarting pod are cut (status 0); none is refused.
    lost = [r for r in records if r.status != 200]
    assert lost and all(r.status == 0 for r in lost)
    assert len(lost) < len(records) / 2
    assert not result.stopped_early


def test_after_a_restart_epp_forgets_the_pods_cache() -> None:
    """A pod back from a restart has no KV-index entries left (epp would otherwise take it for a
    warm holder of what it held before), as `epp serve` purges a pod whose feed reconnects."""
    seen: list[tuple[bool, bool]] = []

    class Watched(FastRun):
        def _pod_up(self, pod: int) -> None:
            assert self.index is not None
            name = self.engines[pod].name
            before = self.index.pod_info(name) is not None
            super()._pod_up(pod)
            seen.append((before, self.index.pod_info(name) is not None))

    wl = hard.RollingRestart(seed=3, scale=0.1, fleet=FLEET)
    Watched(wl, POLICIES["epp"], profile=A100, pods=8, seed=3).run()
    assert seen == [(True, False)] * 8
