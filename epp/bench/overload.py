"""Overload workloads, for flow control: priority classes, tenants, a cold start.

Sized against the fleet's capacity, `capacity_per_pod` requests a second per pod for this prompt
mix (256-1,024-token unique prompts, 64-256 output tokens) on `codellama-13b-a100`: 5, somewhat
below what a fleet of these pods completes when offered more (48.1 req/s on 8 pods at 100 and 120
offered, in fast mode, ~6 per pod, with TPOT past 55 ms; it scales with the pods). Another profile
has another capacity: the rates say "3x" of this. The choice moves the comparisons: at 6 per pod
(seeds 1-3) flow control's goodput at 3x is 1.19x that of no flow control's (1.05x at 5), and
the steady tenants' TTFT p99 during a burst, which then exceeds what the pods complete, is 4.7x
theirs without it (15x without flow control).

- `overload-3x`: 30 s at 0.3x capacity (unloaded), then 60 s at 3x; 10% of requests are critical
  (priority 10), 20% standard (priority 0) and 70% sheddable (priority -1): critical and standard
  together are 90% of capacity, so the sheddable ones are the excess to absorb.
- `tenant-burst`: ten tenants (fairness IDs `tenant-0` .. `tenant-9`), each at 6% of capacity for
  30 s; then `tenant-0` bursts to 10x its rate (60% of capacity) for 60 s while the nine stay
  steady; then 30 s with every tenant at 20% of capacity (all backlogged). `tenant-steady` is the
  same without the burst: the nine's latency with and without it is the fairness comparison.
- `cold-start`: the pool has no pod for the first 30 s; requests arrive at 30% of capacity from
  the start, for 90 s.

`Workload.policies` names the admission policies these are compared under (`--policies admission`).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator

from epp.bench.workload import Fleet, OpenLoop, Prompt, poisson_times, token_ids

CRITICAL, STANDARD, SHEDDABLE = 10, 0, -1


class _Overload(OpenLoop):
    default_profile = "codellama-13b-a100"
    default_pods = 4
    capacity_per_pod = 5.0  # req/s (see the module docstring)
    prompt_tokens = (256, 1024)
    output_tokens = (64, 256)

    @property
    def capacity(self) -> float:
        return self.capacity_per_pod * self.fleet.pods

    def _prompt(self, rng: random.Random, stage: int, priority: int = 0, tenant: str = "") -> Prompt:
        ids = token_ids(rng, rng.randint(*self.prompt_tokens))
        return Prompt(
            ids, rng.randint(*self.output_tokens), tenant, 0, stage, priority=priority, fairness_id=tenant
        )


class PriorityOverload(_Overload):
    name = "overload-3x"
    description = "0.3x capacity for 30 s, then 3x for 60 s; 10% critical, 20% standard, 70% sheddable"
    shares = ((CRITICAL, 0.1), (STANDARD, 0.2))  # the rest is sheddable

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        c = self.capacity
        self.stages = self.scaled_stages([("unloaded", 30.0, 0.3 * c, None), ("3x", 60.0, 3.0 * c, None)])

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        rng, classes = self.rng("prompts"), self.rng("classes")
        for t, stage in poisson_times(self.rng("arrivals"), self.stages):
            x, priority = classes.random(), SHEDDABLE
            for p, share in self.shares:
                if x < share:
                    priority = p
                    break
                x -= share
            yield t, self._prompt(rng, stage, priority)


class TenantBurst(_Overload):
    name = "tenant-burst"
    description = "10 tenants at 6% of capacity; tenant-0 bursts 10x for 60 s; then all backlogged"
    tenants = 10
    burst = 10.0

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        self.stages = self.scaled_stages(
            [("steady", 30.0, None, None), ("burst", 60.0, None, None), ("backlogged", 30.0, None, None)]
        )
        c = self.capacity
        steady = 0.06 * c
        # Per stage, each tenant's rate.
        self.rates = [
            [steady] * self.tenants,
            [steady * self.burst] + [steady] * (self.tenants - 1),
            [0.2 * c] * self.tenants,
        ]

    def _times(self, tenant: int) -> Iterator[tuple[float, int, int]]:
        stages = [
            type(stage)(stage.label, stage.start, stage.end, self.rates[i][tenant])
            for i, stage in enumerate(self.stages)
        ]
        for t, stage in poisson_times(self.rng("arrivals", tenant), stages):
            yield t, tenant, stage

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        rngs = [self.rng("prompts", tenant) for tenant in range(self.tenants)]
        for t, tenant, stage in heapq.merge(*(self._times(tenant) for tenant in range(self.tenants))):
            yield t, self._prompt(rngs[tenant], stage, tenant=f"tenant-{tenant}")


class TenantSteady(TenantBurst):
    name = "tenant-steady"
    description = "tenant-burst without the burst (the baseline of the fairness comparison)"
    burst = 1.0


class ColdStart(_Overload):
    name = "cold-start"
    description = "no pod for the first 30 s, requests at 30% of capacity from the start, for 90 s"

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        c = self.capacity
        self.stages = self.scaled_stages([("no-pods", 30.0, 0.3 * c, None), ("pods-up", 60.0, 0.3 * c, None)])
        self.pods_ready_at = self.stages[0].end

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        rng = self.rng("prompts")
        for t, stage in poisson_times(self.rng("arrivals"), self.stages):
            yield t, self._prompt(rng, stage)


OVERLOAD_WORKLOADS = (PriorityOverload, TenantBurst, TenantSteady, ColdStart)
