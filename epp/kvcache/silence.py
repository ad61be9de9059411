"""Whether a pod epp sends work to publishes KV events at all (`Silence`): one per feed, checked
by the ingester as it routes tokens there (`epp.kvcache.ingest`)."""

from __future__ import annotations

from typing import Final

SILENCE_MIN_TOKENS: Final = 1024
"""Prompt tokens routed to a pod without a KV event before its silence counts: every request this
long fills blocks at any vLLM block size, so a publishing vLLM has stored (and announced) some."""


class Silence:
    """Whether a pod that is sent work has published nothing (its KV events are lost: vLLM without
    --kv-events-config, a wrong endpoint or port, a publisher on another topic...). vLLM publishes
    only when it stores blocks, so an idle pod is silent by right: the clock starts once
    `SILENCE_MIN_TOKENS` prompt tokens were routed to it, and the pod is silent `grace` seconds
    later if still nothing came. One warning per silence, and a gauge."""

    __slots__ = ("_base", "_since", "silent")

    def __init__(self) -> None:
        self._base: int | None = None  # the pod's routed tokens when it was first checked
        self._since: float | None = None  # when those passed SILENCE_MIN_TOKENS
        self.silent = False

    def check(self, now: float, routed_tokens: int, published: bool, grace: float) -> bool | None:
        """Update with the pod's state; True when it has just become silent, False when a silent
        pod has just published, else None."""
        if published:
            was, self.silent = self.silent, False
            return False if was else None
        if self._base is None or routed_tokens < self._base:  # first check, or a new endpoint
            self._base = routed_tokens
        if routed_tokens - self._base < SILENCE_MIN_TOKENS:
            return None
        if self._since is None:
            self._since = now
        if not self.silent and now - self._since >= grace:
            self.silent = True
            return True
        return None

    def routed_since(self, routed_tokens: int) -> int:
        return routed_tokens - (self._base or 0)
