"""What the prefix cache refuses: tokenizers for which it cannot prove a stitched encoding equal
to a full one (`epp.tokenize.prefixcache`, "Why the stitched result equals full tokenization").

What the cache refuses (`UnsupportedTokenizer`, checked at construction): normalizers other than
Unicode normal forms and Lowercase (NFC and friends can compose across a seam, so with them a
checkpoint must sit on an ASCII character, which no composition involves); pre-tokenizers that add
text at a segment's start (ByteLevel `add_prefix_space`, Metaspace with a prepend scheme), merge
runs (`Contiguous`) or use look-behind, anchors or `\\b` in their patterns; BPE dropout; truncation
or padding; and post-processors that do not just add fixed ids before and after the text (checked
on sample texts). Special tokens from the post-processor (BOS) are added around the cached content
ids, as they are around a full encode's.
"""

from __future__ import annotations

import re
from typing import Any

import tokenizers

_NORMALIZERS_LOCAL = {"Lowercase"}
_NORMALIZERS_ASCII = {"NFC", "NFD", "NFKC", "NFKD"}
_SPLIT_BEHAVIOURS = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext"}
# Constructs that make a regex scan depend on text before the piece, or on where the text starts.
_UNSAFE_REGEX = re.compile(r"\(\?<[=!]|\\[bBAzZG]")


class UnsupportedTokenizer(Exception):
    """The cache cannot prove its results equal full tokenization for this tokenizer; says why."""


def specials(backend: tokenizers.Tokenizer, raw: tokenizers.Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after the content (`raw` is the same pipeline
    without it); refuses anything else."""
    probes = ("Hello world", "a", " x\n<s> 12 <|user|>\n", "日本語 ok")
    found: tuple[list[int], list[int]] | None = None
    for probe in probes:
        content = raw.encode(probe, add_special_tokens=False).ids
        if backend.encode(probe, add_special_tokens=False).ids != content:
            raise UnsupportedTokenizer("the post-processor changes ids even without special tokens")
        full = backend.encode(probe, add_special_tokens=True).ids
        at = _find(full, content)
        if at is None:
            raise UnsupportedTokenizer("the post-processor does more than add ids around the text")
        pair = (full[:at], full[at + len(content) :])
        if found is not None and pair != found:
            raise UnsupportedTokenizer("the post-processor adds different ids to different texts")
        found = pair
    assert found is not None
    return found


def _find(full: list[int], part: list[int]) -> int | None:
    for at in range(len(full) - len(part) + 1):
        if full[at : at + len(part)] == part:
            return at
    return None


def check(config: dict[str, Any]) -> tuple[bool, int]:
    """Refuse what the exactness argument does not cover; return (ASCII-only checkpoints, longest
    added token in characters)."""
    if config.get("truncation") is not None or config.get("padding") is not None:
        raise UnsupportedTokenizer("truncation or padding is configured in tokenizer.json")
    ascii_only = False
    for norm in flatten(config.get("normalizer"), "normalizers"):
        kind = norm.get("type")
        if kind in _NORMALIZERS_ASCII:
            ascii_only = True
        elif kind not in _NORMALIZERS_LOCAL:
            raise UnsupportedTokenizer(f"normalizer {kind} is not known to be local")
    for pre in flatten(config.get("pre_tokenizer"), "pretokenizers"):
        _check_pre(pre)
    model = config.get("model") or {}
    if model.get("type") == "BPE" and model.get("dropout") not in (None, 0, 0.0):
        raise UnsupportedTokenizer("BPE dropout makes tokenization random")
    if model.get("type") not in ("BPE", "WordPiece", "WordLevel", "Unigram"):
        raise UnsupportedTokenizer(f"model {model.get('type')} is not supported")
    longest = max((len(t.get("content", "")) for t in config.get("added_tokens") or ()), default=0)
    return ascii_only, longest


def _check_pre(pre: dict[str, Any]) -> None:
    kind = pre.get("type")
    if kind == "ByteLevel":
        if pre.get("add_prefix_space"):
            raise UnsupportedTokenizer("ByteLevel add_prefix_space adds a space at each segment's start")
    elif kind == "Split":
        if pre.get("behavior") not in _SPLIT_BEHAVIOURS:
            raise UnsupportedTokenizer(f"Split behavior {pre.get('behavior')} is not supported")
        pattern = pre.get("pattern") or {}
        regex = pattern.get("Regex")
        if regex is not None and _unsafe_regex(regex):
            raise UnsupportedTokenizer(f"Split pattern {regex!r} uses look-behind, anchors or \\b")
    elif kind == "Metaspace":
        if pre.get("prepend_scheme", "always") != "never":
            raise UnsupportedTokenizer("Metaspace prepends a marker at a segment's start")
    elif kind == "Punctuation":
        if pre.get("behavior", "Isolated") not in _SPLIT_BEHAVIOURS:
            raise UnsupportedTokenizer(f"Punctuation behavior {pre.get('behavior')} is not supported")
    elif kind not in ("Digits", "Whitespace", "WhitespaceSplit", "BertPreTokenizer"):
        raise UnsupportedTokenizer(f"pre-tokenizer {kind} is not supported")


def _unsafe_regex(regex: str) -> bool:
    if _UNSAFE_REGEX.search(regex):
        return True
    # ^ and $ anchor unless escaped or (for ^) negating a character class.
    stripped = regex.replace("\\\\", "").replace("\\^", "").replace("\\$", "").replace("[^", "[")
    return "^" in stripped or "$" in stripped


def flatten(item: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """The steps of a tokenizer.json component (`Sequence`s opened), in order."""
    if item is None:
        return []
    if item.get("type") == "Sequence":
        out: list[dict[str, Any]] = []
        for sub in item.get(key) or ():
            out.extend(flatten(sub, key))
        return out
    return [item]
