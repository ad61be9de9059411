"""What a benchmark workload is: requests in time, open loop or closed loop, in named stages.

A workload produces `Prompt`s (token ids, `max_tokens`, the prefix group the prompt belongs to and
how many of its leading tokens that group shares) at virtual times. Two shapes:

- open loop (`OpenLoop.arrivals`): arrival times fixed in advance (Poisson at each stage's QPS, or
  a trace's timestamps), whatever the fleet does; an overloaded fleet builds queues, as under a
  load generator such as inference-perf.
- closed loop (`ClosedLoop.next_request`): a fixed number of users, each sending its next request
  a think time after its previous one finished (locust, Ranvier's benchmark); load follows speed.

Stages name stretches of the run (`qps=20`, `share=0.9`) so that results can be reported per
stage: a QPS ladder or a sweep of sharing ratios is one continuous run, as the published
benchmarks ran them, with the caches carrying over from one stage to the next.

Determinism: every random draw comes from a `random.Random` seeded from the workload seed and a
name (`rng`); closed-loop users each own a stream, so a user's sequence of prompts is the same
under every policy even though the order in which users finish differs. Synthetic token ids are
random ids below `VOCAB` (no tokenizer needed; shared prefixes are shared lists, never copies).
"""

from __future__ import annotations

import abc
import array
import dataclasses
import random
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp.bench.inference_perf import InferencePerfForm

VOCAB = 32_000
"""Synthetic token ids lie in [0, VOCAB) (CodeLlama's and Llama-2's vocabulary size)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    """One request to send. `token_ids` may be shared with other prompts: never mutate it."""

    token_ids: Sequence[int]
    max_tokens: int
    group: str  # the prefix group (tenant, system prompt, conversation); "" = shares nothing
    shared_tokens: int  # leading tokens of the prompt that other prompts of `group` also send
    stage: int = 0  # index into the workload's `stages`
    # The tokens the engine is to generate (a chat turn's reply, which the next turn's prompt
    # carries); None = the engine's filler tokens.
    output_token_ids: Sequence[int] | None = None
    # Its InferenceObjective's priority (sent as an objective named `priority-<n>`; negative is
    # sheddable) and its flow-control fairness ID (a tenant, a program; "" = none).
    priority: int = 0
    fairness_id: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Stage:
    """A named stretch of the run, [start, end) in seconds of virtual time."""

    label: str
    start: float
    end: float
    qps: float | None = None  # offered rate (open loop)
    sharing: float | None = None  # fraction of requests carrying a shared prefix

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclasses.dataclass(frozen=True, slots=True)
class Fleet:
    """What a workload is sized against: the pods and the KV capacity of each."""

    pods: int
    kv_tokens_per_pod: int  # num_gpu_blocks * block_size
    max_model_len: int


class Workload(abc.ABC):  # noqa: B024  (abstract through OpenLoop / ClosedLoop)
    """A seeded workload. Build a fresh one for each run: it holds its random state."""

    name: str = ""
    description: str = ""
    default_profile: str = ""
    default_pods: int = 0
    # Seconds (of the workload's time) at which the fleet's pods come up; None: up from the start
    # (a cold start from zero pods otherwise: requests before it find an empty pool).
    pods_ready_at: float | None = None
    # A mixed fleet: each pod's profile name (one block size for all), unless --profile or --pods
    # asks for a uniform one; `default_profile` is then the first of them, for sizing and the SLO.
    pod_profiles: tuple[str, ...] | None = None
    # How many times the workload's own rate its arrivals come at (`AtLoad`).
    load: float = 1.0
    # Pods that restart during the run: (second, pod index, seconds down). The pod stops (its
    # requests in flight fail, its port refuses connections), then comes back on the same address
    # with an empty prefix cache and its KV-event sequence starting again: a container restart.
    pod_restarts: tuple[tuple[float, int, float], ...] = ()

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.seed = seed
        self.scale = scale
        self.fleet = fleet
        self.stages: list[Stage] = []

    def inference_perf_form(self) -> InferencePerfForm:
        """The workload as kubernetes-sigs' inference-perf generates it (`--client
        inference-perf`); only workloads with such a form override this."""
        raise NotImplementedError(f"workload {self.name!r} has no inference-perf form")

    def rng(self, *names: object) -> random.Random:
        """An independent random stream for `names` (str seeds hash with SHA-512: the same in
        every process)."""
        return random.Random(":".join(str(n) for n in (self.name, self.seed, *names)))

    @property
    def duration(self) -> float:
        """Seconds of virtual time during which requests start (the run then drains)."""
        return self.stages[-1].end if self.stages else 0.0

    def stage_at(self, t: float) -> int:
        """The index of the stage `t` falls in (the last one for t past the end)."""
        for i, stage in enumerate(self.stages):
            if t < stage.end:
                return i
        return len(self.stages) - 1

    def scaled_stages(self, spec: Sequence[tuple[str, float, float | None, float | None]]) -> list[Stage]:
        """Stages from (label, nominal seconds, qps, sharing), durations multiplied by `scale`."""
        stages: list[Stage] = []
        t = 0.0
        for label, seconds, qps, sharing in spec:
            end = t + seconds * self.scale
            stages.append(Stage(label, t, end, qps, sharing))
            t = end
        return stages


class OpenLoop(Workload):
    """Arrivals at times fixed in advance."""

    @abc.abstractmethod
    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        """(time, prompt) in time order, lazily (a long run never holds every prompt at once)."""


class PoissonMix(OpenLoop):
    """Poisson arrivals at one QPS for `seconds`; subclasses choose each prompt."""

    qps = 1.0
    seconds = 600.0
    output_tokens = (128, 512)

    def __init__(self, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        self.stages = self.scaled_stages([(f"qps={self.qps:g}", self.seconds, self.qps, None)])

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        rng = self.rng("prompts")
        for t, stage in poisson_times(self.rng("arrivals"), self.stages):
            yield t, self.prompt(rng, stage)

    def prompt(self, rng: random.Random, stage: int) -> Prompt:
        raise NotImplementedError


class AtLoad(OpenLoop):
    """An open-loop workload at `load` times its rate: the same requests, each arriving at its
    time divided by `load` (`epp bench --load`).

    Compressing time rather than drawing new arrivals keeps every request, its prompt and its
    order as at load 1, so two loads differ only in how close together the requests come, bursts
    and quiet spells included. Stages keep their labels; their times shrink and their rates grow
    by `load`, and a cold start's pods come up at `pods_ready_at / load` (restarts likewise).
    """

    def __init__(self, inner: OpenLoop, load: float) -> None:
        if not load > 0:
            raise ValueError(f"load must be > 0, got {load}")
        super().__init__(seed=inner.seed, scale=inner.scale, fleet=inner.fleet)
        self.inner = inner
        self.load = load
        self.name = inner.name
        self.description = f"{inner.description}; at {load:g}x its rate"
        self.default_profile = inner.default_profile
        self.default_pods = inner.default_pods
        self.pod_profiles = inner.pod_profiles
        self.pods_ready_at = None if inner.pods_ready_at is None else inner.pods_ready_at / load
        self.pod_restarts = tuple((t / load, pod, down / load) for t, pod, down in inner.pod_restarts)
        self.stages = [
            Stage(s.label, s.start / load, s.end / load, None if s.qps is None else s.qps * load, s.sharing)
            for s in inner.stages
        ]

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        load = self.load
        return ((t / load, prompt) for t, prompt in self.inner.arrivals())

    def inference_perf_form(self) -> InferencePerfForm:
        form = self.inner.inference_perf_form()
        return dataclasses.replace(
            form, stages=tuple((rate * self.load, seconds / self.load) for rate, seconds in form.stages)
        )


class ClosedLoop(Workload):
    """`users` users, each sending a request, waiting for it, thinking, and sending the next."""

    users: int = 0

    @classmethod
    def at_load(cls, load: float) -> type[ClosedLoop]:
        """This workload with `load` times its users, at least one (`epp bench --load`): a closed
        loop's rate follows the fleet, so more load is more users. Users keep their own seeded
        streams, so the first `users` behave as at load 1 for as long as the fleet keeps pace."""
        if not load > 0:
            raise ValueError(f"load must be > 0, got {load}")
        users = max(1, round(cls.users * load))
        description = f"{cls.description}; {users} users ({load:g}x)"
        return type(cls.__name__, (cls,), {"users": users, "load": load, "description": description})

    @abc.abstractmethod
    def next_request(self, user: int, now: float) -> tuple[float, Prompt] | None:
        """User `user`'s next request and when it is sent (>= now), or None once the user stops
        (past `duration`). Called at time 0 for the first request, then when the last one ended."""


def token_ids(rng: random.Random, n: int) -> list[int]:
    """`n` random token ids in [0, VOCAB).

    From random bytes read as uint16 (little-endian on every machine, so a seed gives the same ids
    everywhere), reduced mod VOCAB: ~10x faster than `randrange` per id; ids below 65536 - 2 *
    VOCAB come up 3 times in 65536 instead of 2, which no routing decision can notice.
    """
    raw = array.array("H", rng.randbytes(2 * n))
    if sys.byteorder == "big":
        raw.byteswap()
    return [x % VOCAB for x in raw]


def poisson_times(rng: random.Random, stages: Sequence[Stage]) -> Iterator[tuple[float, int]]:
    """Poisson arrival times at each stage's `qps`, with the index of the stage."""
    for i, stage in enumerate(stages):
        if not stage.qps:
            continue
        t = stage.start
        while True:
            t += rng.expovariate(stage.qps)
            if t >= stage.end:
                break
            yield t, i
