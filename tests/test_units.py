from __future__ import annotations

import argparse

import pytest

from epp import flags
from epp.units import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("200ms", 0.2), ("1.5s", 1.5), ("1m30s", 90.0), ("250us", 250e-6), ("2h", 7200.0), (".5s", 0.5)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)
    assert flags.duration(text) == pytest.approx(seconds)


def test_a_bare_number_is_seconds_on_flags_only() -> None:
    assert flags.duration("3") == 3.0
    assert parse_duration("0.25", bare_seconds=True) == 0.25
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("3")


@pytest.mark.parametrize("text", ["", "ms", "1x", "1s2", "-1s", "1 s"])
def test_garbage_is_refused_with_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)
    with pytest.raises(argparse.ArgumentTypeError):
        flags.duration(text)
