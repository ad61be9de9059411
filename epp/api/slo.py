"""Per-request latency targets: the `x-slo-ttft-ms` and `x-slo-tpot-ms` request headers.

The names, the unit (milliseconds) and "0 means no target" are llm-d's (its predicted-latency
plugins read the same two headers), so a client written for llm-d's SLO-aware routing sends the
same thing here. The values become `InferenceRequest.slo_ttft` / `slo_tpot` in seconds;
`request-latency-scorer` prefers the candidates predicted to meet them
([docs/slo.md](../../docs/slo.md)).

Unlike llm-d, which ignores a value it cannot parse (debug log, no target), a bad value here is
a 400 naming the header: a client that sets a target it believes is enforced learns that it was
not. Accepted: a plain decimal number of milliseconds (`250`, `12.5`, `1e3`), surrounding spaces
ignored, from 0 to one hour. Refused: anything else (empty, `nan`, `inf`, `-5`, `1_000`, `0x10`,
`250ms`), and values above an hour (3,600,000 ms), which no interactive target means.

GIE's InferenceObjective (`inference.networking.x-k8s.io/v1alpha2`) carries only a priority and
its pool, no latency targets, so headers are the only source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from epp.api.errors import BadRequest

TTFT_HEADER: Final = "x-slo-ttft-ms"
TPOT_HEADER: Final = "x-slo-tpot-ms"
MAX_MS: Final = 3_600_000.0
"""The largest target accepted (one hour, in milliseconds)."""

# What Python's float() accepts minus what no client means: signs, underscores, inf/nan, hex.
_NUMBER: Final = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def parse_targets(headers: Mapping[str, str]) -> tuple[float | None, float | None]:
    """(TTFT target, TPOT target) in seconds from the request's lower-cased headers; None where
    the header is absent or 0. Raises `BadRequest` for a value that is not a target."""
    ttft = headers.get(TTFT_HEADER)
    tpot = headers.get(TPOT_HEADER)
    if ttft is None and tpot is None:  # the common case: two lookups, nothing else
        return None, None
    return _seconds(TTFT_HEADER, ttft), _seconds(TPOT_HEADER, tpot)


def _seconds(name: str, raw: str | None) -> float | None:
    if raw is None:
        return None
    text = raw.strip()
    shown = text if len(text) <= 40 else text[:40] + "..."
    if not _NUMBER.fullmatch(text):
        if text.startswith("-") and _NUMBER.fullmatch(text[1:]):
            raise BadRequest(f"header {name} must not be negative, got {shown!r}")
        raise BadRequest(f"header {name} must be a number of milliseconds, got {shown!r}")
    ms = float(text)  # the pattern admits only finite decimals; "1e999" is inf, refused below
    if not ms <= MAX_MS:
        raise BadRequest(f"header {name} must be at most {MAX_MS:.0f} ms (one hour), got {shown}")
    return ms / 1000.0 if ms > 0.0 else None
