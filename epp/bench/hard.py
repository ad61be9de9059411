"""Workloads where routing is hard: every cache-aware router does not reach the same hit rate, and
where a request goes decides its latency. Each follows a published trace or a user report.

- `kv-pressure` (open loop): the working set is 2.5x the fleet's KV cache. ~290 prompt prefixes of
  2k-6k tokens with Zipf(1.0) popularity, as production prefix reuse is long-tailed (Mooncake's
  Kimi trace, FAST'25: most blocks are reused rarely, a few very often). Caches evict all the time;
  a router that spreads a prefix over many pods multiplies its footprint and evicts what others
  need. llm-d's precise benchmark runs at 73% of the fleet's KV for the same reason.
- `rag` (open loop, Llama-3.1-70B on 4 x H100 per pod): long-context RAG, 60 documents of 16k-32k
  tokens (Zipf(0.8)) with a short question each. A miss costs seconds of prefill; placing a
  document on one more pod costs ~24k tokens of its KV. Users report routing-path cost and
  latency at these sizes (GIE #2928, >1 s at 220 KB prompts; llm-d's operations guide sizes its
  EPP for 100k-token prompts).
- `agentic` (closed loop, Qwen3-32B on llm-d's pod): 32 agents, each a session whose context grows
  by the model's reply and a tool's output (200-4,000 tokens) every step, 8-30 steps, to 32k
  tokens; one of 4 agent system prompts (6k tokens of tools). A session's next step hits only where
  its previous one ran, and sessions outgrow the prefix a text router matches on. Session and agent
  affinity is among the most requested features across the peers (llm-d #2238 and #1244,
  vllm-project/router #219, sglang #33625; inference-perf ships a synthetic agentic generator).
- `bursty` (open loop): 16 tenants with 3k-token system prompts, each switching between quiet (0.05
  req/s) and bursts (2 req/s) for exponential spells (10 s on, 40 s off on average): load moves
  between prefixes faster than a router's load signals (smg #2378: a P/D p99 of 500 s without
  shedding; GIE #2117 and llm-d #1751 ask for admission and backpressure under bursts).
- `mixed-fleet` (open loop): one pool of 4 CodeLlama-13B pods on A100 and 4 on H100 (hardware
  generations mixed in one pool, as fleets grow); 60% of requests share 16 prefixes. A pod that is
  2.5x faster at prefill should take more of the traffic; routers that balance request counts
  overload the slow pods (users ask for load inside the affinity decision: sglang #14305, smg
  #1714, vllm-project/router #179).

- `rolling-restart` (open loop): 24 shared 3k-5k-token prefixes (Zipf(0.6)), and every pod
  restarts in turn mid-run, back on the same address 20 s later with an empty cache (a
  container restart; a StatefulSet or LeaderWorkerSet pod keeps its name). A router that learned
  where prefixes live from its own decisions still takes the restarted pod for warm and sends it
  cold prefills (volcano-sh/kthena #1428: "the scorer then treats a pod with an empty cache as a
  warm one"; the same for a re-registered worker URL in a cache-aware tree, ROCm/ATOM #2276).

`hotspot` (workloads.py) is the hot-prefix case: 80% of requests on one prefix.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections.abc import Iterator, Sequence

from epp.bench.workload import ClosedLoop, Fleet, OpenLoop, Prompt, poisson_times, token_ids


def zipf_weights(n: int, s: float) -> list[float]:
    """Cumulative Zipf(s) weights over ranks 1..n (for `bisect`)."""
    return list(itertools.accumulate(1.0 / (rank**s) for rank in range(1, n + 1)))


def pick(rng: random.Random, cumulative: Sequence[float]) -> int:
    return bisect.bisect_left(cumulative, rng.random() * cumulative[-1])


class _SharedPrefixes(OpenLoop):
    """Poisson arrivals at `qps`; each prompt is one of `prefixes` (chosen by `weights`) + a query."""

    qps = 6.0
    seconds = 600.0
    query_tokens = (64, 256)
    output_tokens = (64, 256)

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        self.stages = self.scaled_stages([(f"qps={self.qps:g}", self.seconds, self.qps, None)])
        self.prefixes: list[list[int]] = []
        self.weights: list[float] = []

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        rng = self.rng("prompts")
        for t, stage in poisson_times(self.rng("arrivals"), self.stages):
            g = pick(rng, self.weights)
            prefix = self.prefixes[g]
            ids = [*prefix, *token_ids(rng, rng.randint(*self.query_tokens))]
            yield t, Prompt(ids, rng.randint(*self.output_tokens), f"prefix-{g}", len(prefix), stage)


class KVPressure(_SharedPrefixes):
    name = "kv-pressure"
    description = "working set 2.5x the fleet's KV: ~290 prefixes of 2k-6k tokens, Zipf(1.0) popularity"
    default_profile = "codellama-13b-a100"
    default_pods = 8
    qps = 6.0
    prefix_tokens = (2048, 6144)
    working_set = 2.5  # the distinct prefixes' tokens over the fleet's KV capacity
    zipf_s = 1.0

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        rng = self.rng("prefixes")
        budget = self.working_set * fleet.pods * fleet.kv_tokens_per_pod
        lo, hi = self.prefix_tokens
        groups = max(8, int(budget / ((lo + hi) / 2)))
        self.prefixes = [token_ids(rng, rng.randint(lo, hi)) for _ in range(groups)]
        self.weights = zipf_weights(groups, self.zipf_s)


class LongRag(_SharedPrefixes):
    name = "rag"
    description = "long-context RAG: 60 documents of 16k-32k tokens, Zipf(0.8), short questions"
    default_profile = "llama-3.1-70b-h100"
    default_pods = 8
    qps = 4.0
    seconds = 300.0
    documents = 60
    document_tokens = (16384, 32768)
    zipf_s = 0.8
    output_tokens = (128, 384)

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        rng = self.rng("documents")
        room = fleet.max_model_len - self.query_tokens[1] - self.output_tokens[1] - 1
        lo, hi = (min(n, room) for n in self.document_tokens)
        self.prefixes = [token_ids(rng, rng.randint(lo, hi)) for _ in range(self.documents)]
        self.weights = zipf_weights(self.documents, self.zipf_s)


class MixedFleet(_SharedPrefixes):
    name = "mixed-fleet"
    description = "4 A100 + 4 H100 pods in one pool; 60% of requests on 16 shared 4k-token prefixes"
    default_profile = "codellama-13b-a100"
    pod_profiles = ("codellama-13b-a100",) * 4 + ("codellama-13b-h100",) * 4
    default_pods = 8
    qps = 10.0
    groups = 16
    prefix_tokens = 4096
    shared = 0.6
    query_tokens = (256, 1024)
    output_tokens = (128, 512)

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        rng = self.rng("prefixes")
        self.prefixes = [token_ids(rng, self.prefix_tokens) for _ in range(self.groups)]

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        rng = self.rng("prompts")
        for t, stage in poisson_times(self.rng("arrivals"), self.stages):
            query = token_ids(rng, rng.randint(*self.query_tokens))
            out = rng.randint(*self.output_tokens)
            if rng.random() < self.shared:
                g = rng.randrange(self.groups)
                prefix = self.prefixes[g]
                yield t, Prompt([*prefix, *query], out, f"prefix-{g}", len(prefix), stage)
            else:
                yield t, Prompt(query, out, "", 0, stage)


class BurstyTenants(OpenLoop):
    name = "bursty"
    description = "16 tenants on 3k-token system prompts, each bursting 40x for ~10 s every ~50 s"
    default_profile = "codellama-13b-a100"
    default_pods = 8
    tenants = 16
    system_tokens = 3072
    quiet_qps = 0.05
    burst_qps = 2.0
    burst_mean_s = 10.0
    quiet_mean_s = 40.0
    seconds = 600.0
    query_tokens = (64, 512)
    output_tokens = (64, 256)

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        self.stages = self.scaled_stages([("bursts", self.seconds, None, None)])
        rng = self.rng("systems")
        self.systems = [token_ids(rng, self.system_tokens) for _ in range(self.tenants)]

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        # The tenants' time-ordered streams merged (a tenant's times strictly increase, so ties
        # between streams are broken by the tenant's index, never by comparing prompts).
        for t, _, prompt in heapq.merge(*(self._tenant(k) for k in range(self.tenants))):
            yield t, prompt

    def _tenant(self, k: int) -> Iterator[tuple[float, int, Prompt]]:
        """Tenant `k`'s requests: quiet and burst spells in turn, Poisson within each (memoryless,
        so a spell may start its arrivals afresh)."""
        rng = self.rng("tenant", k)
        end = self.duration
        share = self.burst_mean_s / (self.burst_mean_s + self.quiet_mean_s)
        bursting = rng.random() < share
        t = 0.0
        while t < end:
            spell_end = min(
                end, t + rng.expovariate(1.0 / (self.burst_mean_s if bursting else self.quiet_mean_s))
            )
            rate = self.burst_qps if bursting else self.quiet_qps
            while (t := t + rng.expovariate(rate)) < spell_end:
                system = self.systems[k]
                ids = [*system, *token_ids(rng, rng.randint(*self.query_tokens))]
                out = rng.randint(*self.output_tokens)
                yield t, k, Prompt(ids, out, f"tenant-{k}", len(system), 0, fairness_id=f"t{k}")
            t = spell_end
            bursting = not bursting


class Agentic(ClosedLoop):
    name = "agentic"
    description = "32 agents: sessions growing by tool output each step (8-30 steps, to 32k tokens)"
    default_profile = "qwen3-32b-tp2-h100"
    default_pods = 8
    users = 32
    agents = 4
    system_tokens = 6144
    task_tokens = (256, 1024)
    steps = (8, 30)
    reply_tokens = (64, 384)
    tool_tokens = (200, 4000)
    tool_mean_s = 2.0
    max_context = 32768
    seconds = 900.0

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        self.stages = self.scaled_stages([("agents", self.seconds, None, None)])
        rng = self.rng("agents")
        self.systems = [token_ids(rng, self.system_tokens) for _ in range(self.agents)]
        self._rngs = [self.rng("user", u) for u in range(self.users)]
        # Per agent: (session label, context so far, steps left); context None = a new session.
        self._state: list[tuple[str, list[int] | None, int]] = [("", None, 0)] * self.users
        self._sessions = [0] * self.users
        self.limit = min(self.max_context, fleet.max_model_len)

    def next_request(self, user: int, now: float) -> tuple[float, Prompt] | None:
        rng = self._rngs[user]
        t = now + rng.expovariate(1.0 / self.tool_mean_s)
        if t >= self.duration:
            return None
        label, context, left = self._state[user]
        reply = rng.randint(*self.reply_tokens)
        tool = token_ids(rng, rng.randint(*self.tool_tokens))
        if context is not None and left > 0 and len(context) + len(tool) + reply < self.limit:
            prompt, group, shared = [*context, *tool], label, len(context)
            left -= 1
        else:  # a new session of one of the agents
            agent = rng.randrange(self.agents)
            task = token_ids(rng, rng.randint(*self.task_tokens))
            prompt, group, shared = [*self.systems[agent], *task], f"agent-{agent}", self.system_tokens
            self._sessions[user] += 1
            label = f"session-{user}-{self._sessions[user]}"
            left = rng.randint(*self.steps) - 1
        out = token_ids(rng, reply)  # the engine generates exactly this; the next step carries it
        self._state[user] = (label, [*prompt, *out], left)
        return t, Prompt(prompt, reply, group, shared, self.stage_at(t), out)


class RollingRestart(_SharedPrefixes):
    name = "rolling-restart"
    description = "every pod restarts in turn with an empty cache; 24 shared 3k-5k-token prefixes, 10 req/s"
    default_profile = "codellama-13b-a100"
    default_pods = 8
    qps = 10.0
    groups = 24
    prefix_tokens = (3072, 5120)
    zipf_s = 0.6
    query_tokens = (64, 512)
    output_tokens = (64, 256)
    # A container's restart until it serves again. vLLM loading a 13B model from local disk takes
    # longer; what a router shows here is how it treats a pod while it is down and once it is back.
    down_s = 20.0

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        rng = self.rng("prefixes")
        self.prefixes = [token_ids(rng, rng.randint(*self.prefix_tokens)) for _ in range(self.groups)]
        self.weights = zipf_weights(self.groups, self.zipf_s)
        # Every pod in turn, in a seeded order, from 20% of the run to 80% (the caches are warm
        # before the first, and the last has time to show what its router does after it), at
        # most two down at once: Kubernetes' default maxUnavailable, 25% of 8 pods. A short run
        # shortens the time down so that the last pod is back before the end.
        order = list(range(fleet.pods))
        self.rng("restarts").shuffle(order)
        first, last = 0.2 * self.duration, 0.8 * self.duration
        gap = (last - first) / max(len(order) - 1, 1)
        down = min(self.down_s, 2 * gap, 0.19 * self.duration)
        self.pod_restarts = tuple((first + k * gap, pod, down) for k, pod in enumerate(order))


HARD_WORKLOADS = (KVPressure, LongRag, Agentic, BurstyTenants, MixedFleet, RollingRestart)
