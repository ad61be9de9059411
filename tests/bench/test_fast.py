"""Fast mode end to end on a small fleet: determinism, every policy, orderings that must hold,
and the request-control bookkeeping (in-flight counts, hooks) as when serving."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from epp.api.requests import InferenceRequest
from epp.bench import fast, pd, policies, records, report
from epp.bench.policies import POLICIES, Policy, config_file
from epp.bench.workload import OpenLoop, Prompt
from epp.datastore import pacing
from epp.requestcontrol.director import DirectorSettings
from epp.scheduling import interfaces

from . import helpers


def run(policy: str, *, seed: int = 7, scale: float = 0.01, **kw: float) -> records.RunResult:
    return fast.FastRun(
        helpers.small(seed, scale),
        POLICIES[policy],
        profile=helpers.PROFILE,
        pods=helpers.PODS,
        seed=seed,
        **kw,
    ).run()


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, object]]:
    """Every policy over the same small shared-prefix workload (~0.3 s each)."""
    out = {}
    for name in POLICIES:
        r = run(name)
        out[name] = report.summarize(r, helpers.small().stages)
        assert not r.stopped_early
    return out


def test_a_seed_gives_the_same_run() -> None:
    a, b = run("epp"), run("epp")
    assert [(r.arrival, r.pod, r.cached_tokens, r.finish) for r in a.records] == [
        (r.arrival, r.pod, r.cached_tokens, r.finish) for r in b.records
    ]
    c = run("epp", seed=8)
    assert [r.arrival for r in a.records] != [r.arrival for r in c.records]


def test_every_policy_serves_every_request(results: dict[str, dict[str, object]]) -> None:
    for name, s in results.items():
        assert s["served"] == s["requests"] and s["failed"] == s["unfinished"] == 0, name
        assert int(s["requests"]) > 300, name  # type: ignore[call-overload]


def test_cache_aware_policies_hit_far_more_than_random(results: dict[str, dict[str, float]]) -> None:
    # Blind policies find a shared prefix where they send it about as often as a pod holds it (a
    # pod holds about a third of the prefixes here); cache-aware policies follow it.
    blind = max(results[p]["prefix_hit_rate"] for p in ("random", "round-robin", "least-request"))
    assert 0.15 < blind < 0.5
    for p in ("gie-approx", "llm-d-precise", "sglang-cache-aware", "ranvier-bounded", "epp", "dynamo-cost"):
        assert results[p]["prefix_hit_rate"] > 0.7, p
        assert results[p]["prefix_hit_rate"] > blind + 0.3, p
        assert results[p]["ttft_p50_s"] < results["random"]["ttft_p50_s"], p


def test_round_robin_spreads_evenly(results: dict[str, dict[str, float]]) -> None:
    assert results["round-robin"]["load_spread"] < 1.05


def test_bookings_are_released_and_scrapes_feed_the_datastore() -> None:
    r = fast.FastRun(helpers.small(), POLICIES["epp"], profile=helpers.PROFILE, pods=helpers.PODS, seed=7)
    result = r.run()
    assert all(ep.inflight_requests == 0 and ep.inflight_tokens == 0 for ep in r.endpoints)
    assert all(ep.prefill_tokens == 0 for ep in r.endpoints)
    assert all(ep.metrics.updated_at > 0 and ep.metrics.block_size == 32 for ep in r.endpoints)
    assert r.index is not None and r.index.stats().keys > 0  # KV events reached the index
    # Samples every 50 ms of virtual time while anything was left to do.
    gaps = {round(b.t - a.t, 6) for a, b in zip(result.samples, result.samples[1:], strict=False)}
    assert gaps == {0.05}
    served = [x for x in result.records if x.status == 200]
    assert all(x.first_token is not None and x.arrival <= x.first_token <= x.finish for x in served)  # type: ignore[operator]
    assert all(x.output_tokens == x.max_tokens for x in served)
    # The latency histograms' sums and counts, as a vLLM page gives them: every request finished
    # by the last scrape (the last few finish after it).
    totals = [ep.metrics.latency for ep in r.endpoints]
    assert all(t is not None and t.decode_seconds > 0 and t.token_seconds > 0 for t in totals)
    assert 0.98 * len(served) <= sum(t.decodes for t in totals if t is not None) <= len(served)
    tokens = sum(x.output_tokens - 1 for x in served)
    assert 0.98 * tokens <= sum(t.tokens for t in totals if t is not None) <= tokens


def test_every_plugin_hook_runs_as_under_epp_serve() -> None:
    # The Director gets every hook's plugins as `epp serve` gives them: fast mode once left out
    # the response-header hook, where P/D's decode-pod pricing counts off the KV in transit.
    r = fast.FastRun(helpers.small(), POLICIES["epp"], profile=helpers.PROFILE, pods=helpers.PODS, seed=7)
    (scorer,) = r.director.response_header_plugins
    seen: list[str] = []
    hook = scorer.response_headers

    def counted(
        request: InferenceRequest,
        result: interfaces.SchedulingResult,
        served: str | None,
        headers: Mapping[str, str],
    ) -> Mapping[str, str]:
        seen.append(headers[":status"])
        return hook(request, result, served, headers)

    scorer.response_headers = counted  # type: ignore[method-assign]
    result = r.run()
    served = [x for x in result.records if x.status == 200]
    assert served and seen == ["200"] * len(served)


def test_behind_epps_gateway_config_off_sample_bodies_skip_epp() -> None:
    # epp serve's sampling behind its own gateway config: 1 in 100, and each pod's floor (one
    # sampled answer per pod every 2 s until it has had 32). The learners hear only the sampled
    # answers; every booking is still released, at the stream's end.
    settings = DirectorSettings(
        response_sample_ratio=0.01, response_sample_min_interval=2.0, response_sample_settled_interval=20.0
    )
    r = fast.FastRun(
        helpers.small(),
        POLICIES["epp"],
        profile=helpers.PROFILE,
        pods=helpers.PODS,
        seed=7,
        settings=settings,
    )
    heard: list[interfaces.RequestOutcome] = []
    r.director._response_complete.append(_Hear(heard))
    result = r.run()
    served = [x for x in result.records if x.status == 200]
    assert len(heard) == len(served) > 300
    with_ttft = [o for o in heard if o.ttft_s is not None]
    assert all(o.completion_tokens is not None for o in with_ttft)
    assert all(o.ttft_s is None and o.completion_tokens is None and o.ok for o in heard if o not in with_ttft)
    # The ratio's 1% plus every pod's floor over the run's few virtual seconds: a few dozen.
    span = max(x.finish for x in served) - min(x.arrival for x in served)  # type: ignore[type-var,operator]
    assert helpers.PODS <= len(with_ttft) <= 0.01 * len(served) + helpers.PODS * (span / 2.0 + 1) + 1
    assert all(ep.inflight_requests == 0 and ep.prefill_tokens == 0 for ep in r.endpoints)
    # The bench's own records keep every request's TTFT: only epp's view is sampled.
    assert all(x.first_token is not None for x in served)


class _Hear:
    name = "hear"

    def __init__(self, into: list[interfaces.RequestOutcome]) -> None:
        self.into = into

    def response_complete(self, request: object, outcome: interfaces.RequestOutcome) -> None:
        self.into.append(outcome)


def test_closed_loop_keeps_at_most_one_request_per_user_in_flight() -> None:
    result = run("random")
    events = sorted([(x.arrival, 1) for x in result.records] + [(x.finish, -1) for x in result.records])  # type: ignore[misc]
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak <= helpers.SmallStress.users


def test_kv_event_delay_is_a_knob() -> None:
    # dynamo-cost sees a pod's blocks only through its events: late events change its decisions.
    now, late = run("dynamo-cost"), run("dynamo-cost", kv_delay_s=2.0)
    assert [x.pod for x in now.records] != [x.pod for x in late.records]
    assert all(x.status == 200 for x in late.records)


class _OverLong(OpenLoop):
    """Two requests: one too long for the tiny engine's 1024-token window (vLLM answers 400)."""

    name = "over-long"

    def __init__(self) -> None:
        super().__init__(seed=0, scale=1.0, fleet=helpers.FLEET)
        self.stages = self.scaled_stages([("all", 1.0, 2.0, None)])

    def arrivals(self):  # type: ignore[no-untyped-def]
        yield 0.1, Prompt(list(range(1000)), 100, "", 0)
        yield 0.2, Prompt(list(range(100)), 10, "", 0)


def test_a_request_vllm_rejects_is_answered_400_and_released() -> None:
    r = fast.FastRun(_OverLong(), POLICIES["least-request"], profile=helpers.PROFILE, pods=2, seed=1)
    result = r.run()
    assert [x.status for x in result.records] == [400, 200]
    assert all(ep.inflight_requests == 0 for ep in r.endpoints)


Tick = tuple[float, list[tuple[float, bool, float]], list[float]]


def _refreshes(booked_interval_s: float, policy: str | Policy = "epp") -> list[Tick]:
    """Per scrape tick of a run: its time, each pod's (last refresh, booked, last booking) before,
    and each pod's last refresh after."""
    run = fast.FastRun(
        helpers.small(), POLICIES[policy] if isinstance(policy, str) else policy, profile=helpers.PROFILE,
        pods=helpers.PODS, seed=7, booked_interval_s=booked_interval_s,
    )  # fmt: skip
    ticks: list[Tick] = []
    scrape = run._scrape
    bookings = run.scrapes._booked_at

    def spy() -> None:
        before = [(ep.metrics.updated_at, pacing.booked(ep), bookings.get(ep, -1.0)) for ep in run.endpoints]
        scrape()
        ticks.append((run.now, before, [ep.metrics.updated_at for ep in run.endpoints]))
        # What the run reports of the pods is theirs, read every tick whatever epp last refreshed.
        assert run.result.samples[-1].waiting == [e.num_waiting for e in run.engines]
        assert run.result.samples[-1].running == [e.num_running for e in run.engines]

    run._scrape = spy  # type: ignore[method-assign]
    run.run()
    return ticks


@pytest.mark.parametrize("policy", ["epp", "flow-control"])  # flow control on epp's own bookings
def test_a_pod_whose_load_is_all_epps_is_refreshed_at_the_booked_interval(policy: str) -> None:
    """Kept only while booked and not due, unless epp booked on it half an interval before (as the
    scraper's booked pause ends at a booking)."""
    ticks = _refreshes(0.2, policy)
    kept = woken = 0
    for now, before, after in ticks:
        for (last, booked, booking), refreshed in zip(before, after, strict=True):
            woke = booking > last and now - booking >= 0.025 - 1e-6
            if refreshed != now:  # kept: only a booked pod, and only until it is due
                kept += 1
                assert booked and now - last < 0.2 and not woke, (now, last, booking)
            elif booked and now - last < 0.2 - 1e-9:
                woken += 1
                assert woke, (now, last, booking)
    assert kept > len(ticks)  # the rule ran (helpers.small keeps pods busy with epp's own load)
    assert woken > 0  # and bookings ended pauses


def _own_llmd_flow_control(tmp_path: Path) -> Policy:
    """llm-d's flow-control configuration as one's own file (`config:`, paced as epp serve paces)."""
    path = tmp_path / "my-flow-control.yaml"
    path.write_text((Path(policies.__file__).parent / "policies" / "llm-d-flow-control.yaml").read_text())
    return config_file(f"config:{path}")


@pytest.mark.parametrize(
    ("booked_interval_s", "policy"),
    [
        (0.0, "epp"),
        # Its utilization detector dispatches on the scrapes: they are not paced.
        (0.2, "config:llm-d-flow-control"),
        # A peer's rule reads the pods as its router does, at the fixed interval.
        (0.2, "gie-approx"),
        (0.2, "llm-d-precise"),
    ],
)
def test_every_pod_is_refreshed_every_tick(booked_interval_s: float, policy: str, tmp_path: Path) -> None:
    own = _own_llmd_flow_control(tmp_path) if policy.startswith("config:") else policy
    ticks = _refreshes(booked_interval_s, own)
    assert ticks and all(all(r == now for r in after) for now, _, after in ticks)


def test_epps_own_policies_are_paced_and_the_peers_are_not(tmp_path: Path) -> None:
    assert _own_llmd_flow_control(tmp_path).paced
    own = {"epp", "epp-ttft", "flow-control", "flow-control-requests", "flow-control-fair-share"}
    assert {name for name, p in POLICIES.items() if p.paced} == own
    assert {name for name, p in pd.PD_POLICIES.items() if p.policy().paced} == {
        "aggregated", "epp-pd", "epp-pd-flex"
    }  # fmt: skip


def test_fast_mode_paces_booked_load_as_epp_serve_does_by_default() -> None:
    """`epp bench`'s --booked-scrape-interval defaults to epp serve's --booked-metrics-interval,
    and live mode, which runs epp serve itself, refuses it."""
    import argparse

    from epp.bench import cli
    from epp.flags.serve import add_serve_arguments

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    serve = argparse.ArgumentParser()
    add_serve_arguments(serve)
    assert serve.parse_args([]).booked_metrics_interval == 0.2
    assert cli._booked_interval(parser.parse_args([])) == 0.2
    assert cli._booked_interval(parser.parse_args(["--booked-scrape-interval", "0"])) == 0.0
    with pytest.raises(cli.BenchConfigError, match="for --mode fast"):
        cli._plan(
            parser.parse_args(["--mode", "live", "--workload", "chat", "--booked-scrape-interval", "0.2"])
        )
