"""What a pod's own /metrics says about its requests, as observations for the latency scorers.

vLLM keeps histograms of every token's inter-token latency, of every finished request's decode
time (first token to the end) and of every request's time to first token (from its arrival). Their
`_sum` and `_count` grow with each request the pod serves, whoever routed it; epp scrapes the page
every 50 ms anyway (`LatencyTotals`). Between two scrapes of a pod, the growth is the mean time per
token of the tokens made meanwhile, the mean decode time of the requests finished meanwhile and
the mean TTFT of the first tokens made meanwhile. `predicted-ttft-scorer` learns the mean decode
time from it, which it otherwise learns only from the responses epp reads through (one in many
behind epp's own gateway config: the Director's response sampling); `request-latency-scorer`
learns how each pod's per-token time differs from the others' (its step factor).

The mean TTFT teaches `predicted-ttft-scorer` each pod's prefill rate when few of its responses
pass through epp (`FirstTokens`). That rate is fitted to pairs of a TTFT and the prefill work it
waited for (the work queued ahead at routing time plus the request's own), and the histogram has
no such pairs: epp pairs the window's mean TTFT with the mean work of its own requests to that pod
whose predicted first token fell in the window, i.e. those it expects the histogram just counted.
A window weighs as the requests it pairs. It is used only for a pod most of whose recent
responses taught nothing (completed without a TTFT: their bodies skipped epp); where responses
teach (GIE's config reads every one), the exact pairs are better and the window is not used.

The prefill histograms are not used: they time the compute alone, which is not the rate those
scorers' TTFT model needs (module docstring of `predicted_ttft_scorer`).

`ScrapedLatency.growth` hands out one pod's growth at most every `window` seconds (by the
scrapes' own times), so that a fleet's pods do not flood a learner whose step weight or
forgetting counts observations, and only when a token was made or a request finished meanwhile.
A pod whose totals shrink restarted: its next growth starts from the new totals.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Final

from epp.datastore.endpoints import Endpoint, LatencyTotals


@dataclasses.dataclass(frozen=True, slots=True)
class Growth:
    """One pod's latency totals' growth between two of its scrapes."""

    seconds: float  # between the two scrapes
    token_seconds: float
    tokens: float
    decode_seconds: float
    decodes: float
    ttft_seconds: float = 0.0
    ttfts: float = 0.0  # first tokens made meanwhile (0: the page has no TTFT histogram)


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
        if now.tokens < before.tokens or now.decodes < before.decodes or now.ttfts < before.ttfts:
            self._last[ep.name] = (m.updated_at, now)  # restarted
            return None
        if now.tokens == before.tokens and now.decodes == before.decodes:
            # Idle (first tokens alone, a pod's long prefills, wait for the next token made):
            # the next growth spans this time too, which adds nothing.
            return None
        self._last[ep.name] = (m.updated_at, now)
        return Growth(
            seconds,
            now.token_seconds - before.token_seconds,
            now.tokens - before.tokens,
            now.decode_seconds - before.decode_seconds,
            now.decodes - before.decodes,
            now.ttft_seconds - before.ttft_seconds,
            now.ttfts - before.ttfts,
        )

    def forget(self, name: str) -> None:
        self._last.pop(name, None)


@dataclasses.dataclass(frozen=True, slots=True)
class FirstTokenSample:
    """One pod's window: its mean TTFT against the mean of what epp predicted from."""

    ttft: float  # the pod's mean time to first token over the window (all its requests)
    tokens: float  # mean prefill work of epp's requests due meanwhile: queued ahead + their own
    decodes: int  # mean running requests beside them at routing time
    requests: int  # how many of epp's requests that mean is over


MAX_DUE: Final = 4096
"""Requests awaiting their first token kept per pod (past it the soonest due go: a pod with no
TTFT histogram keeps the last ones)."""
USABLE_SHARE: Final = 0.8
"""A window is used when at least this share of its requests' TTFT is the prefill rate's: not a
wait for KV blocks, nor another pod's prefill (P/D), which the response path skips too."""


class FirstTokens:
    """epp's own requests on each pod, in the order their first token is predicted, until a TTFT
    histogram growth takes them (`sample`): the pairing of the module docstring."""

    def __init__(self) -> None:
        # Per pod, a heap by predicted first token: (when, tokens, decodes, usable).
        self._due: dict[str, list[tuple[float, float, int, bool]]] = {}
        self._completed: dict[str, list[int]] = {}  # since the last window: [taught, untaught]
        self._blind: dict[str, bool] = {}  # most responses taught nothing, as of the last window with any

    def routed(self, pod: str, first_token_at: float, tokens: float, decodes: int, usable: bool) -> None:
        """A request routed to `pod`, its first token predicted at `first_token_at` after
        `tokens` of prefill beside `decodes` running; `usable` False: its TTFT is not the pod's
        prefill rate (a KV-block wait, a remote prefill)."""
        due = self._due.get(pod)
        if due is None:
            due = self._due[pod] = []
        heapq.heappush(due, (first_token_at, tokens, decodes, usable))
        if len(due) > MAX_DUE:
            heapq.heappop(due)

    def completed(self, pod: str, taught: bool) -> None:
        """A response from `pod` completed; `taught`: it carried its TTFT (read through epp)."""
        counts = self._completed.get(pod)
        if counts is None:
            counts = self._completed[pod] = [0, 0]
        counts[0 if taught else 1] += 1

    def sample(self, pod: str, growth: Growth, at: float) -> FirstTokenSample | None:
        """The window ending at `at` (the scrape's time) for `pod`: its requests predicted to have
        had their first token by then leave the queue; None when the page has no TTFT histogram,
        none of epp's requests was due, most of the pod's responses taught (or none has completed
        yet), or too few requests are the prefill rate's (`USABLE_SHARE`)."""
        counts = self._completed.pop(pod, None)
        if counts is not None:
            self._blind[pod] = counts[1] > counts[0]
        due = self._due.get(pod)
        taken: list[tuple[float, float, int, bool]] = []
        while due and due[0][0] <= at:
            taken.append(heapq.heappop(due))
        if growth.ttfts < 1.0 or not taken or not self._blind.get(pod, False):
            return None
        usable = [t for t in taken if t[3]]
        if len(usable) < USABLE_SHARE * len(taken):
            return None
        n = len(usable)
        return FirstTokenSample(
            growth.ttft_seconds / growth.ttfts,
            sum(t[1] for t in usable) / n,
            round(sum(t[2] for t in usable) / n),
            n,
        )

    def forget(self, pod: str) -> None:
        self._due.pop(pod, None)
        self._completed.pop(pod, None)
        self._blind.pop(pod, None)
