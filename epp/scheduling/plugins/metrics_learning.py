"""What a pod's own /metrics says about its decode, as observations for the latency scorers.

vLLM keeps histograms of every token's inter-token latency and of every finished request's decode
time (first token to the end). Their `_sum` and `_count` grow with each request the pod serves,
whoever routed it; epp scrapes the page every 50 ms anyway (`LatencyTotals`). Between two scrapes
of a pod, the growth is the mean time per token of the tokens made meanwhile and the mean decode
time of the requests finished meanwhile. `predicted-ttft-scorer` learns the mean decode time from
it, which it otherwise learns only from the responses epp reads through (one in many behind epp's
own gateway config: the Director's response sampling); `request-latency-scorer` learns how each
pod's per-token time differs from the others' (its step factor).

The prefill histograms are not used: they time the compute alone, which is not the rate those
scorers' TTFT model needs (module docstring of `predicted_ttft_scorer`).

`ScrapedLatency.growth` hands out one pod's growth at most every `window` seconds (by the
scrapes' own times), so that a fleet's pods do not flood a learner whose step weight or
forgetting counts observations, and only when a token was made or a request finished meanwhile.
A pod whose totals shrink restarted: its next growth starts from the new totals.
"""

from __future__ import annotations

import dataclasses

from epp.datastore.endpoints import Endpoint, LatencyTotals


@dataclasses.dataclass(frozen=True, slots=True)
class Growth:
    """One pod's latency totals' growth between two of its scrapes."""

    seconds: float  # between the two scrapes
    token_seconds: float
    tokens: float
    decode_seconds: float
    decodes: float


class ScrapedLatency:
    """Per endpoint, the totals its last `growth` was measured from."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._last: dict[str, tuple[float, LatencyTotals]] = {}

    def growth(self, ep: Endpoint) -> Growth | None:
        """`ep`'s growth since the last one handed out (or since it was first seen), once `window`
        seconds of scrapes passed and it served something meanwhile; else None."""
        m = ep.metrics
        now = m.latency
        if now is None or m.updated_at <= 0.0:
            return None
        last = self._last.get(ep.name)
        if last is None:
            self._last[ep.name] = (m.updated_at, now)
            return None
        at, before = last
        seconds = m.updated_at - at
        if seconds < self.window:
            return None
        if now.tokens < before.tokens or now.decodes < before.decodes:  # restarted
            self._last[ep.name] = (m.updated_at, now)
            return None
        if now.tokens == before.tokens and now.decodes == before.decodes:
            return None  # idle: the next growth spans the idle time too, which adds nothing
        self._last[ep.name] = (m.updated_at, now)
        return Growth(
            seconds,
            now.token_seconds - before.token_seconds,
            now.tokens - before.tokens,
            now.decode_seconds - before.decode_seconds,
            now.decodes - before.decodes,
        )

    def forget(self, name: str) -> None:
        self._last.pop(name, None)
