"""`epp bench pd`: split requests in the fast simulator (prefill leg, KV transfer, decode with the
received tokens), the P/D policies, and faults that must leave no booking behind."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from epp.bench import pd, seeds
from epp.bench.workload import Fleet
from epp.flags.serve import BOOKED_METRICS_INTERVAL_S
from epp.scheduling.disagg.latency_decider import PDLatencyDecider
from epp.sim.profiles import get_profile


def _run(
    workload: str,
    policy: str,
    *,
    faults: float = 0.0,
    scale: float = 0.08,
    load: float = 1.0,
    sidecar: str = "epp",
) -> pd.PDFastRun:
    profile = get_profile(pd.PROFILE)
    fleet = Fleet(pd.PODS, profile.kv_capacity_tokens, profile.max_model_len)
    wl = pd.PD_WORKLOADS[workload](seed=3, scale=scale, fleet=fleet, load=load)
    run = pd.PDFastRun(
        wl, pd.PD_POLICIES[policy], profile=profile, pods=pd.PODS, seed=3, faults=faults, sidecar=sidecar
    )
    run.run()
    return run


def test_llm_d_default_splits_every_long_prompt_onto_a_prefill_pod() -> None:
    run = _run("pd-long-prompt", "llm-d-pd")
    records = [r for r in run.result.records if r.status == 200]
    assert records and all(r.prefill_pod >= 0 for r in records)
    roles = pd.roles("xpyd", pd.PODS)
    assert all(roles[r.prefill_pod] == "prefill" and roles[r.pod] == "decode" for r in records)
    # The decode pods computed no prompt token of a split request but its last: their prefill
    # work is a token per request, the prefill pods' the prompts.
    decode_work = sum(run.engines[i].prompt_tokens_total for i, role in enumerate(roles) if role == "decode")
    prefill_work = sum(
        run.engines[i].prompt_tokens_total for i, role in enumerate(roles) if role == "prefill"
    )
    assert decode_work <= 2 * len(records) and prefill_work > 1000 * len(records)
    # Each transfer moved the prompt's KV at the link's rate.
    nbytes, seconds = run.transfers[0]
    assert seconds == pytest.approx(pd.TRANSFER_LATENCY_S + nbytes / pd.LINK_BYTES_PER_S)
    # At least a prompt's uncached tail (256+ tokens past a shared prefix the decode pod holds).
    assert all(b >= 256 * pd.KV_BYTES_PER_TOKEN for b, _ in run.transfers)


def test_aggregated_never_splits() -> None:
    agg = _run("pd-long-answer", "aggregated")
    assert all(r.prefill_pod < 0 for r in agg.result.records)
    assert not agg.transfers
    # The busiest pod's share of the requests, from the records: every pod serves here.
    records = agg.result.records
    counts = [sum(1 for r in records if r.pod == i) for i in range(pd.PODS)]
    assert all(counts)
    share = pd.summarize(agg, agg.result, 0.0)["busiest_pod_share"]
    assert share == max(counts) / len(records) and 1 / pd.PODS < share < 1.0


@pytest.mark.parametrize("policy", ["llm-d-pd", "epp-pd"])
def test_faults_leave_no_booking(policy: str) -> None:
    run = _run("pd-mixed", policy, faults=0.2, scale=0.15)
    assert run.cancelled > 0 and run.fallbacks > 0
    assert not any(ep.inflight_requests or ep.inflight_tokens for ep in run.datastore.endpoints())
    served = [r for r in run.result.records if r.status == 200]
    assert len(served) + run.cancelled == len(run.result.records)


def test_summary_and_targets_read_the_runs() -> None:
    out = pd.run_one(
        "pd-long-prompt", "epp-pd", 1, scale=0.05, pods=pd.PODS, link_bytes_per_s=pd.LINK_BYTES_PER_S
    )
    assert out["served"] == out["requests"] and out["leaked_bookings"] == 0
    assert 0.0 <= out["split_share"] <= 1.0 and out["ttft_p99_s"] >= out["ttft_p50_s"] > 0
    # epp-pd's requests are routed to its 4 decode pods: the busiest has at least a quarter.
    assert 0.25 <= out["busiest_pod_share"] <= 1.0
    # The means beside the percentiles: a TTFT is part of its E2E, and a mean lies within the range.
    assert out["ttft_p50_s"] / 10 < out["ttft_mean_s"] < out["e2e_mean_s"] <= out["e2e_p99_s"] * 1.5
    assert 0.0 < out["tpot_mean_s"] < 1.0
    lines = pd.targets({"w": {"epp-pd": [out], "llm-d-pd": [out]}})
    assert lines and "1.000x ok" in lines[0]
    assert "(per request: ttft_mean_s 1.0000x, tpot_mean_s 1.0000x, e2e_mean_s 1.0000x)" in lines[0]


@pytest.mark.parametrize("sidecar", pd.SIDECARS)
def test_epp_pd_learns_the_prefill_pods_from_either_sidecar(sidecar: str) -> None:
    """The prefill pods serve only remote prefills: their rates move from the prior only through
    the split requests' answers (epp sidecar's seconds, or llm-d's streamed headers)."""
    run = _run("pd-long-prompt", "epp-pd", sidecar=sidecar)
    (decider,) = [h for h in run.director._response_complete if isinstance(h, PDLatencyDecider)]
    latency = decider._latency
    assert latency is not None
    roles = pd.roles("xpyd", pd.PODS)
    split = {r.prefill_pod for r in run.result.records if r.prefill_pod >= 0}
    assert split
    prior = 10000.0
    for i in split:
        assert roles[i] == "prefill"
        assert latency.prefill_tokens_per_second(run.endpoints[i].name) != pytest.approx(prior, rel=1e-3)
    with pytest.raises(ValueError, match="unknown sidecar"):
        _run("pd-long-prompt", "epp-pd", sidecar="nginx")


def test_faults_hit_the_same_requests_under_every_policy() -> None:
    """Each request draws its own faults: a cancel is scheduled for the same requests, at the same
    moments, whatever the policy (one shared stream would hit different ones per policy)."""

    class Spy(pd.PDFastRun):
        cancels: list[tuple[float, str]]

        def _push(self, at: float, kind: int, payload: object) -> None:
            if kind == pd._CANCEL:
                self.cancels.append((round(at, 9), str(payload)))
            super()._push(at, kind, payload)

    drawn = []
    for policy in ("llm-d-pd", "epp-pd"):
        profile = get_profile(pd.PROFILE)
        fleet = Fleet(pd.PODS, profile.kv_capacity_tokens, profile.max_model_len)
        wl = pd.PD_WORKLOADS["pd-mixed"](seed=3, scale=0.08, fleet=fleet)
        Spy.cancels = []
        run = Spy(wl, pd.PD_POLICIES[policy], profile=profile, pods=pd.PODS, seed=3, faults=0.2)
        run.run()
        drawn.append(sorted(Spy.cancels))
    assert drawn[0] and drawn[0] == drawn[1]


def test_the_scrape_pace_is_epp_serves_unless_the_flag_says_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[float] = []
    init = pd.PDFastRun.__init__

    def spy(self: pd.PDFastRun, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        seen.append(self.scrapes.booked_interval_s if self.scrapes.paced else 0.0)

    monkeypatch.setattr(pd.PDFastRun, "__init__", spy)
    parser = argparse.ArgumentParser()
    pd.add_arguments(parser)
    argv = ["--workloads", "pd-long-answer", "--pd-policies", "aggregated", "--seeds", "1", "--scale", "0.02"]
    assert pd.run(parser.parse_args([*argv, "--out", str(tmp_path)])) == 0
    assert pd.run(parser.parse_args([*argv, "--booked-scrape-interval", "0"])) == 0
    assert seen == [BOOKED_METRICS_INTERVAL_S, 0.0]
    with pytest.raises(SystemExit, match="booked-scrape-interval"):
        pd.run(parser.parse_args([*argv, "--booked-scrape-interval", "61"]))


def test_targets_carry_the_seeds_interval_and_say_when_a_miss_is_noise() -> None:
    keys = ("e2e_p50_s", "e2e_p99_s", "ttft_p99_s", "output_tok_per_s", "goodput_req_per_s",
            "ttft_mean_s", "tpot_mean_s", "e2e_mean_s")  # fmt: skip

    def runs(values: list[float]) -> list[dict[str, float]]:
        return [dict.fromkeys(keys, v) for v in values]

    # Paired by seed: the same 5% more on every seed is a tight interval around 1.05.
    base = [1.0, 2.0, 3.0, 4.0, 5.0]
    lo, hi = seeds.seed_interval(runs([1.05 * b for b in base]), runs(base), "ttft_p99_s")
    assert 1.049 < lo <= hi < 1.051
    # Noisy seeds: the interval is wide, and a ratio over the bound whose interval reaches it is
    # called noise; one whose interval is clear of it is a miss.
    noisy = runs([0.8, 2.6, 2.7, 4.4, 5.2])
    line = pd.targets({"w": {"epp-pd": noisy, "llm-d-pd": runs(base)}})[0]
    assert "e2e_p50_s 1.047x [" in line and "MISS (within noise)" in line
    line = pd.targets({"w": {"epp-pd-flex": runs([1.05 * b for b in base]), "aggregated": runs(base)}})[0]
    assert line.startswith("w: epp-pd-flex / aggregated (within 3%): ")
    assert "ttft_p99_s 1.050x [1.050-1.050] MISS," in line  # the lower-is-better ones miss
    assert "goodput_req_per_s 1.050x [1.050-1.050] ok" in line
    # Under 5 seeds no interval is drawn.
    assert "[" not in pd.targets({"w": {"epp-pd": runs(base[:4]), "llm-d-pd": runs(base[:4])}})[0]
