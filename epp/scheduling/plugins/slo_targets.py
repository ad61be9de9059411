"""Latency targets (SLOs) in `request-latency-scorer`: which candidates are predicted to meet a
request's TTFT and TPOT targets, the score tiers that prefer them, and what explain says of it.

A request carries targets in `x-slo-ttft-ms` / `x-slo-tpot-ms` (`epp.api.slo`). The scorer
predicts, per candidate, the request's TTFT (its predicted TTFT plus the wait for KV blocks) and
its time per output token (the step time of the batch it would join). A candidate meets the TPOT
target when that step is within the tightest TPOT target in play there: the request's own and
those of the requests already running on it, which the pick slows down too (as llm-d checks a
pod's running requests' TPOT targets).

Two tiers: tier 0 meets every target in play, tier 1 misses at least one. The scorer's own score
`s` in (0, 1] (the cheapest whole-request objective scores 1) becomes `(1 + s) / 2` in tier 0
and `s / 2` in tier 1, so every candidate that meets the targets outscores every one that misses,
and within a tier the objective decides as before. When all candidates share a tier (all meet
the targets, or none does), the scores are left exactly as they were, and no candidate is ever
excluded: a request nobody can serve in time goes where the objective sends it.

Why not llm-d's ranking of the misses (a missed TPOT only, then a missed TTFT only, then both):
on `epp bench --workload chat --seed 1 --slo-ttft 0.2 --slo-tpot 0.03 --slo-headers` it cut the
share of requests meeting both targets from 93.0% (no headers) to 87.3%: where no pod met both,
it sent the request to its prompt's holders to save its TTFT, and their batches then missed the
TPOT target for everyone there. Two tiers raise the share to 95.9% on the same run (docs/slo.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Final

TIERS: Final = 2


@dataclasses.dataclass(slots=True)
class Verdict:
    """One candidate's predictions against the targets in play there."""

    ttft_s: float  # predicted time to first token
    tpot_s: float  # predicted time per output token after the pick
    ttft_target: float | None  # the request's
    tpot_target: float | None  # the tightest of the request's and its running requests'
    tpot_from: str  # "request" or "running": whose target `tpot_target` is

    @property
    def ttft_missed(self) -> bool:
        return self.ttft_target is not None and self.ttft_s > self.ttft_target

    @property
    def tpot_missed(self) -> bool:
        return self.tpot_target is not None and self.tpot_s > self.tpot_target

    @property
    def tier(self) -> int:
        return 1 if self.ttft_missed or self.tpot_missed else 0

    def missed(self) -> list[str]:
        return [name for name, m in (("ttft", self.ttft_missed), ("tpot", self.tpot_missed)) if m]

    def explain(self) -> dict[str, Any]:
        row: dict[str, Any] = {"tier": self.tier, "met": not (self.ttft_missed or self.tpot_missed)}
        if self.ttft_target is not None:
            row.update(
                ttft_predicted_s=self.ttft_s,
                ttft_target_s=self.ttft_target,
                ttft_headroom_s=self.ttft_target - self.ttft_s,
                ttft_met=not self.ttft_missed,
            )
        if self.tpot_target is not None:
            row.update(
                tpot_predicted_s=self.tpot_s,
                tpot_target_s=self.tpot_target,
                tpot_headroom_s=self.tpot_target - self.tpot_s,
                tpot_met=not self.tpot_missed,
                tpot_target_from=self.tpot_from,
            )
        return row


def verdict(
    ttft_s: float,
    tpot_s: float,
    ttft_target: float | None,
    own_tpot: float | None,
    running_tpot: float | None,
    running_tpot_s: float | None = None,
) -> Verdict:
    """`tpot_s`: the request's own predicted time per token; `running_tpot_s` (default the same):
    the running requests' there, which the newcomer's prefill also stalls. The TPOT target that
    binds is the one with the least headroom."""
    held = tpot_s if running_tpot_s is None else running_tpot_s
    checks = []
    if own_tpot is not None:
        checks.append((own_tpot - tpot_s, own_tpot, tpot_s, "request"))
    if running_tpot is not None:
        checks.append((running_tpot - held, running_tpot, held, "running"))
    if not checks:
        return Verdict(ttft_s, tpot_s, ttft_target, None, "request")
    _, target, predicted, source = min(checks)
    return Verdict(ttft_s, predicted, ttft_target, target, source)


@dataclasses.dataclass(slots=True)
class SloDecision:
    """The targets' effect on one request's scores (explain reads it from the cycle state)."""

    ttft_target: float | None
    tpot_target: float | None
    verdicts: dict[str, Verdict]
    objective_best: str  # the candidate the objective alone scores highest
    preferred: str  # the candidate scored highest with the tiers

    def explain(self) -> dict[str, Any]:
        """Request-level: the targets, who meets them, and what drove the preferred candidate."""
        out: dict[str, Any] = {}
        if self.ttft_target is not None:
            out["ttft_target_s"] = self.ttft_target
        if self.tpot_target is not None:
            out["tpot_target_s"] = self.tpot_target
        meeting = sorted(n for n, v in self.verdicts.items() if v.tier == 0)
        pick = self.verdicts[self.preferred]
        best = self.verdicts[self.objective_best]
        # The targets that moved the choice off the objective's favourite: those it misses and the
        # preferred candidate meets.
        driven = (
            [t for t in best.missed() if t not in pick.missed()]
            if self.preferred != self.objective_best
            else []
        )
        out.update(
            meeting=meeting,
            preferred=self.preferred,
            preferred_met=pick.tier == 0,
            objective_best=self.objective_best,
            driven_by="+".join(driven),
            binding=_binding(pick),
            summary=self._summary(pick, best, driven),
        )
        return out

    def _summary(self, pick: Verdict, best: Verdict, driven: list[str]) -> str:
        if driven:
            return (
                f"{self.preferred} preferred: {self.objective_best}, the cheapest by the objective, is "
                f"predicted to miss {_describe(best, driven)}; {self.preferred} is predicted to "
                f"{'meet every target' if pick.tier == 0 else 'miss ' + _describe(pick, pick.missed())}"
            )
        if pick.tier == 0:
            return f"{self.preferred} preferred by the objective; it is predicted to meet every target"
        if not any(v.tier == 0 for v in self.verdicts.values()):
            return (
                f"no candidate is predicted to meet every target; {self.preferred}, the cheapest by the "
                f"objective, is predicted to miss {_describe(pick, pick.missed())}"
            )
        return f"{self.preferred} preferred; it is predicted to miss {_describe(pick, pick.missed())}"


def _binding(v: Verdict) -> str:
    """The target that binds at a candidate: the one it misses (TTFT first), else the one with
    the least headroom relative to its size."""
    missed = v.missed()
    if missed:
        return missed[0]
    slack = []
    if v.ttft_target is not None:
        slack.append(((v.ttft_target - v.ttft_s) / v.ttft_target, "ttft"))
    if v.tpot_target is not None:
        slack.append(((v.tpot_target - v.tpot_s) / v.tpot_target, "tpot"))
    return min(slack)[1] if slack else ""


def _describe(v: Verdict, which: Sequence[str]) -> str:
    parts = []
    for t in which:
        if t == "ttft" and v.ttft_target is not None:
            parts.append(f"TTFT ({v.ttft_s * 1000:.0f} ms > {v.ttft_target * 1000:.0f} ms)")
        elif t == "tpot" and v.tpot_target is not None:
            whose = "" if v.tpot_from == "request" else ", a running request's target"
            parts.append(f"TPOT ({v.tpot_s * 1000:.1f} ms > {v.tpot_target * 1000:.1f} ms{whose})")
    return " and ".join(parts)


def tiered(scores: Sequence[float], tiers: Sequence[int]) -> list[float]:
    """Scores in (0, 1] banded by tier (see the module docstring); unchanged when all share one."""
    if len(set(tiers)) <= 1:
        return list(scores)
    top = TIERS - 1
    return [(top - tier + s) / TIERS for s, tier in zip(scores, tiers, strict=True)]


def best_index(scores: Sequence[float]) -> int:
    """The first highest score's index."""
    return max(range(len(scores)), key=scores.__getitem__)
