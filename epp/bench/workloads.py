"""The named benchmark workloads (`epp bench --workload NAME`), each after a published benchmark.

- `seed-stress` (closed loop, 30 users; after Ranvier's stress runs, CodeLlama-13B on 8x A100): long
  shared system prompts (4k-16k tokens) plus short queries; sharing ratio 50%, 70%, 90%, 10 min each.
- `llm-d` (open loop, Poisson; after llm-d's precise-routing benchmark, "73-capacity"): 150 customers
  x 5 users, a 6,000-token context + a 1,200-token question, 200 output tokens (what the published
  run generated; its config asked 1,000, see `LlmD`); QPS ladder 3..60 after a 15-QPS warm-up.
- `hotspot` (open loop): 80% of requests on one 4k-token prefix, the rest over 31 others.
- `shared-prefix` (open loop): inference-perf's `shared_prefix` dataset (30 tenants x 10 users,
  2k-4k-token system prompts) at 20 req/s; `--client inference-perf` runs inference-perf itself.
- `unique` (open loop): no sharing at all, every prompt is new; `unique-saturating`: the same at
  a rate past the fleet's capacity.
- `chat` (closed loop, 48 users): conversations growing turn by turn on one of 8 app system prompts.

- `kv-pressure`, `rag`, `agentic`, `bursty`, `mixed-fleet` (`epp.bench.hard`): where routing is
  hard, each after a published trace or user report.

- `overload-3x`, `tenant-burst`, `tenant-steady`, `cold-start` (`epp.bench.overload`): overload,
  priority classes and tenants, and a cold start, for flow control (`--policies admission`).

`trace:<path.jsonl>` replays a user's own traffic (`epp.bench.trace`).

Sizes scale with the fleet where the published setup did: `seed-stress` sizes its number of shared
prefixes so that they fill about 55% of the fleet's KV cache (Ranvier's prefixes fit its fleet: its
precise routing reached 97.5%), and prompts always fit `max_model_len`. `llm-d` keeps the published
150 groups: on its default fleet (8 pods x 307,328 KV tokens) their prompts need 73% of the KV cache,
as published. `scale` stretches or shrinks every stage (0.01 for a smoke run).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from epp.bench.hard import HARD_WORKLOADS
from epp.bench.inference_perf import InferencePerfForm
from epp.bench.overload import OVERLOAD_WORKLOADS
from epp.bench.workload import (
    ClosedLoop,
    Fleet,
    OpenLoop,
    PoissonMix,
    Prompt,
    Workload,
    poisson_times,
    token_ids,
)


class SeedStress(ClosedLoop):
    name = "seed-stress"
    description = "30 closed-loop users, 4k-16k-token shared prompts, sharing 50/70/90% (Ranvier)"
    default_profile = "codellama-13b-a100"
    default_pods = 8
    users = 30
    prefix_tokens = (4096, 16384)
    query_tokens = (128, 512)
    output_tokens = (64, 256)
    think_s = (0.5, 1.5)
    kv_fill = 0.55  # share of the fleet's KV cache the shared prefixes take together
    max_groups = 50  # Ranvier's NUM_LARGE_PREFIXES

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        self.stages = self.scaled_stages([(f"share={s}", 600.0, None, s) for s in (0.5, 0.7, 0.9)])
        rng = self.rng("prefixes")
        room = fleet.max_model_len - self.query_tokens[1] - self.output_tokens[1] - 1
        lo, hi = min(self.prefix_tokens[0], room), min(self.prefix_tokens[1], room)
        budget = self.kv_fill * fleet.pods * fleet.kv_tokens_per_pod
        groups = max(2, min(self.max_groups, int(budget / ((lo + hi) / 2))))
        self.prefixes = [token_ids(rng, rng.randint(lo, hi)) for _ in range(groups)]
        self._rngs = [self.rng("user", u) for u in range(self.users)]

    def next_request(self, user: int, now: float) -> tuple[float, Prompt] | None:
        rng = self._rngs[user]
        t = now + (rng.uniform(*self.think_s) if now > 0 else rng.uniform(0, self.think_s[1]))
        if t >= self.duration:
            return None
        stage = self.stage_at(t)
        sharing = self.stages[stage].sharing or 0.0
        query = token_ids(rng, rng.randint(*self.query_tokens))
        max_tokens = rng.randint(*self.output_tokens)
        if rng.random() < sharing:
            g = rng.randrange(len(self.prefixes))
            prefix = self.prefixes[g]
            return t, Prompt([*prefix, *query], max_tokens, f"prefix-{g}", len(prefix), stage)
        return t, Prompt(query, max_tokens, "", 0, stage)


class LlmD(OpenLoop):
    name = "llm-d"
    description = "llm-d precise benchmark: 150 customers x 5 users, 6k context + 1.2k question, QPS 3..60"
    default_profile = "qwen3-32b-tp2-h100"
    default_pods = 8
    groups = 150
    users_per_group = 5
    system_tokens = 6000
    question_tokens = 1200
    # The published config asks for 1,000 output tokens, but its own measurements show ~200 were
    # generated: ~10k output tok/s at 35-60 completed req/s, and the config's note "observed live
    # ~200-230 tokens/running request". With 1,000 this fleet saturates at ~15 QPS under any policy
    # (every queue grows without bound past it), which the published precise run (p90 TTFT 0.5 s
    # at 60 QPS) rules out. So the observed length is what is replayed.
    output_tokens = 200
    # inference-perf stages of the published run (llm-d-kv-cache benchmarking/73-capacity):
    # a warm-up seating the working set, then the ladder.
    ladder = (
        ("warmup", 15.0, 50.0),
        *(
            (f"qps={q:g}", q, d)
            for q, d in (
                (3, 20), (10, 20), (15, 20), (20, 38), (22, 34), (25, 30), (30, 25), (35, 21),
                (40, 38), (43, 36), (46, 33), (49, 30), (52, 29), (55, 27), (57, 26), (60, 25),
            )
        ),
    )  # fmt: skip

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        self.stages = self.scaled_stages([(label, seconds, qps, 1.0) for label, qps, seconds in self.ladder])
        rng = self.rng("prompts")
        self.prompts: list[tuple[str, list[int]]] = []
        for g in range(self.groups):
            system = token_ids(rng, self.system_tokens)
            for _ in range(self.users_per_group):
                self.prompts.append((f"group-{g}", [*system, *token_ids(rng, self.question_tokens)]))

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        pick = self.rng("choices").randrange
        for t, stage in poisson_times(self.rng("arrivals"), self.stages):
            group, ids = self.prompts[pick(len(self.prompts))]
            yield t, Prompt(ids, self.output_tokens, group, self.system_tokens, stage)

    def kv_demand(self) -> float:
        """The share of the fleet's KV cache the distinct prompts need (the published 73%)."""
        tokens = self.groups * (self.system_tokens + self.users_per_group * self.question_tokens)
        return tokens / (self.fleet.pods * self.fleet.kv_tokens_per_pod)


class Hotspot(PoissonMix):
    name = "hotspot"
    description = "80% of requests on one 4k-token prefix, 20% over 31 others; Poisson arrivals"
    default_profile = "codellama-13b-a100"
    default_pods = 8
    qps = 6.0
    hot_share = 0.8
    groups = 32
    prefix_tokens = 4096
    query_tokens = (256, 1024)

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        rng = self.rng("prefixes")
        self.prefixes = [token_ids(rng, self.prefix_tokens) for _ in range(self.groups)]

    def prompt(self, rng: random.Random, stage: int) -> Prompt:
        g = 0 if rng.random() < self.hot_share else rng.randrange(1, self.groups)
        query = token_ids(rng, rng.randint(*self.query_tokens))
        prefix = self.prefixes[g]
        return Prompt([*prefix, *query], rng.randint(*self.output_tokens), f"prefix-{g}", len(prefix), stage)


class SharedPrefix(PoissonMix):
    """inference-perf's `shared_prefix` dataset as the peers were compared on it: 30 tenants, each
    a 2k-4k-token system prompt asked by 10 users, short questions; 20 req/s on 8 pods. With
    `--client inference-perf` the same shape is generated by inference-perf itself."""

    name = "shared-prefix"
    description = (
        "inference-perf's shared prefix: 30 tenants x 10 users, 2k-4k-token system prompts, 20 req/s"
    )
    default_profile = "codellama-13b-a100"
    default_pods = 8
    qps = 20.0
    seconds = 120.0
    groups = 30
    users_per_group = 10
    system_tokens = (2048, 4096)
    question_tokens = 128
    output_tokens = (128, 128)

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        rng = self.rng("prefixes")
        self.prompts: list[tuple[int, list[int]]] = []
        for g in range(self.groups):
            system = token_ids(rng, rng.randint(*self.system_tokens))
            for _ in range(self.users_per_group):
                self.prompts.append((g, [*system, *token_ids(rng, self.question_tokens)]))
        self.system_lengths = [
            len(p) - self.question_tokens for _, p in self.prompts[:: self.users_per_group]
        ]

    def prompt(self, rng: random.Random, stage: int) -> Prompt:
        g, ids = self.prompts[rng.randrange(len(self.prompts))]
        return Prompt(ids, self.output_tokens[0], f"prefix-{g}", self.system_lengths[g], stage)

    def inference_perf_form(self) -> InferencePerfForm:
        lo, hi = self.system_tokens
        return InferencePerfForm(
            data={
                "type": "shared_prefix",
                "shared_prefix": {
                    "num_groups": self.groups,
                    "num_prompts_per_group": self.users_per_group,
                    "system_prompt_len": {"type": "uniform", "min": lo, "max": hi, "mean": (lo + hi) / 2},
                    "question_len": self.question_tokens,
                    "output_len": self.output_tokens[0],
                },
            },
            stages=tuple((s.qps or 0.0, s.duration) for s in self.stages),
        )


class Unique(PoissonMix):
    name = "unique"
    description = "no sharing: every prompt (1k-4k tokens) is new; Poisson arrivals"
    default_profile = "codellama-13b-a100"
    default_pods = 8
    qps = 6.0
    prompt_tokens = (1024, 4096)

    def prompt(self, rng: random.Random, stage: int) -> Prompt:
        ids = token_ids(rng, rng.randint(*self.prompt_tokens))
        return Prompt(ids, rng.randint(*self.output_tokens), "", 0, stage)


class UniqueSaturating(Unique):
    """`unique` past the fleet's capacity, so routing shows in throughput: at 6 QPS the fleet
    finishes what arrives whatever the policy (output tok/s equals the offered load)."""

    name = "unique-saturating"
    description = "unique at 9 QPS, past the fleet's capacity: throughput differs by policy"
    qps = 9.0
    seconds = 300.0


class Chat(ClosedLoop):
    name = "chat"
    description = "48 users in multi-turn conversations (2-12 turns) on 8 app system prompts"
    default_profile = "codellama-13b-a100"
    default_pods = 8
    users = 48
    apps = 8
    system_tokens = 1500
    turns = (2, 12)
    user_tokens = (32, 512)
    output_tokens = (64, 512)
    think_mean_s = 5.0
    seconds = 1200.0

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        self.stages = self.scaled_stages([("chat", self.seconds, None, None)])
        rng = self.rng("apps")
        self.systems = [token_ids(rng, self.system_tokens) for _ in range(self.apps)]
        self._rngs = [self.rng("user", u) for u in range(self.users)]
        # Per user: (conversation label, history so far, turns left); history None = start anew.
        self._state: list[tuple[str, list[int] | None, int]] = [("", None, 0)] * self.users
        self._conversations = [0] * self.users

    def next_request(self, user: int, now: float) -> tuple[float, Prompt] | None:
        rng = self._rngs[user]
        t = now + rng.expovariate(1.0 / self.think_mean_s)
        if t >= self.duration:
            return None
        label, history, left = self._state[user]
        turn = token_ids(rng, rng.randint(*self.user_tokens))
        max_tokens = rng.randint(*self.output_tokens)
        fits = history is not None and len(history) + len(turn) + max_tokens < self.fleet.max_model_len
        if history is not None and left > 0 and fits:
            prompt, group, shared = [*history, *turn], label, len(history)
            left -= 1
        else:  # a new conversation on one of the apps' system prompts
            app = rng.randrange(self.apps)
            prompt, group, shared = [*self.systems[app], *turn], f"app-{app}", self.system_tokens
            self._conversations[user] += 1
            label = f"conv-{user}-{self._conversations[user]}"
            left = rng.randint(*self.turns) - 1
        # The engine generates exactly this reply, and the next turn's prompt carries it, so the
        # blocks of generated tokens the engine cached can hit, as with a real conversation.
        reply = token_ids(rng, max_tokens)
        self._state[user] = (label, [*prompt, *reply], left)
        return t, Prompt(prompt, max_tokens, group, shared, self.stage_at(t), reply)


WORKLOADS: dict[str, type[Workload]] = {
    w.name: w
    for w in (
        SeedStress,
        LlmD,
        Hotspot,
        SharedPrefix,
        Unique,
        UniqueSaturating,
        Chat,
        *HARD_WORKLOADS,
        *OVERLOAD_WORKLOADS,
    )
}
"""The synthetic workloads by name (`trace:<path>` is built by `epp.bench.trace`)."""
