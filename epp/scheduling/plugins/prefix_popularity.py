"""Helpers of `predicted-ttft-scorer` and `request-latency-scorer`: a prompt prefix's recent
share of the traffic, the stable digest of a prompt's first block, and the rendezvous mix."""

from __future__ import annotations

import collections
import hashlib
import math
import struct
from collections.abc import Hashable
from typing import Final

from epp.api.requests import InferenceRequest
from epp.scheduling.plugins.precise_prefix_cache_scorer import DEFAULT_BLOCK_SIZE

MASK64: Final = (1 << 64) - 1


class Popularity:
    """Recent request counts (or weights) per key (a prompt prefix's first-block digest, or an
    endpoint), decaying exponentially with `window` seconds, and each key's share of the total
    decaying alike. Bounded: the least recently seen keys are forgotten first (no share worth
    knowing), and keys not seen for `HORIZON` windows are forgotten."""

    __slots__ = ("_counts", "_total", "_total_at", "_window")

    CAPACITY: Final = 100_000
    HORIZON: Final = 5.0  # windows

    def __init__(self, window: float) -> None:
        self._window = window
        self._counts: collections.OrderedDict[Hashable, tuple[float, float]] = collections.OrderedDict()
        self._total = 0.0
        self._total_at = 0.0

    def count(self, key: Hashable, now: float) -> float:
        held = self._counts.get(key)
        return held[0] * math.exp((held[1] - now) / self._window) if held is not None else 0.0

    def share(self, key: Hashable, now: float) -> float:
        """The share of the traffic the prefix would have with one more request of it."""
        held = self._counts.get(key)
        count = held[0] * math.exp((held[1] - now) / self._window) if held is not None else 0.0
        total = self._total * math.exp((self._total_at - now) / self._window)
        return (count + 1.0) / (total + 1.0)

    def add(self, key: Hashable, now: float, weight: float = 1.0) -> None:
        """Count `weight` (one request, or the tokens it writes) for `key` at `now`."""
        held = self._counts.pop(key, None)
        count = held[0] * math.exp((held[1] - now) / self._window) if held is not None else 0.0
        self._counts[key] = (count + weight, now)
        self._total = self._total * math.exp((self._total_at - now) / self._window) + weight
        self._total_at = now
        # Least recently seen first (add re-inserts): drop what is past the capacity, and what was
        # last seen HORIZON windows ago, its count under 1% of one request. With prompts new from
        # their first block the table then holds a few windows' worth, not CAPACITY.
        horizon = now - self.HORIZON * self._window
        counts = self._counts
        while counts and (len(counts) > self.CAPACITY or next(iter(counts.values()))[1] < horizon):
            counts.popitem(last=False)


def prompt_tokens(request: InferenceRequest) -> int:
    if request.token_ids:
        return len(request.token_ids)
    return request.prompt_tokens_estimate


def first_block_digest(request: InferenceRequest, block_size: int) -> int | None:
    """A 64-bit digest of the prompt's first block with the model and cache salt: stable across
    processes (blake2b, not the per-process `hash`). None for a request without a prompt."""
    h = hashlib.blake2b(digest_size=8)
    h.update(request.target_model.encode())
    h.update(b"\0" + (request.cache_salt or "").encode() + b"\0")
    ids = request.token_ids
    if ids:
        first = ids[: block_size or DEFAULT_BLOCK_SIZE]
        h.update(struct.pack(f"<{len(first)}q", *first))
    elif request.prompt_texts and request.prompt_texts[0]:
        h.update(request.prompt_texts[0][: (block_size or DEFAULT_BLOCK_SIZE) * 4].encode())
    else:
        return None
    return int.from_bytes(h.digest(), "little")


def mix64(x: int) -> int:
    """splitmix64's finaliser: spreads a 64-bit value so that the rendezvous maxima are uniform."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & MASK64
    return x ^ (x >> 31)
