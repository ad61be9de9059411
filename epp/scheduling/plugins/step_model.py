"""request-latency-scorer's step model: a pod's per-token time at a batch of `n` sequences over
`ctx` context tokens, `step(n, ctx) = a + b * n + c * ctx`, learned from completed responses."""

from __future__ import annotations

from typing import Final

PRIOR_VARIANCE: Final = 10.0
"""Of each (scaled) step coefficient: a few dozen responses outweigh the prior."""

# Regressors are scaled so that the three step coefficients are of similar size.
_N_SCALE: Final = 10.0
_CTX_SCALE: Final = 1e5


def step_at(coefficients: tuple[float, float, float], n: float, ctx: float) -> float:
    """`StepModel.step` at coefficients read beforehand (once per request when scoring)."""
    a, b, c = coefficients
    return a + b * n + c * ctx


class StepModel:
    """`step(n, ctx) = a + b * n + c * ctx`, fitted by recursive least squares with forgetting.

    The prior is `a = prior_step`, `b = c = 0`, with a variance that lets a few dozen observations
    move it. Coefficients are used clipped at 0 (a per-sequence or per-token cost is never
    negative), so a noisy fit cannot reward a bigger batch."""

    __slots__ = ("_lambda", "_p", "_theta", "seen")

    def __init__(self, prior_step: float, forgetting: float) -> None:
        self._theta = [prior_step, 0.0, 0.0]
        self._p = [[PRIOR_VARIANCE if i == j else 0.0 for j in range(3)] for i in range(3)]
        self._lambda = forgetting
        self.seen = 0

    @property
    def coefficients(self) -> tuple[float, float, float]:
        """(a seconds, b seconds per sequence, c seconds per context token), clipped at 0."""
        a, b, c = self._theta
        return max(a, 1e-4), max(b, 0.0) / _N_SCALE, max(c, 0.0) / _CTX_SCALE

    def step(self, n: float, ctx: float) -> float:
        return step_at(self.coefficients, n, ctx)

    def observe(self, n: float, ctx: float, tpot: float) -> None:
        x = (1.0, n / _N_SCALE, ctx / _CTX_SCALE)
        p, theta = self._p, self._theta
        px = [sum(p[i][j] * x[j] for j in range(3)) for i in range(3)]
        denom = self._lambda + sum(x[i] * px[i] for i in range(3))
        gain = [v / denom for v in px]
        error = tpot - sum(theta[i] * x[i] for i in range(3))
        for i in range(3):
            theta[i] += gain[i] * error
        for i in range(3):
            for j in range(3):
                p[i][j] = (p[i][j] - gain[i] * px[j]) / self._lambda
        self.seen += 1
