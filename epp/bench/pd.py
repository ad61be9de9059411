"""`epp bench pd`: prefill/decode disaggregation in fast mode (virtual time, one process).

Each policy is an EndpointPickerConfig run by epp's real Director and disaggregation scheduler
(`epp.scheduling.disagg`) over a simulated fleet (`epp.sim.core` engines) whose pods carry llm-d's
role label: `xpyd` (half `prefill`, half `decode`: llm-d's P/D guide), `flex` (every pod
`prefill-decode`: it may prefill for others, decode, or both) or `agg` (no roles: aggregated
serving on the same pods). A split request runs as llm-d's sidecar runs it:

1. the prefill pod's engine gets the prompt with `max_tokens` 1 (its own queue, batch and prefix
   cache);
2. when that step ends, the KV of the prompt tokens the decode pod does not hold moves:
   `TRANSFER_LATENCY_S + tokens x kv_bytes_per_token / link_bytes_per_s` (NIXL pulls only the
   blocks the decode pod lacks);
3. then the decode pod's engine gets the request with those tokens already computed
   (`EngineRequest.remote_tokens`: admitted without their prefill cost, published as stored
   blocks, so the decode pod's prefix cache and the KV-event index learn them); its first token
   is the client's. The prefill pod's booking is released when its leg ends.

A split whose prefill pod is the decode pod runs locally (a sidecar prefilling on its own vLLM
gains nothing). Everything else is `epp.bench.fast`.

Workloads (`PD_WORKLOADS`): long prompts with short answers, long answers from short prompts, and
a mix with shared prefixes. Policies (`PD_POLICIES`): aggregated (epp's default), llm-d's P/D
default (`deploy/config/pd-epp-config.yaml`), Dynamo's conditional disaggregation, fixed
`nonCachedTokens` thresholds, and epp's `pd-latency-decider` on `xpyd` and `flex` pools.
docs/bench/disaggregation.md#pd has the runs and the commands.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from epp.bench import fast, fast_scrapes, records
from epp.bench.pd_workloads import PD_WORKLOADS, PODS, PROFILE
from epp.bench.policies import Policy
from epp.bench.report import percentile
from epp.bench.seeds import seed_interval
from epp.bench.workload import Fleet, Prompt, Workload
from epp.datastore.endpoints import EndpointSpec
from epp.flags.serve import BOOKED_METRICS_INTERVAL_S
from epp.observability import metrics
from epp.scheduling import config as sched_config
from epp.scheduling.plugins.role_filter import ROLE_LABEL
from epp.sidecar.protocol import PREFILL_RESULT_HEADER, PREFILL_SECONDS_HEADER
from epp.sim import core
from epp.sim.profiles import Profile, get_profile

KV_BYTES_PER_TOKEN: Final = 327680  # Llama-3.1-70B, bf16: 80 layers x 2 x 8 KV heads x 128 x 2
LINK_BYTES_PER_S: Final = 50e9  # one 400 Gb/s RDMA NIC per pod pair
TRANSFER_LATENCY_S: Final = 0.001  # NIXL's handshake and notification per transfer
SLO_TTFT_S: Final = 2.0
SLO_TPOT_S: Final = 0.08
_TRANSFER, _CANCEL = 10, 11  # event kinds (above epp.bench.fast's)
SIDECARS: Final = ("epp", "llm-d")
_ANSWER: Final = {":status": "200", "content-type": "text/event-stream"}


# --- policies -----------------------------------------------------------------------------------

_LLMD_PD = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters: {maxPrefixTokensToMatch: 16384, lruCapacityPerServer: 31250}
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: NONCACHED}
- type: disagg-profile-handler
  parameters: {deciders: {prefill: DECIDER}}
schedulingProfiles:
- name: prefill
  plugins:
  - {pluginRef: prefill-filter}
  - {pluginRef: max-score-picker}
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
- name: decode
  plugins:
  - {pluginRef: decode-filter}
  - {pluginRef: max-score-picker}
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
"""

_EPP_PD = f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
- type: request-latency-scorer
  parameters: {{ttftWeight: 4}}
- type: prefill-filter
- type: decode-filter
- type: pd-latency-decider
  parameters: {{kvBytesPerToken: {KV_BYTES_PER_TOKEN}, bandwidthBytesPerSecond: {LINK_BYTES_PER_S:.1f}}}
- type: disagg-profile-handler
  parameters: {{deciders: {{prefill: pd-latency-decider}}}}
schedulingProfiles:
- name: prefill
  plugins:
  - {{pluginRef: prefill-filter}}
  - {{pluginRef: precise-prefix-cache-scorer, weight: 0}}
  - {{pluginRef: pd-latency-decider}}
- name: decode
  plugins:
  - {{pluginRef: decode-filter}}
  - {{pluginRef: precise-prefix-cache-scorer, weight: 0}}
  - {{pluginRef: request-latency-scorer}}
"""


@dataclasses.dataclass(frozen=True, slots=True)
class PDPolicy:
    name: str
    description: str
    topology: str  # "agg", "xpyd" or "flex"
    text: str
    kv_events: bool
    paced: bool = False  # epp's own: scraped as epp serve scrapes (`Policy.paced`)

    def policy(self) -> Policy:
        text = self.text

        class _Inline(Policy):
            def config_text(self) -> str:
                return text

        return _Inline(self.name, self.description, self.kv_events, paced=self.paced)


def _llmd(threshold: int, decider: str = "prefix-based-pd-decider") -> str:
    return _LLMD_PD.replace("NONCACHED", str(threshold)).replace("DECIDER", decider)


_DYNAMO = _llmd(16, "dynamo-pd-decider").replace(
    "- type: disagg-profile-handler", "- type: dynamo-pd-decider\n- type: disagg-profile-handler"
)

# On prefill-decode pods a short prompt's prefill leg waits behind the prefill pod's own long
# prefills, which the decider's queue estimate does not see: only long prompts split there.
_FLEX: Final = "marginRatio: 0.5, minPromptTokens: 2048, kvBytesPerToken:"

PD_POLICIES: Final[dict[str, PDPolicy]] = {
    p.name: p
    for p in (
        PDPolicy("aggregated", "no P/D: epp's default (request-latency-scorer) on the same pods", "agg",
                 sched_config.default_config_text(precise=True), True, paced=True),
        PDPolicy("llm-d-pd", "llm-d's P/D default: prefix 2 + queue 1, nonCachedTokens 16 (xPyD)", "xpyd",
                 _llmd(16), False),
        PDPolicy("dynamo-pd", "Dynamo's bypass: remote prefill past 1,000 uncached tokens, prefill queue < 8",
                 "xpyd", _DYNAMO, False),
        PDPolicy("threshold-512", "llm-d's P/D, nonCachedTokens 512 (xPyD)", "xpyd", _llmd(512), False),
        PDPolicy("threshold-2048", "llm-d's P/D, nonCachedTokens 2048 (xPyD)", "xpyd", _llmd(2048), False),
        PDPolicy("threshold-8192", "llm-d's P/D, nonCachedTokens 8192 (xPyD)", "xpyd", _llmd(8192), False),
        PDPolicy("epp-pd", "epp's pd-latency-decider on the same xPyD pods", "xpyd", _EPP_PD, True,
                 paced=True),
        PDPolicy("epp-pd-flex", "epp's pd-latency-decider, marginRatio 0.5, minPromptTokens 2048, every pod "
                 "prefill-decode", "flex",
                 _EPP_PD.replace("kvBytesPerToken:", _FLEX), True, paced=True),
    )
}  # fmt: skip


def roles(topology: str, pods: int) -> list[str | None]:
    if topology == "agg":
        return [None] * pods
    if topology == "flex":
        return ["prefill-decode"] * pods
    if topology == "xpyd":
        prefill = max(1, pods // 2)
        return [*(["prefill"] * prefill), *(["decode"] * (pods - prefill))]
    raise ValueError(f"unknown topology {topology!r}: agg, xpyd or flex")


# --- the run --------------------------------------------------------------------------------------


class PDFastRun(fast.FastRun):
    """`fast.FastRun` with split requests: prefill leg, KV transfer, then decode (see the module)."""

    def __init__(
        self,
        workload: Workload,
        policy: PDPolicy,
        *,
        profile: Profile,
        pods: int,
        seed: int,
        link_bytes_per_s: float = LINK_BYTES_PER_S,
        kv_bytes_per_token: float = KV_BYTES_PER_TOKEN,
        faults: float = 0.0,
        sidecar: str = "epp",
        booked_interval_s: float = BOOKED_METRICS_INTERVAL_S,
    ) -> None:
        """`sidecar`: whose sidecar the decode pods run, as epp sees it: `epp` (its answer carries
        `x-epp-prefill` and `x-epp-prefill-seconds`) or `llm-d` (neither); either sends the
        decode leg's headers once the prefill pod has answered. `faults`: the share of split
        requests whose prefill pod dies mid-transfer (the sidecar then prefills on the decode
        pod: `fallbacks`), and, apart, the share of requests whose client goes away at a random
        moment of its first 10 s (`cancelled`: both stages' engine requests are aborted and
        epp's stream ends)."""
        if sidecar not in SIDECARS:
            raise ValueError(f"unknown sidecar {sidecar!r}: {', '.join(SIDECARS)}")
        self._roles = roles(policy.topology, pods)
        self.sidecar = sidecar
        self.faults = faults
        self._fault_seed = seed
        self.fallbacks = 0
        self.cancelled = 0
        self.link_bytes_per_s = link_bytes_per_s
        self.kv_bytes_per_token = kv_bytes_per_token
        self._legs: dict[str, tuple[str, Prompt, Sequence[Any], int]] = {}
        self.transfers: list[tuple[float, float]] = []  # (bytes, seconds) of every transfer
        super().__init__(
            workload,
            policy.policy(),
            profile=profile,
            pods=pods,
            seed=seed,
            booked_interval_s=booked_interval_s,
        )

    def specs(self, pods: int) -> list[EndpointSpec]:
        return [
            dataclasses.replace(spec, labels={ROLE_LABEL: role}) if role else spec
            for spec, role in zip(super().specs(pods), self._roles, strict=True)
        ]

    def dispatch(
        self,
        rid: str,
        prompt: Prompt,
        prefix: Sequence[Any],
        pod: int,
        *,
        remote_tokens: int = 0,
        local: bool = False,
    ) -> None:
        flight = self._inflight[rid]
        stage = flight.ctx.result.stages.get("prefill")
        if remote_tokens or local or not stage or stage[0] is flight.ctx.booked:
            if not remote_tokens and not local:
                self._arrive_faults(rid)
            super().dispatch(rid, prompt, prefix, pod, remote_tokens=remote_tokens)
            return
        p = self._pod_of[stage[0].name]
        leg = rid + "#prefill"
        try:
            self.engines[p].add_request(
                core.EngineRequest(leg, prompt.token_ids, 1, prefix_digests=prefix), self.now
            )
        except core.RequestRejected:
            super().dispatch(rid, prompt, prefix, pod)
            return
        flight.record.prefill_pod = p
        self._legs[leg] = (rid, prompt, prefix, pod)
        self.wake(p)
        self._arrive_faults(rid)

    def _arrive_faults(self, rid: str) -> None:
        rng = self._fault(rid, "cancel")
        if rng is not None and rng.random() < self.faults:
            self._push(self.now + rng.uniform(0.0, 10.0), _CANCEL, rid)

    def _fault(self, rid: str, what: str) -> random.Random | None:
        """Request `rid`'s own draws for fault `what` (None without faults): the same requests are
        cancelled, at the same moments, and lose their prefill pod under every policy. One stream
        shared by all requests would hit different requests under each policy (a policy that
        splits fewer draws fewer prefill deaths), and on pd-mixed, whose E2E p50 falls between
        its short and long answers, which requests a cancel removes moves the median by seconds."""
        return random.Random(f"pd-faults:{self._fault_seed}:{rid}:{what}") if self.faults else None

    def _step_end(self, payload: tuple[int, core.StepResult]) -> None:
        pod, res = payload
        legs, inflight = self._legs, self._inflight
        done = [r for r in res.finished if r.request_id in legs]
        # Only requests still in flight: a leg's own, or one cancelled during the step, are not.
        first = [r for r in res.first_tokens if r.request_id in inflight]
        finished = [r for r in res.finished if r.request_id in inflight]
        if len(first) != len(res.first_tokens) or len(finished) != len(res.finished):
            res = core.StepResult(res.duration, first, finished, res.num_prefill_tokens, res.num_decode_seqs)
        super()._step_end((pod, res))
        bs = self.profile.block_size
        for leg in done:
            rid, prompt, prefix, decode = legs.pop(leg.request_id)
            flight = self._inflight.get(rid)
            if flight is None:
                continue
            flight.ctx.release_helpers()  # the prefill pod's work is done
            death = self._fault(rid, "prefill-death")
            if death is not None and death.random() < self.faults:
                # The prefill pod died after its answer: the KV pull fails at once and the
                # sidecar prefills on the decode pod (epp.sidecar's --prefill-fallback local).
                self.fallbacks += 1
                if self.sidecar == "epp":
                    flight.ctx.on_response_headers({**_ANSWER, PREFILL_RESULT_HEADER: "local"}, None)
                self.dispatch(rid, prompt, prefix, decode, remote_tokens=0, local=True)
                continue
            # The sidecar has the prefill's answer and sends the decode leg, whose stream headers
            # vLLM answers at once (before the KV pull): they reach epp now.
            marks = {}
            if self.sidecar == "epp":
                marks = {
                    PREFILL_RESULT_HEADER: flight.ctx.result.stages["prefill"][0].hostport,
                    PREFILL_SECONDS_HEADER: f"{self.now - flight.ctx.picked_at:.6f}",
                }
            flight.ctx.on_response_headers({**_ANSWER, **marks}, None)
            held = self.engines[decode].cached_digest_blocks(prefix) * bs if prefix else 0
            moved = max(len(prompt.token_ids) - held, 0)
            nbytes = moved * self.kv_bytes_per_token
            seconds = TRANSFER_LATENCY_S + nbytes / self.link_bytes_per_s
            self.transfers.append((nbytes, seconds))
            self._push(self.now + seconds, _TRANSFER, (rid, prompt, prefix, decode))

    def on_event(self, kind: int, payload: Any) -> None:
        if kind == _CANCEL:
            self._cancel(payload)
            return
        if kind != _TRANSFER:
            super().on_event(kind, payload)
            return
        rid, prompt, prefix, decode = payload
        if rid in self._inflight:
            self.dispatch(rid, prompt, prefix, decode, remote_tokens=len(prompt.token_ids))

    def _cancel(self, rid: str) -> None:
        """The client of `rid` went away: every engine drops its part, epp's stream ends."""
        flight = self._inflight.pop(rid, None)
        if flight is None:
            return  # it finished first
        self.cancelled += 1
        leg = rid + "#prefill"
        if self._legs.pop(leg, None) is not None:
            self.engines[flight.record.prefill_pod].abort(leg)
        self.engines[self._pod_of[flight.ctx.booked.name]].abort(rid)
        flight.record.status = 499
        flight.record.finish = self.now - fast.START
        flight.ctx.finish(complete=False)
        self._user_done(flight.user, self.now)

    def _busy(self) -> bool:
        return super()._busy() or bool(self._legs)


# --- summary --------------------------------------------------------------------------------------


def summarize(run: PDFastRun, result: records.RunResult, scheduler_s: float) -> dict[str, Any]:
    served = [r for r in result.records if r.status == 200 and r.finish is not None]
    ttft = sorted(r.first_token - r.arrival for r in served if r.first_token is not None)
    e2e = sorted(r.finish - r.arrival for r in served if r.finish is not None)
    tpots = sorted(
        (r.finish - r.first_token) / (r.output_tokens - 1)
        for r in served
        if r.first_token is not None and r.finish is not None and r.output_tokens > 1
    )
    span = max((r.finish for r in served if r.finish is not None), default=0.0) or 1.0
    good = 0
    for r in served:
        assert r.first_token is not None and r.finish is not None
        t = r.first_token - r.arrival
        tp = (r.finish - r.first_token) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
        good += t <= SLO_TTFT_S and tp <= SLO_TPOT_S
    split = sum(1 for r in result.records if r.prefill_pod >= 0)
    moved = sum(b for b, _ in run.transfers)
    # The pod routed (as decode pod, when split) the most requests: a pod that draws every split
    # request's decode shows here first (its decode legs then wait there for KV blocks).
    per_pod = collections.Counter(r.pod for r in result.records if r.pod >= 0)
    return {
        "requests": len(result.records),
        "served": len(served),
        "unfinished": sum(1 for r in result.records if r.status == 0),
        "errors": sum(1 for r in result.records if r.status not in (0, 200)),
        "split_share": split / len(result.records) if result.records else 0.0,
        "busiest_pod_share": max(per_pod.values()) / len(result.records) if per_pod else 0.0,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpots, 50),
        "tpot_p99_s": percentile(tpots, 99),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p99_s": percentile(e2e, 99),
        # Means too: on pd-long-answer and pd-mixed a percentile is one request's, and moves with
        # its decode pod's batch by more than two policies' routing differs on average.
        "ttft_mean_s": statistics.fmean(ttft) if ttft else math.nan,
        "tpot_mean_s": statistics.fmean(tpots) if tpots else math.nan,
        "e2e_mean_s": statistics.fmean(e2e) if e2e else math.nan,
        "output_tok_per_s": sum(r.output_tokens for r in served) / span,
        "goodput_req_per_s": good / span,
        "kv_moved_gb": moved / 1e9,
        "scheduler_us_per_request": 1e6 * scheduler_s / max(len(result.records), 1),
        "wall_s": result.wall_s,
    }


def run_one(
    workload: str,
    policy: str,
    seed: int,
    *,
    scale: float,
    pods: int,
    link_bytes_per_s: float,
    load: float = 1.0,
    faults: float = 0.0,
    sidecar: str = "epp",
    booked_interval_s: float = BOOKED_METRICS_INTERVAL_S,
) -> dict[str, Any]:
    profile = get_profile(PROFILE)
    fleet = Fleet(pods, profile.kv_capacity_tokens, profile.max_model_len)
    wl = PD_WORKLOADS[workload](seed=seed, scale=scale, fleet=fleet, load=load)
    run = PDFastRun(
        wl,
        PD_POLICIES[policy],
        profile=profile,
        pods=pods,
        seed=seed,
        link_bytes_per_s=link_bytes_per_s,
        faults=faults,
        sidecar=sidecar,
        booked_interval_s=booked_interval_s,
    )
    before = _scheduler_seconds()
    result = run.run()
    out = summarize(run, result, _scheduler_seconds() - before)
    leaked = [ep.name for ep in run.datastore.endpoints() if ep.inflight_requests]
    out["leaked_bookings"] = len(leaked)
    out["cancelled"] = run.cancelled
    out["prefill_fallbacks"] = run.fallbacks
    return out


def _scheduler_seconds() -> float:
    """The sum of inference_extension_scheduler_e2e_duration_seconds so far (CPU of the decisions)."""
    for family in metrics.scheduler_duration.collect():
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                return float(sample.value)
    return 0.0


KEYS: Final = ("ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "tpot_p50_s", "output_tok_per_s",
               "goodput_req_per_s", "split_share")  # fmt: skip


MIN_SEEDS_FOR_INTERVAL: Final = 5


def _ratio(
    num: Sequence[dict[str, Any]], den: Sequence[dict[str, Any]], key: str, bound: float, low: bool
) -> str:
    """`key`'s ratio of the means with its verdict against `bound` (a ratio that must stay at or
    under it when `low`, else at or over): `ok`, `MISS`, or `MISS (within noise)` where the seeds'
    interval still reaches the bound; with 5 seeds or more the interval is shown."""
    ratio = statistics.fmean(r[key] for r in num) / max(statistics.fmean(r[key] for r in den), 1e-12)
    ok = ratio <= bound if low else ratio >= bound
    text = f"{key} {ratio:.3f}x"
    verdict = "ok" if ok else "MISS"
    if len(num) >= MIN_SEEDS_FOR_INTERVAL:
        lo, hi = seed_interval(num, den, key)
        text += f" [{lo:.3f}-{hi:.3f}]"
        if not ok and (lo <= bound if low else hi >= bound):
            verdict = "MISS (within noise)"
    return f"{text} {verdict}"


def targets(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[str]:
    """The issue's targets, checked on the means over seeds: lines of text. With 5 seeds or more
    each ratio carries its 95% interval over the seeds (`seed_interval`)."""
    lines = []

    def mean(w: str, p: str, k: str) -> float:
        return statistics.fmean(r[k] for r in results[w][p])

    for w, by_policy in results.items():
        if "epp-pd" in by_policy and "llm-d-pd" in by_policy:
            epp, llmd = by_policy["epp-pd"], by_policy["llm-d-pd"]
            parts = [
                _ratio(epp, llmd, k, 1.0, low)
                for k, low in (("e2e_p50_s", True), ("e2e_p99_s", True), ("ttft_p99_s", True),
                               ("output_tok_per_s", False), ("goodput_req_per_s", False))
            ]  # fmt: skip
            means = ", ".join(
                f"{k} {mean(w, 'epp-pd', k) / max(mean(w, 'llm-d-pd', k), 1e-12):.4f}x"
                for k in ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s")
            )
            lines.append(f"{w}: epp-pd / llm-d-pd: " + ", ".join(parts) + f" (per request: {means})")
        if "epp-pd-flex" in by_policy and "aggregated" in by_policy:
            flex, agg = by_policy["epp-pd-flex"], by_policy["aggregated"]
            # "Within 3% of aggregated": the bound where P/D loses to aggregated serving.
            parts = [
                _ratio(flex, agg, k, 1.03 if low else 0.97, low)
                for k, low in (("e2e_p50_s", True), ("e2e_p99_s", True), ("ttft_p99_s", True),
                               ("output_tok_per_s", False), ("goodput_req_per_s", False))
            ]  # fmt: skip
            lines.append(f"{w}: epp-pd-flex / aggregated (within 3%): " + ", ".join(parts))
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workloads", default="all", help=f"comma-separated or all: {', '.join(PD_WORKLOADS)}"
    )
    parser.add_argument(
        "--pd-policies", default="all", help=f"comma-separated or all: {', '.join(PD_POLICIES)}"
    )
    parser.add_argument("--seeds", default="1-5", help="seeds: 1-5 or 1,3,7 (default 1-5)")
    parser.add_argument("--scale", type=float, default=1.0, help="share of each workload's 120 s to run")
    parser.add_argument("--pods", type=int, default=PODS, help=f"pods in every fleet (default {PODS})")
    parser.add_argument("--link-gbps", type=float, default=LINK_BYTES_PER_S * 8 / 1e9,
                        help="KV transfer bandwidth of a pod pair, Gb/s (default 400)")  # fmt: skip
    parser.add_argument("--load", type=float, default=1.0, help="multiply every workload's QPS (default 1)")
    parser.add_argument(
        "--faults",
        type=float,
        default=0.0,
        help="share of split requests whose prefill pod dies mid-transfer, and of requests whose "
        "client cancels (default 0); the run then reports fallbacks, cancels and leaked bookings",
    )
    parser.add_argument(
        "--sidecar",
        choices=SIDECARS,
        default="epp",
        help="the decode pods' sidecar: epp (reports the prefill leg's seconds to epp) or llm-d "
        "(does not: epp learns the prefill pods from the time to the answer's headers)",
    )
    fast_scrapes.add_booked_scrape_argument(parser, default=BOOKED_METRICS_INTERVAL_S)
    parser.add_argument("--out", default="", help="write results.json here")


def _names(text: str, known: dict[str, Any], what: str) -> list[str]:
    names = list(known) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def _seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-", 1)
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",") if s.strip()]


def run(args: argparse.Namespace) -> int:
    workloads = _names(args.workloads, PD_WORKLOADS, "workload")
    policies = _names(args.pd_policies, PD_POLICIES, "policy")
    seeds = _seeds(args.seeds)
    if (problem := fast_scrapes.booked_interval_problem(args.booked_scrape_interval)) is not None:
        raise SystemExit(problem)
    link = args.link_gbps * 1e9 / 8
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for w in workloads:
        print(f"\n{w}: {PD_WORKLOADS[w].description} ({PROFILE}, {args.pods} pods, seeds {args.seeds})")
        print(f"{'policy':<15}" + "".join(f"{k:>19}" for k in KEYS))
        for p in policies:
            runs = [
                run_one(
                    w,
                    p,
                    s,
                    scale=args.scale,
                    pods=args.pods,
                    link_bytes_per_s=link,
                    load=args.load,
                    faults=args.faults,
                    sidecar=args.sidecar,
                    booked_interval_s=args.booked_scrape_interval,
                )
                for s in seeds
            ]
            results.setdefault(w, {})[p] = runs
            means = [statistics.fmean(r[k] for r in runs if not math.isnan(r[k])) for k in KEYS]
            print(f"{p:<15}" + "".join(f"{m:>19.4f}" for m in means), flush=True)
            leaked = sum(r["leaked_bookings"] for r in runs)
            if args.faults or leaked:
                n = sum(r["requests"] for r in runs)
                cancels = sum(r["cancelled"] for r in runs)
                fallbacks = sum(r["prefill_fallbacks"] for r in runs)
                print(
                    f"  {n} requests, {cancels} cancelled, {fallbacks} local fallbacks, "
                    f"{leaked} leaked bookings"
                )
    print()
    for line in targets(results):
        print(line)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0
