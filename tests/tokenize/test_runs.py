"""`FastEngine.takes`'s run rule in C (epp/tokenize/_runs.c) against its Python form, kept here as
the oracle: the form epp used before, str.split() and three regexes, whose character classes are
CPython's own. Hypothesis draws texts from the characters where the classes differ (ASCII and
Unicode spaces, the \\x1c-\\x1f separators, '_', digits that are numeric but not decimal, letters,
marks, punctuation, CJK, emoji) in runs around both limits."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.tokenize import _runs, tokenizer

RUN = tokenizer.MAX_RUN_CHARS
ASCII_RUN = tokenizer.MAX_ASCII_RUN_CHARS
_LONG_WORDS = re.compile(rf"\w{{{RUN + 1}}}|(?:[^\w\s]|[_\x1c-\x1f]){{{RUN + 1}}}")
_LONG_ASCII_WORDS = re.compile(rf"[A-Za-z0-9]{{{ASCII_RUN + 1}}}|[^A-Za-z0-9]{{{ASCII_RUN + 1}}}")
_LONG_SPACE = re.compile(rf"\s{{{RUN + 1}}}")


def oracle(text: str) -> bool:
    """The rule as Python said it: no whitespace run over RUN; every word over RUN characters
    without a run over RUN of \\w or of the rest ('_' in both), or, all ASCII, without a run over
    ASCII_RUN of [A-Za-z0-9] or of the rest once it is over ASCII_RUN."""
    if _LONG_SPACE.search(text):
        return False
    for word in text.split():
        if len(word) > RUN:
            if word.isascii():
                if len(word) > ASCII_RUN and _LONG_ASCII_WORDS.search(word):
                    return False
            elif _LONG_WORDS.search(word):
                return False
    return True


def fits(text: str, start: int = 0) -> bool:
    return _runs.fits(text, start, RUN, ASCII_RUN)


KINDS = [
    "a",
    "Z",
    "7",
    "_",
    "-",
    ".",
    "/",
    " ",
    "\t",
    "\n",
    "\x1c",
    "\x1f",
    "\x85",
    "\xa0",
    "\u2003",
    "\u3000",
    "é",
    "ß",
    "²",  # numeric, isalnum, not decimal
    "Ⅻ",  # a Roman numeral letter
    "\u0301",  # a combining mark: not alnum
    "中",
    "ـ",  # Arabic tatweel: a modifier letter
    "·",
    "😀",
    "\x00",
    "\x7f",
]
LENGTHS = [1, 2, RUN - 1, RUN, RUN + 1, ASCII_RUN, ASCII_RUN + 1]
_runs_of = st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(LENGTHS)), max_size=8)


@settings(max_examples=3000, deadline=None)
@given(_runs_of, st.integers(min_value=0, max_value=40))
def test_the_c_rule_is_the_python_rule(parts: list[tuple[str, int]], start: int) -> None:
    text = "".join(kind * n for kind, n in parts)
    assert fits(text) == oracle(text), [(k, n) for k, n in parts]
    assert fits(text, start) == oracle(text[start:])


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=300))
def test_the_c_rule_is_the_python_rule_on_any_text(text: str) -> None:
    assert fits(text) == oracle(text)


def test_limits_exactly() -> None:
    for unit, limit in (("x", ASCII_RUN), ("é", RUN), ("-", ASCII_RUN)):
        assert fits(f"a {unit * limit} b"), repr(unit)
        assert not fits(f"a {unit * (limit + 1)} b"), repr(unit)
    for space in (" ", "\u2003", "\x1c"):
        assert fits(f"a{space * RUN}b"), repr(space)
        assert not fits(f"a{space * (RUN + 1)}b"), repr(space)
    word = "é" + "x" * (RUN + 5)  # one non-ASCII letter: the word takes the Unicode limits
    assert not fits(word) and oracle(word) is False
    assert fits("é" + "x-" * 100)  # a long word of short runs
    assert fits("") and fits("   ") and fits("abc", 10)
