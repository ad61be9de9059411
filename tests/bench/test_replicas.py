"""`epp bench --replicas N`: independent schedulers sharing the KV index and the scrapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epp.bench import cli, fast, replicas, report
from epp.bench.policies import POLICIES
from epp.scheduling.plugins.precise_prefix_cache_scorer import PrecisePrefixCacheScorer
from epp.scheduling.plugins.predicted_ttft_scorer import PredictedTTFTScorer

from . import helpers
from .test_cli import parse


def replicated(policy: str, n: int, *, seed: int = 7) -> replicas.ReplicatedRun:
    return replicas.ReplicatedRun(
        helpers.small(seed),
        POLICIES[policy],
        replicas=n,
        profile=helpers.PROFILE,
        pods=helpers.PODS,
        seed=seed,
    )


def _plugins(run: replicas.ReplicatedRun, cls: type) -> list[object]:
    return [
        scorer
        for d in run.directors
        for profile in d.scheduler.profiles
        for scorer, _ in profile.scorers
        if isinstance(scorer, cls)
    ]


def test_one_replica_is_the_plain_fast_run() -> None:
    one = replicated("epp", 1).run()
    plain = fast.FastRun(
        helpers.small(), POLICIES["epp"], profile=helpers.PROFILE, pods=helpers.PODS, seed=7
    ).run()
    assert [(r.arrival, r.pod, r.cached_tokens, r.finish) for r in one.records] == [
        (r.arrival, r.pod, r.cached_tokens, r.finish) for r in plain.records
    ]


def test_replicas_take_turns_and_keep_their_own_state() -> None:
    run = replicated("epp", 3)
    result = run.run()
    n = len(result.records)
    assert sum(run.routed) == n and max(run.routed) - min(run.routed) <= 1  # in turn
    # Separate schedulers: no plugin instance or endpoint object is shared between replicas ...
    for cls in (PrecisePrefixCacheScorer, PredictedTTFTScorer):
        found = _plugins(run, cls)
        assert len(found) == 3 and len({id(p) for p in found}) == 3, cls
    eps = [ep for group in run.replica_endpoints for ep in group]
    assert len({id(ep) for ep in eps}) == 3 * helpers.PODS
    # ... every booking was released by the replica that made it ...
    assert all(ep.inflight_requests == 0 and ep.inflight_tokens == 0 for ep in eps)
    # ... and each saw every scrape.
    for group in run.replica_endpoints[1:]:
        for ep, first in zip(group, run.replica_endpoints[0], strict=True):
            assert ep.metrics is first.metrics and ep.metrics.updated_at > 0
    s = report.summarize(result, helpers.small().stages)
    assert s["served"] == s["requests"] and s["prefix_hit_rate"] > 0.7


def test_each_booking_is_held_by_the_replica_that_routed_only() -> None:
    run = replicated("epp", 2)
    checks: list[tuple[int, int, int]] = []  # (in flight, booked on replica 0, on replica 1)

    def check(_: float) -> None:
        booked = [sum(ep.inflight_requests for ep in group) for group in run.replica_endpoints]
        checks.append((len(run._inflight), booked[0], booked[1]))

    run.progress = check
    run.run()
    assert all(inflight == a + b for inflight, a, b in checks), checks
    assert any(a > 0 and b > 0 for _, a, b in checks)


def test_approximate_prefix_state_is_per_replica() -> None:
    # GIE's approximate scorer learns only from what it routed: split over 4 replicas it finds
    # far fewer prefixes, while the precise index (shared KV events) keeps its hit rate.
    def hit(policy: str, n: int) -> float:
        return float(report.summarize(replicated(policy, n).run(), helpers.small().stages)["prefix_hit_rate"])

    assert hit("gie-approx", 4) < hit("gie-approx", 1) - 0.15
    assert hit("epp", 4) > hit("epp", 1) - 0.05


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "0"], "--replicas must be in [1, 64], got 0"),
        (["--replicas", "65"], "--replicas must be in [1, 64], got 65"),
        (["--scrape-interval", "0"], "--scrape-interval must be in [0.001, 60] s, got 0.0"),
    ],
)
def test_replica_count_errors_name_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.run(parse("--workload", "chat", *argv)) == 2
    assert message in capsys.readouterr().err


def test_the_cli_records_the_replica_count(tmp_path: Path) -> None:
    args = parse(
        "--workload", "chat", "--policies", "epp", "--scale", "0.01", "--replicas", "2",
        "--out", str(tmp_path), "--no-plots",
    )  # fmt: skip
    assert cli.run(args) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["workloads"]["chat"]["policies"]["epp"]["replicas"] == 2


def test_the_scrape_interval_reaches_every_replica() -> None:
    run = replicas.ReplicatedRun(
        helpers.small(), POLICIES["epp"], replicas=2, profile=helpers.PROFILE, pods=helpers.PODS, seed=7,
        scrape_interval_s=0.01,
    )  # fmt: skip
    result = run.run()
    gaps = {round(b.t - a.t, 6) for a, b in zip(result.samples, result.samples[1:], strict=False)}
    assert gaps == {0.01}
    assert run.replica_endpoints[1][0].metrics.updated_at > 0
