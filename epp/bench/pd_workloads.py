"""`epp bench pd`'s workloads: long prompts with short answers, long answers from short prompts,
and a mix with shared prefixes (Poisson arrivals; `load` multiplies the rate)."""

from __future__ import annotations

import random
from typing import Final

from epp.bench.workload import Fleet, PoissonMix, Prompt, token_ids

PROFILE: Final = "llama-3.1-70b-h100"
PODS: Final = 8


class _PDWorkload(PoissonMix):
    default_profile = PROFILE
    default_pods = PODS
    seconds = 120.0

    def __init__(self, *, seed: int, scale: float, fleet: Fleet, load: float = 1.0) -> None:
        self.qps = type(self).qps * load  # PoissonMix's stage runs at this rate
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        rng = self.rng("prefixes")
        self.prefixes = [token_ids(rng, 4096) for _ in range(8)]

    def long_prompt(self, rng: random.Random, stage: int, shared: float) -> Prompt:
        """3k-8k tokens, 16-128 out; a `shared` share starts with one of 8 4k-token prefixes."""
        if rng.random() < shared:
            g = rng.randrange(len(self.prefixes))
            prefix = self.prefixes[g]
            tail = token_ids(rng, rng.randint(256, 4096))
            return Prompt([*prefix, *tail], rng.randint(16, 128), f"prefix-{g}", len(prefix), stage)
        return Prompt(token_ids(rng, rng.randint(3072, 8192)), rng.randint(16, 128), "", 0, stage)

    def long_answer(self, rng: random.Random, stage: int) -> Prompt:
        """256-1k tokens, 512-1,536 out."""
        return Prompt(token_ids(rng, rng.randint(256, 1024)), rng.randint(512, 1536), "", 0, stage)


class LongPrompt(_PDWorkload):
    name = "pd-long-prompt"
    description = "3k-8k-token prompts (20% on 8 shared 4k prefixes), 16-128 tokens out; Poisson"
    qps = 7.0

    def prompt(self, rng: random.Random, stage: int) -> Prompt:
        return self.long_prompt(rng, stage, 0.2)


class LongAnswer(_PDWorkload):
    name = "pd-long-answer"
    description = "256-1k-token prompts, 512-1,536 tokens out; Poisson"
    qps = 6.0

    def prompt(self, rng: random.Random, stage: int) -> Prompt:
        return self.long_answer(rng, stage)


class Mixed(_PDWorkload):
    name = "pd-mixed"
    description = "half long prompts (50% on 8 shared 4k prefixes), half long answers; Poisson"
    qps = 5.0

    def prompt(self, rng: random.Random, stage: int) -> Prompt:
        if rng.random() < 0.5:
            return self.long_prompt(rng, stage, 0.5)
        return self.long_answer(rng, stage)


PD_WORKLOADS: Final[dict[str, type[_PDWorkload]]] = {w.name: w for w in (LongPrompt, LongAnswer, Mixed)}
