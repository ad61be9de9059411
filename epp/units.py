"""Go-style durations, read the same way by command-line flags and plugin parameters.

GIE writes durations as Go does ("200ms", "1.5s", "1m30s"), in flags and in EndpointPickerConfig
parameters alike, so epp parses them in one place.
"""

from __future__ import annotations

import re

_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_BARE_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def parse_duration(text: str, *, bare_seconds: bool = False) -> float:
    """A Go duration string in seconds; ValueError if it is not one.

    `bare_seconds` also accepts a plain number as seconds (epp's flags always have; Go does not).
    """
    text = text.strip()
    if bare_seconds and _BARE_NUMBER.fullmatch(text):
        return float(text)
    parts = _GO_DURATION.findall(text)
    if not text or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"not a duration: {text!r} (use e.g. 200ms, 1s)")
    return sum(float(number) * _SECONDS[unit] for number, unit in parts)
