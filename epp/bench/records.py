"""What one benchmark run produced, in fast and live mode alike: each request's life
(`RequestRecord`), the fleet at each scrape tick (`Sample`), and the run (`RunResult`).
`epp.bench.report` summarizes them; `epp.bench.fast` and `epp.bench.live` fill them."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp.bench.workload import Prompt


@dataclasses.dataclass(slots=True)
class RequestRecord:
    """One request's life, in seconds from the start of the run."""

    arrival: float
    stage: int
    group: str
    prompt_tokens: int
    shared_tokens: int
    max_tokens: int
    pod: int = -1  # index of the pod it was routed to; -1 when not routed
    status: int = 0  # 200 served; vLLM's 400; epp's 429/503; 0 = unfinished when the run stopped
    first_token: float | None = None
    finish: float | None = None
    cached_tokens: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    # The shared prefix's tokens in full blocks (capped as vLLM caps a hit: the last prompt token
    # is always computed), and at arrival the most of them any pod held cached and the chosen pod
    # held: what tells a miss no router could avoid from one it routed away from.
    prefix_need: int = 0
    held_best: int = 0
    held_chosen: int = 0
    isolated_prefill_s: float = 0.0  # the TTFT its uncached prompt takes on an idle pod
    priority: int = 0
    fairness_id: str = ""
    routed: float | None = None  # when it was routed (later than `arrival` when flow control held it)
    dropped: str = ""  # x-llm-d-request-dropped-reason of a 429/503
    prefill_pod: int = -1  # P/D (epp.bench.pd): the pod that prefilled it when split, else -1
    # The prompt tokens an earlier request left computed, in full blocks (epp.bench.reuse): the
    # most any router could have found cached for it. None: unknown (inference-perf's prompts).
    reusable_tokens: int | None = None


def arrived(prompt: Prompt, arrival: float, reusable_tokens: int | None) -> RequestRecord:
    """The record of `prompt`, arriving `arrival` seconds from the start of the run."""
    return RequestRecord(
        arrival=arrival,
        stage=prompt.stage,
        group=prompt.group,
        prompt_tokens=len(prompt.token_ids),
        shared_tokens=prompt.shared_tokens,
        max_tokens=prompt.max_tokens,
        priority=prompt.priority,
        fairness_id=prompt.fairness_id,
        reusable_tokens=reusable_tokens,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class PrewarmRecord:
    """A pre-warm the router sent (fast mode: `epp.bench.fast_prewarm`)."""

    at: float  # seconds from the start of the run
    pod: int  # the pod that computed the prefix
    tokens: int  # the prompt's first `tokens` tokens
    group: str  # the prefix group of the request it was planned for ("" = shares nothing)


@dataclasses.dataclass(slots=True)
class Sample:
    """The fleet at one scrape tick."""

    t: float
    waiting: list[int]
    running: list[int]
    kv_usage: list[float]
    queued: dict[int, int] = dataclasses.field(default_factory=dict)  # flow control, per band


@dataclasses.dataclass(slots=True)
class RunResult:
    workload: str
    policy: str
    seed: int
    pods: int
    profile: str
    records: list[RequestRecord]
    samples: list[Sample]
    wall_s: float = 0.0
    end: float = 0.0  # virtual time of the last event, from the start of the run
    steps: int = 0
    stopped_early: bool = False  # the safety limit on virtual time ended the run
    # Live mode: the router's CPU seconds over the measured stretch, and the fleet's own
    # prefix-cache counters (tokens) and completed requests per pod, read from the pods.
    router_cpu_s: float = math.nan
    fleet_prefix_hits: int = 0
    fleet_prefix_queries: int = 0
    fleet_requests_per_pod: list[int] | None = None
    prewarms: int | None = None  # pre-warms sent to the pods (epp.scheduling.prewarm); live: unknown
    prewarm_log: list[PrewarmRecord] | None = None  # each one sent; live: unknown
    pod_restarts: int = 0  # pods restarted during the run (`Workload.pod_restarts`), once back


def write_jsonl(path: str, result: RunResult) -> None:
    """One JSON object per request, in arrival order: the run's workload, policy and seed, then
    the record's fields. NaN is written as null."""
    head = {"workload": result.workload, "policy": result.policy, "seed": result.seed}
    with open(path, "w", encoding="utf-8") as out:
        for record in sorted(result.records, key=lambda r: r.arrival):
            row = {**head, **dataclasses.asdict(record)}
            for key, value in row.items():
                if isinstance(value, float) and not math.isfinite(value):
                    row[key] = None
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
