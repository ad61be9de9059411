"""Deterministic text for the vLLM suite's prompts: word soup for long prefixes, and the awkward
strings (whitespace runs, digits, Unicode, control-token look-alikes) tokenization must agree on."""

from __future__ import annotations

import random

_WORDS = (
    "the of and to in is that for it as with was on be by at this from or an are which not have "
    "but all were when we there can been has more if will one would other their what about so "
    "time only new some could these two may first then do any like my now over such our man me "
    "even most made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another know "
    "while last might us great old year off come since against go came right used take three "
    "garden rake shovel warranty invoice kernel socket buffer thread queue token prefix router "
    "endpoint cluster latency cache block replica gateway metric sample picker scorer filter"
)
WORDS = tuple(_WORDS.split())

ODD = (
    "  two  spaces  ",
    "tab\there",
    "new\nline\n\n",
    "12345678901234",
    "3.14159 and -42",
    "naïve café résumé",
    "日本語のテキスト",
    "emoji 👍🏽 🚀",
    "<s> looks like BOS",
    "</s> and <pad>",
    "{{ not jinja }}",
    '{"json": [1, 2, 3]}',
    "def f(x):\n    return x ** 2",
    "   ",
    "",
)


def sentence_soup(rng: random.Random, n_words: int) -> str:
    """`n_words` words in sentences of 6-14 words, capitalised and full-stopped."""
    out: list[str] = []
    left = n_words
    while left > 0:
        n = min(left, rng.randint(6, 14))
        words = [rng.choice(WORDS) for _ in range(n)]
        out.append(" ".join(words).capitalize() + ".")
        left -= n
    return " ".join(out)


def mixed_text(rng: random.Random, max_words: int = 40) -> str:
    """Word soup with, half of the time, an awkward string spliced in somewhere."""
    text = sentence_soup(rng, rng.randint(1, max_words))
    if rng.random() < 0.5:
        odd = rng.choice(ODD)
        cut = rng.randint(0, len(text))
        text = text[:cut] + odd + text[cut:]
    return text
