"""The cut rule (epp.tokenize.cutrules): which tokenizers it is proved for, that cutting at its
positions never changes ids (property tests against `tokenizers`), and the prefix cache's path
that uses it: the fast engine's pieces as chunks, sampled checks, a mismatch caught."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import tokenizers
from hypothesis import given
from tokenizers import models, normalizers, pre_tokenizers

from epp.tokenize import cutrules, prefixcache, registry, tokenizer
from tests.tokenize import test_prefixcache as tp

RULED = ["epp-tiny", "llama3-like"]


def _config(tok: tokenizers.Tokenizer) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(tok.to_str())
    return parsed


def _bpe(pre: Any, normalizer: Any = None) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    return tok


def test_the_rule_is_proved_for_the_gpt2_llama3_and_qwen2_patterns_only() -> None:
    assert cutrules.refusal(_config(tp.cached("epp-tiny")[0].backend)) is None  # digits, then GPT-2
    assert cutrules.refusal(_config(tp.cached("llama3-like")[0].backend)) is None  # NFC, Llama 3
    qwen2 = pre_tokenizers.Split(
        tokenizers.Regex(tp.LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")), behavior="isolated"
    )
    assert cutrules.refusal(_config(_bpe(qwen2))) is None
    refused = {
        "added token '<|sep|>' holds or strips whitespace": tp.cached("gpt2-like")[0].backend,
        "normalizer NFKC": _bpe(pre_tokenizers.ByteLevel(), normalizers.NFKC()),
        "no pre-tokenizer stage": _bpe(pre_tokenizers.ByteLevel(use_regex=False)),
        "no pre-tokenizer stage is known": _bpe(
            pre_tokenizers.Split(tokenizers.Regex(r"\S+ ?|\s+"), "isolated")
        ),
        "no pre-tokenizer stage is known ": _bpe(
            pre_tokenizers.Split(tokenizers.Regex(tp.LLAMA3_PATTERN), behavior="merged_with_previous")
        ),
        "no pre-tokenizer stage is known to": _bpe(pre_tokenizers.Metaspace()),
    }
    for why, tok in refused.items():
        found = cutrules.refusal(_config(tok))
        assert found is not None and found.startswith(why.strip()), (why, found)


@pytest.mark.parametrize("name", RULED)
@tp.PROPERTY
@given(text=tp.texts)
def test_cutting_at_every_rule_position_keeps_tokenizers_ids(name: str, text: str) -> None:
    raw = tp.cached(name)[1]._raw
    want = raw.encode(text, add_special_tokens=False).ids
    bounds = [0, *(m.start() for m in cutrules.CUT_AT.finditer(text)), len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    got = [i for e in raw.encode_batch(pieces, add_special_tokens=False) for i in e.ids]
    assert got == want


def test_a_wrongly_listed_pattern_is_caught_by_the_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The configuration check trusts KNOWN_PATTERNS; the probe texts check the pipeline too."""
    joining = r"\S+ ?|\s+"  # keeps a word and the space after it together: the rule fails
    monkeypatch.setattr(cutrules, "KNOWN_PATTERNS", cutrules.KNOWN_PATTERNS | {joining})
    tok = _bpe(pre_tokenizers.Sequence([pre_tokenizers.Split(tokenizers.Regex(joining), "isolated")]))
    tokenizers_trainer = tokenizers.trainers.BpeTrainer(vocab_size=300)
    tok.train_from_iterator([tp.CORPUS[:20_000]], trainer=tokenizers_trainer)
    assert cutrules.refusal(_config(tok)) is None
    assert cutrules.probe(tok) is not None


def test_cuts_follow_the_chunk_sizes_and_the_first_range() -> None:
    text = tp.CORPUS[:20_000]
    found = cutrules.cuts(text, 100, len(text) - 40, first=None, min_chars=64, divisor=256)
    assert found and found[-1] <= len(text) - 40
    for before, at in zip([100, *found], found, strict=False):
        assert at - before >= max(64, before // 256)
        assert (
            text[at] == " "
            and not text[at - 1].isspace()
            and text[at + 1].isascii()
            and text[at + 1].isalpha()
        )
    # The first chunk ends in the range when a rule position is there, else sizes rule from the start.
    inside = next(m.start() for m in cutrules.CUT_AT.finditer(text, 110)) - 100
    assert cutrules.cuts(text, 100, len(text), first=(inside - 5, inside + 5), min_chars=64, divisor=256)[
        0
    ] == (100 + inside)
    assert cutrules.first_cut("ab cd", 0, 1) is None and cutrules.first_cut("ab cd", 0, 2) == 2


# -- the prefix cache's fast pieces -------------------------------------------------------------------


def _own(name: str = "epp-tiny") -> tuple[tokenizer.Tokenizer, prefixcache.PrefixCache]:
    """A tokenizer of its own (a mismatch turns its fast engine off) and a default cache."""
    tok = tokenizer.load_shipped() if name == "epp-tiny" else tp.BUILDERS[name]()
    return tok, prefixcache.PrefixCache(tok)


@pytest.mark.parametrize("name", RULED)
def test_a_long_text_is_cached_in_the_fast_engines_pieces(name: str) -> None:
    tok, cache = _own(name)
    assert cache.ruled, cache.ruled_note
    text = (tp.CORPUS * 3)[:60_000]  # past MAX_FAST_CHARS: `tokenizers` encoded it before
    assert cache.encode(text) == tok.backend.encode(text).ids
    assert cache.misses == 1 and cache.verified == 1
    ends = [node.end for node in cache.trie.lru if not node.final]
    assert len(ends) > 100
    assert all(text[end] == " " and text[end - 1] != " " and text[end + 1].isalpha() for end in ends)
    longer = text + "\n<|user|>\n" + tp.CORPUS[3_000:9_000]
    before = cache.encoded_tokens
    assert cache.encode(longer) == tok.backend.encode(longer).ids
    assert cache.partial_hits == 1 and cache.fallbacks == 0
    assert cache.encoded_tokens - before < len(
        tok.backend.encode(longer[59_000:], add_special_tokens=False).ids
    )
    assert cache.encode(longer) == tok.backend.encode(longer).ids and cache.hits == 1


def test_the_rule_proves_a_seam_at_the_last_matched_chunk_without_a_window() -> None:
    """A text sharing a cached one's chunks is encoded from the last chunk it matches whenever a
    space before a letter follows that chunk's end in it: nothing before is encoded again."""
    tok, cache = _own()
    system = tp.CORPUS[:6_000]
    cache.encode(system + " Please answer. What is a token?")
    seams = 0
    for n in range(0, 400, 16):
        text = system + " Please answer. " + tp.CORPUS[9_000 : 9_000 + n] + " Why?"
        last = cache.lookup(text).path[-1]
        before = cache.encoded_tokens
        assert cache.encode(text) == tok.backend.encode(text).ids
        if cutrules.first_cut(text, last.end, last.end) is not None:
            new = tok.backend.encode(text[last.end :], add_special_tokens=False).ids
            assert cache.encoded_tokens - before == len(new)
            seams += 1
    assert seams > 10 and cache.fallbacks == 0 and cache.engine_mismatches == 0


def test_pieces_with_long_runs_go_to_tokenizers_and_the_rest_to_the_fast_engine() -> None:
    tok, cache = _own()
    text = tp.CORPUS[:5_000] + " " + "x" * 300 + " and " + "日本語" * 60 + " " + tp.CORPUS[5_000:9_000]
    assert not tok.fast.takes(text[4_000:6_000]) if tok.fast else False
    assert cache.encode(text) == tok.backend.encode(text).ids and cache.verified == 1
    assert tok.fast is not None and cache.engine_mismatches == 0


def test_a_text_with_few_cut_places_is_chunked_from_tokenizers_offsets() -> None:
    """CJK prose has no space before a Latin letter for pages: fastokens' pieces would be one huge
    chunk, so that part goes to `tokenizers` and is chunked at its checkpoints, seam kept."""
    tok, cache = _own()
    english = tp.CORPUS[:6_000]
    cache.encode(english + " The end.")
    cjk = "日本語のテキスト、中文\uff0c한국어 텍스트。" * 2_000  # ~40k characters
    text = english + " And then " + cjk + " more words at the end"
    before = cache.encoded_tokens
    assert cache.encode(text) == tok.backend.encode(text).ids
    assert cache.partial_hits == 1 and cache.fallbacks == 0  # the English prefix reused
    prefix = tok.backend.encode(english, add_special_tokens=False).ids
    whole = tok.backend.encode(text, add_special_tokens=False).ids
    assert cache.encoded_tokens - before < len(whole) - len(prefix) + 100  # from near the seam
    assert max(len(node.text) for node in cache.trie.lru) < 2_000  # chunked, not one 40k node
    assert cache.encode(text) == tok.backend.encode(text).ids and cache.hits == 1


def test_checks_are_sampled_after_the_first_texts_and_a_mismatch_turns_the_engine_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tok, cache = _own()
    for i in range(prefixcache.VERIFY_FIRST + prefixcache.VERIFY_EVERY):
        assert cache.encode(f"[{i}] " + tp.CORPUS[i * 50 : i * 50 + 3_000]) is not None
    assert cache.verified == prefixcache.VERIFY_FIRST + 1
    assert cache.unverified == prefixcache.VERIFY_EVERY - 1
    assert cache.engine_mismatches == 0
    # The next checked text: the fast engine answering other ids is found and turned off.
    cache._ruled_count = prefixcache.VERIFY_EVERY * 10 - 1
    real = tokenizer.Tokenizer.encode_fast_pieces

    def wrong(self: tokenizer.Tokenizer, texts: list[str]) -> Any:
        got = real(self, texts)
        assert got is not None
        got[0][0] += 1
        return got

    monkeypatch.setattr(tokenizer.Tokenizer, "encode_fast_pieces", wrong)
    text = "A new text " + tp.CORPUS[9_000:12_000]
    answered = cache.encode(text)
    assert answered != tok.backend.encode(text).ids  # the request got the fast engine's ids
    assert cache.engine_mismatches == 1 and tok.fast is None
    assert cache.encode(text) == tok.backend.encode(text).ids  # cached from `tokenizers`' encoding


async def test_the_registry_sends_a_long_new_part_to_the_fast_engine(
    track: Any,
) -> None:
    tok = tokenizer.load_shipped()
    toks = track(registry.Tokenizers(default=tok, workers=1))
    text = (tp.CORPUS * 3)[:50_000]
    assert await toks.encode("m", text) == tok.backend.encode(text).ids
    await toks.drain()
    cache = toks.prefix_caches["epp-tiny"]
    assert cache.misses == 1 and cache.verified == 1
    grown = text + " " + tp.CORPUS[:30_000]  # a new part past MAX_FAST_CHARS
    assert await toks.encode("m", grown) == tok.backend.encode(grown).ids
    await toks.drain()
    assert cache.partial_hits == 1 and cache.verified == 2
