"""What a soak is told (SoakConfig), what it records (Record, Fault), and when faults start."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

MODEL = "sim-model"
FAULTS = ("pod_kill", "publisher_drop", "scrape_hang", "epp_sigterm")


@dataclasses.dataclass
class SoakConfig:
    out: Path
    duration: float = 3600.0
    rate: float = 20.0  # requests per second, Poisson arrivals
    pods: int = 3
    warmup: float = 120.0  # RSS slope and p99 drift ignore this much
    fault_every: float = 300.0
    fault_duration: float = 20.0
    grace: float = 10.0  # after a fault ends, failures still count as the fault's
    faults: tuple[str, ...] = FAULTS
    time_scale: float = 0.05  # the sims' wall seconds per simulated second
    max_tokens: int = 16
    sample_every: float = 2.0  # RSS and epp metrics
    tracemalloc_every: float = 0.0  # 0: off
    epp_args: tuple[str, ...] = ()
    seed: int = 1
    attack_rate: float = 0.0  # client attacks a second (epp.bench.soak.attacks); 0: none


@dataclasses.dataclass
class Fault:
    kind: str
    start: float  # seconds since the soak began
    end: float = math.nan  # when the fault was lifted (restart issued, proxy resumed)
    target: str = ""  # pod address or epp name
    ready: float = math.nan  # pod_kill/epp_sigterm: when the restarted process answered


@dataclasses.dataclass(slots=True)
class Record:
    t: float
    latency: float
    status: int  # 0: no HTTP answer
    pod: str
    error: str = ""


def fault_schedule(cfg: SoakConfig) -> list[tuple[float, str]]:
    """(start, kind) pairs: rotating kinds, every `fault_every` from the end of the warm-up, each
    ending (with its grace) before the soak does."""
    out: list[tuple[float, str]] = []
    t, i = cfg.warmup, 0
    while cfg.faults and t + cfg.fault_duration + cfg.grace <= cfg.duration:
        out.append((t, cfg.faults[i % len(cfg.faults)]))
        t += cfg.fault_every
        i += 1
    return out
