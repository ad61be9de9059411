"""Usage-limit policies: the saturation up to which each priority band may dispatch.

Each dispatch cycle the policy gets the pool's saturation and the bands' priorities, highest
first, and writes one ceiling per band into a buffer pre-filled with 1.0 (an unwritten entry
never gates). A band dispatches while saturation < its ceiling; the cycle stops at the first band
that may not (head-of-line blocking, so a lower band never takes capacity a higher one waits for).
Ceilings never rise from one band to the next lower one.

- `static-usage-limit-policy` (the default, threshold 1.0): one ceiling for every band.
- `soft-reflective-ceiling-policy`: no parameters. Band i of N has the reflective ceiling
  1 - i * saturation / (N - 1); the top band is never gated below saturation 1.0. A band under its
  reflective ceiling is open; at saturation >= 1.0 the others are closed; in between, the gated
  bands open together on one cycle in round(saturation / (1 - saturation)), so their dispatch rate
  falls smoothly as saturation rises.
- `priority-holdback-policy`: fixed ceilings from `maxCeiling` (top band) down to `minCeiling`
  (bottom band), spaced by rank (`domain: rank`) or by priority value (`domain: value`), `shape:
  linear`. A single band gets `maxCeiling`.
"""

from __future__ import annotations

from typing import Protocol


class UsageLimitPolicy(Protocol):
    type: str
    name: str

    def compute(self, saturation: float, priorities: list[int], ceilings: list[float]) -> None:
        """Write each band's ceiling into `ceilings` (same length as `priorities`, filled with 1.0)."""
        ...


class Static:
    type = "static-usage-limit-policy"

    def __init__(self, name: str, threshold: float = 1.0) -> None:
        self.name = name
        self.threshold = threshold

    def compute(self, saturation: float, priorities: list[int], ceilings: list[float]) -> None:
        for i in range(len(ceilings)):
            ceilings[i] = self.threshold


class SoftReflectiveCeiling:
    type = "soft-reflective-ceiling-policy"

    def __init__(self, name: str) -> None:
        self.name = name
        # One tick for every gated band, advanced once per cycle in the alternating regime: gated
        # bands open on the same cycles, so a lower one is never open while a higher one is shut.
        self.tick = 0

    def compute(self, saturation: float, priorities: list[int], ceilings: list[float]) -> None:
        n = len(priorities)
        if n <= 1:
            return
        is_open = False
        if 1.0 - saturation <= saturation < 1.0:
            period = max(1, round(saturation / (1.0 - saturation + 1e-9)))
            self.tick += 1
            is_open = self.tick % period == 0
        for i in range(1, n):
            reflective = 1.0 - i * saturation / (n - 1)
            if saturation < reflective:
                ceilings[i] = 1.0
            elif saturation >= 1.0:
                ceilings[i] = 0.0
            else:
                ceilings[i] = 1.0 if is_open else 0.0


class PriorityHoldback:
    type = "priority-holdback-policy"

    def __init__(
        self, name: str, *, min_ceiling: float, max_ceiling: float = 1.0, by_value: bool = False
    ) -> None:
        self.name = name
        self.min_ceiling = min_ceiling
        self.max_ceiling = max_ceiling
        self.by_value = by_value

    def compute(self, saturation: float, priorities: list[int], ceilings: list[float]) -> None:
        n = len(priorities)
        if n == 0:
            return
        lo, hi = self.min_ceiling, self.max_ceiling
        if n == 1:
            ceilings[0] = hi
            return
        if not self.by_value:
            for i in range(n):
                ceilings[i] = hi - i * (hi - lo) / (n - 1)
            return
        p_max, p_min = priorities[0], priorities[-1]
        if p_max == p_min:
            for i in range(n):
                ceilings[i] = hi
            return
        for i, p in enumerate(priorities):
            ceilings[i] = lo + (p - p_min) / (p_max - p_min) * (hi - lo)
