"""Where a text's tokens provably split, read from the text alone, for the fast engine's pieces.

The prefix cache stores a text in chunks that end where a pre-token and a token start. With
`tokenizers` those places come from an encoding's offsets and word ids; fastokens gives ids only.
This module finds such places without an encoding, for the tokenizers most models ship, so a long
text can be encoded by fastokens in pieces that are also its chunks: no second encode with
`tokenizers` to chunk it (the prefix cache's `begin`).

The rule: a pre-token starts at every space that follows a character other than whitespace and
precedes an ASCII letter (`CUT_AT`). It holds for a pre-tokenizer with a stage whose regex has no
alternative that can match a non-whitespace character followed by a space: in the GPT-2 pattern
(ByteLevel's own regex) and the Llama 3 and Qwen 2 patterns (KNOWN_PATTERNS) a space is only ever
a match's first character or part of a whitespace run. Whatever position a scan started from, the
match holding the character before the space ends there, and the next starts at the space. Other
stages of a Sequence only cut pieces further, never join them, so one such stage is enough. Three
more conditions make the cut exact for the whole pipeline:

- the normalizer keeps the pair as it is: none, NFC, NFD or Lowercase (NFKC and NFKD can turn a
  character into a space and a combining mark);
- no added token can cover the pair: none holds whitespace, and none strips whitespace on its
  right (`rstrip`) or left (`lstrip`; harmless as far as we can tell, refused anyway);
- the model tokenizes each pre-token on its own (every model the cache accepts).

Then the tokens of a text are the tokens of the text before such a space followed by the tokens
of the text from it, each encoded alone. `refusal` checks the configuration, and a tokenizer that
passes is checked once more on sample texts (`PROBES`) with `tokenizers` before it is used.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import tokenizers

from epp.tokenize import cachecheck

CUT_AT = re.compile(r"(?<=\S) (?=[A-Za-z])")
"""A space after a non-whitespace character and before an ASCII letter: a pre-token starts there."""

GPT2_BYTELEVEL = "ByteLevel"  # its `use_regex` runs the GPT-2 pattern
KNOWN_PATTERNS = frozenset(
    {
        # Llama 3 (and 3.1-3.3)
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
        # Qwen 2 and 2.5 (single digits)
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
        # GPT-2's, written out as a Split
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    }
)
"""Split patterns read to satisfy the rule (module docstring); compared as exact strings."""

_NORMALIZERS = {"NFC", "NFD", "Lowercase"}
_SPLITTING = {"Isolated", "Removed"}  # a Split whose matches are pieces of their own (or dropped)

PROBES = (
    "Hello world, this is a test of the cut rule. It holds for Words and words alike.",
    "def f(x):\n    return x ** 2  # a comment with Words\n\nclass A: pass",
    "numbers 12 and 3.14 then text; punctuation!? Then (parens) and 'quotes' and \"double\" ones",
    "it's they're we've I'm you'll he'd IT'S THEY'RE Don't stop",
    "tabs\tand\r\nnewlines\n\n\n  \n  Indented line after blank lines, then   several   spaces",
    "Ünïcödé café naïve résumé İstanbul straße ΩΣ then ASCII words after them",
    "日本語のテキスト、中文 and English mixed; 한국어 텍스트 with latin after",
    "emoji 👍🏽 then words 👨\u200d👩\u200d👧 and flags 🇫🇷 Followed by words",
    "combining e\u0301 a\u0308 then x\u0301 y and zero\u200bwidth\u00a0nbsp then text",
)
"""Texts on which cutting at every rule position must give `tokenizers`' own ids (`probe`)."""


def refusal(config: dict[str, Any]) -> str | None:
    """Why the rule is not proved for this tokenizer.json (parsed), or None when it is."""
    for norm in cachecheck.flatten(config.get("normalizer"), "normalizers"):
        if norm.get("type") not in _NORMALIZERS:
            return f"normalizer {norm.get('type')} may change what a space is beside"
    stages = cachecheck.flatten(config.get("pre_tokenizer"), "pretokenizers")
    if not any(_splits_at_rule(stage) for stage in stages):
        return "no pre-tokenizer stage is known to start a pre-token at a space before a letter"
    for token in config.get("added_tokens") or ():
        content = str(token.get("content", ""))
        if any(c.isspace() for c in content) or token.get("rstrip") or token.get("lstrip"):
            return f"added token {content!r} holds or strips whitespace"
    return None


def probe(raw: tokenizers.Tokenizer) -> str | None:
    """Why cutting at the rule's positions changed `raw`'s ids on a probe text, or None."""
    for text in PROBES:
        want = raw.encode(text, add_special_tokens=False).ids
        bounds = [0, *(m.start() for m in CUT_AT.finditer(text)), len(text)]
        pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
        got = [i for e in raw.encode_batch(pieces, add_special_tokens=False) for i in e.ids]
        if got != want:
            return f"cutting {text[:30]!r}... at spaces before letters changed its ids"
    return None


def first_cut(text: str, lo: int, hi: int) -> int | None:
    """The first rule position in [lo, hi], or None."""
    if hi < lo:
        return None
    found = CUT_AT.search(text, lo, hi + 2)  # the look-ahead reads the letter after hi
    return None if found is None or found.start() > hi else found.start()


def cuts(
    text: str,
    start: int,
    end: int,
    *,
    first: tuple[int, int] | None,
    min_chars: int,
    divisor: int,
) -> list[int]:
    """Rule positions cutting `text[start:]` into chunks, none after `end` (absolute offsets,
    increasing). Each chunk is at least `max(min_chars, its start // divisor)` characters long, as
    the prefix cache's chunks are; `first` (offsets from `start`): a range where the first chunk
    should end if a rule position is there."""
    out: list[int] = []
    cur = start
    if first is not None:
        lo, hi = first
        at = first_cut(text, start + max(lo, 1), min(start + hi, end))
        if at is not None:
            out.append(at)
            cur = at
    while True:
        at = first_cut(text, cur + max(min_chars, cur // divisor), end)
        if at is None:
            return out
        out.append(at)
        cur = at


def _splits_at_rule(stage: dict[str, Any]) -> bool:
    kind = stage.get("type")
    if kind == GPT2_BYTELEVEL:
        return bool(stage.get("use_regex", True))
    if kind == "Split":
        regex = (stage.get("pattern") or {}).get("Regex")
        return regex in KNOWN_PATTERNS and stage.get("behavior") in _SPLITTING and not stage.get("invert")
    return False
