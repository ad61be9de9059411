"""Fixtures for the tokenizer tests: closing `Tokenizers` after a test, and a check that no
tokenizer worker thread outlives its test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from epp.tokenize import registry, tokenizer


def _workers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("epp-tokenize")]


@pytest.fixture(autouse=True)
def no_leaked_workers() -> Iterator[None]:
    before = set(_workers())
    yield
    left = set(_workers()) - before
    assert not left, f"tokenizer worker threads left running: {sorted(left)}"


@pytest.fixture(scope="session")
def shipped() -> tokenizer.Tokenizer:
    return tokenizer.load_shipped()


@pytest.fixture
def track() -> Iterator[Callable[[registry.Tokenizers], registry.Tokenizers]]:
    """`track(Tokenizers(...))` returns its argument and closes it after the test."""
    made: list[registry.Tokenizers] = []

    def add(toks: registry.Tokenizers) -> registry.Tokenizers:
        made.append(toks)
        return toks

    yield add
    for toks in made:
        toks.close()
