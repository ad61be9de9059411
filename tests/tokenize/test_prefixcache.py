"""PrefixCache: equal to full tokenization (property tests over generated texts and tokenizers),
counters, the byte bound and LRU structure, thread safety, refusals, and the registry's wiring."""

from __future__ import annotations

import array
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from epp.tokenize import cachecheck, chat, chunktrie, pieces, pool_work, prefixcache, registry, tokenizer

DATA = Path(__file__).resolve().parent / "data"
# README.md and docs/architecture.md as of commit 502201c, frozen: tests that count chunks and
# siblings must not change their answer whenever the docs are edited.
CORPUS = (Path(__file__).resolve().parent / "data" / "corpus.md").read_text(encoding="utf-8")
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = [
    "<s>",
    "</s>",
    "<|user|>",
    "<|system|>",
    "<|endoftext|>",
    "<|im_start|>",
    "[CLS]",
    "[SEP]",
    "<|sep|>",
]
FRAGMENTS = [
    "the",
    " quick",
    " brown",
    "  ",
    "    ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    " \n ",
    "123",
    "4567890",
    "3.14",
    "é",
    "e\u0301",
    "\u0301",
    "\u0308a",
    "\u1100\u1161\u11a8",
    "👍",
    "👍🏽",
    "👨\u200d👩\u200d👧",
    "日本語",
    "中文\uff0c",  # a fullwidth comma
    "한국어",
    "Ω",
    "ß",
    "İ",
    "!?",
    "...",
    "'s",
    "'LL",
    "x" * 40,
    *SPECIALS,
]
_chars = st.characters(blacklist_categories=("Cs",))
_piece = st.one_of(
    st.sampled_from(FRAGMENTS),
    st.text(alphabet=_chars, max_size=8),
    st.integers(0, len(CORPUS) - 400).flatmap(
        lambda i: st.integers(20, 400).map(lambda n: CORPUS[i : i + n])
    ),
)
texts = st.lists(_piece, max_size=40).map("".join)


# -- tokenizers under test ------------------------------------------------------------------------


def _train(tok: tokenizers.Tokenizer, trainer: Any) -> tokenizers.Tokenizer:
    tok.train_from_iterator([CORPUS[i : i + 2000] for i in range(0, len(CORPUS), 2000)], trainer=trainer)
    return tok


def gpt2_like() -> tokenizer.Tokenizer:
    """Byte-level BPE with the GPT-2 pattern (ByteLevel's own regex), BOS and EOS added around texts,
    and a non-special added token that strips whitespace on both sides."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|endoftext|>", "<|user|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    _train(tok, trainer)
    tok.add_tokens([tokenizers.AddedToken("<|sep|>", lstrip=True, rstrip=True, special=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A <|endoftext|>",
        special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))],
    )
    return tokenizer.Tokenizer(tok, name="gpt2-like")


def llama3_like() -> tokenizer.Tokenizer:
    """Qwen/Llama 3 shape: NFC, the Llama 3 split pattern, byte-level BPE, ByteLevel post-processor
    (which trims offsets)."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|im_start|>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    _train(tok, trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    return tokenizer.Tokenizer(tok, name="llama3-like")


def wordpiece() -> tokenizer.Tokenizer:
    """BERT shape without BertNormalizer: Lowercase, BertPreTokenizer, WordPiece, [CLS] ... [SEP]."""
    tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    _train(tok, trainers.WordPieceTrainer(vocab_size=500, special_tokens=["[UNK]", "[CLS]", "[SEP]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    return tokenizer.Tokenizer(tok, name="wordpiece")


BUILDERS: dict[str, Callable[[], tokenizer.Tokenizer]] = {
    "epp-tiny": tokenizer.load_shipped,
    # The same without fastokens: the cache's other path (ids and word ids from one encode).
    "epp-tiny/tokenizers": lambda: tokenizer.load_shipped(engine="tokenizers"),
    # fastokens without the cut rule: its ids answer, `tokenizers`' encoding is chunked (`cached`).
    "epp-tiny/unruled": tokenizer.load_shipped,
    "gpt2-like": gpt2_like,
    "llama3-like": llama3_like,
    "wordpiece": wordpiece,
}
_built: dict[str, tuple[tokenizer.Tokenizer, prefixcache.PrefixCache]] = {}


def cached(name: str) -> tuple[tokenizer.Tokenizer, prefixcache.PrefixCache]:
    """One tokenizer and one small-chunked, small-budget cache per name, shared by every example:
    state left by earlier examples must never change a result. Texts past 2 x 96 characters are
    encoded in up to 3 pieces (`split_chars`, `pieces`), so the examples cut texts everywhere."""
    if name not in _built:
        tok = BUILDERS[name]()
        _built[name] = (
            tok,
            prefixcache.PrefixCache(
                tok,
                max_bytes=400_000,
                min_chunk_chars=64,
                split_chars=96,
                pieces=3,
                cut_rule=name != "epp-tiny/unruled",
            ),
        )
    return _built[name]


def assert_same(tok: tokenizer.Tokenizer, cache: prefixcache.PrefixCache, text: str) -> None:
    """The cache's ids equal `tokenizers`' own (the reference vLLM uses; not the fast engine's)."""
    for special in (True, False):
        want = tok.backend.encode(text, add_special_tokens=special).ids
        assert cache.encode(text, add_special_tokens=special) == want, (text, special)


# derandomize: CI runs the same examples every time. Once (1 run in ~20, under CPU load, with a
# random seed) the growing-conversation test failed and could not be reproduced: not by replaying
# the saved example (the caches are shared across examples, so state matters), nor in ~290k
# randomized comparisons (see the session note). To explore, drop `derandomize` locally.
PROPERTY = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


# -- equality with full tokenization ----------------------------------------------------------------


@pytest.mark.parametrize("name", list(BUILDERS))
@PROPERTY
@given(prefix=texts, suffixes=st.lists(texts, min_size=1, max_size=4))
def test_texts_sharing_prefixes_and_growing(name: str, prefix: str, suffixes: list[str]) -> None:
    tok, cache = cached(name)
    assert_same(tok, cache, prefix)
    for suffix in suffixes:  # siblings: the same prefix, different continuations
        assert_same(tok, cache, prefix + suffix)
    grown = prefix
    for suffix in suffixes:  # a text growing turn by turn
        grown += suffix
        assert_same(tok, cache, grown)
    assert_same(tok, cache, prefix)  # exact hit


@pytest.mark.parametrize("name", list(BUILDERS))
@PROPERTY
@given(text=texts, cuts=st.lists(st.floats(0, 1), min_size=1, max_size=6))
def test_prefixes_of_a_text_in_any_order(name: str, text: str, cuts: list[float]) -> None:
    tok, cache = cached(name)
    assert_same(tok, cache, text)
    for cut in cuts:  # shorter texts after the longer one, cut anywhere (inside words, runs, tokens)
        assert_same(tok, cache, text[: int(len(text) * cut)])


TEMPLATES = ("epp-tiny", "llama3_like", "chatml_tools", "mistral_like", "openai_parts")
DATE = {"date_string": "01 Jan 2026"}


def _with_template(shipped: tokenizer.Tokenizer, name: str) -> tokenizer.Tokenizer:
    if name == "epp-tiny":
        return shipped
    return tokenizer.Tokenizer(
        shipped.backend,
        name=name,
        chat_template=(DATA / f"{name}.jinja").read_text(),
        bos_token_id=shipped.bos_token_id,
        special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
    )


@pytest.mark.parametrize("template", TEMPLATES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(system=st.none() | texts, turns=st.lists(texts, min_size=1, max_size=6))
def test_growing_conversations_through_chat_templates(
    template: str, system: str | None, turns: list[str]
) -> None:
    shipped, cache = cached("epp-tiny")
    tok = _with_template(shipped, template)
    messages: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    for i, content in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": content})
        for gen in (True, False):
            body = {
                "model": "m",
                "messages": messages,
                "add_generation_prompt": gen,
                "chat_template_kwargs": DATE,
            }
            try:
                text = chat.render_chat(tok, body)
            except chat.ChatTemplateError:
                continue
            assert cache.encode(text, add_special_tokens=False) == chat.encode_chat(tok, body)


def test_the_property_tests_went_through_seams() -> None:
    # Runs after the tests above (file order): their shared caches must have reused prefixes, or
    # they proved nothing about seams.
    for name, (_, cache) in _built.items():
        print(
            name,
            cache.hits,
            cache.partial_hits,
            cache.misses,
            cache.fallbacks,
            cache.evictions,
            cache.splitter.splits,
            cache.splitter.misses,
            cache.verified,
            cache.unverified,
        )
        # fastokens gave tokenizers' ids on every text (a difference would have turned it off).
        assert cache.engine_mismatches == 0, name
        if cache.hits + cache.partial_hits + cache.misses >= 100:
            assert cache.partial_hits > 20 and cache.hits > 20, name
            assert cache.fallbacks == 0, name  # no seam ever needed more right context than the margin
            if cache.ruled:  # the fast engine's pieces answered: checked, then sampled
                total = cache.verified + cache.unverified  # VERIFY_FIRST < VERIFY_EVERY
                assert cache.verified == prefixcache.VERIFY_FIRST + total // prefixcache.VERIFY_EVERY, name
                assert cache.unverified > 100, name
            else:  # `tokenizers` encoded in pieces (WordPiece drops the space at a cut: it stops)
                assert cache.splitter.splits > 20 or name == "wordpiece", name


# -- counters, bound, structure ----------------------------------------------------------------------


def _fresh(name: str = "epp-tiny", **kwargs: Any) -> tuple[tokenizer.Tokenizer, prefixcache.PrefixCache]:
    tok = cached(name)[0]
    return tok, prefixcache.PrefixCache(tok, **kwargs)


def test_counters_hit_partial_miss() -> None:
    tok, cache = _fresh()
    text = CORPUS[:8000]
    assert_same(tok, cache, text)  # a miss, then an exact hit
    assert (cache.misses, cache.hits, cache.partial_hits) == (1, 1, 0)
    n = len(tok.encode(text, add_special_tokens=False))
    assert cache.encoded_tokens == n and cache.reused_tokens == n
    assert cache.cached_tokens >= n  # the chunks, plus the final piece
    longer = text + "\n<|user|>\nAnd now something new."
    assert cache.encode(longer) == tok.encode(longer)
    assert cache.partial_hits == 1
    # Only the new part, the overlap window and the chunk before the seam were tokenized again.
    assert cache.encoded_tokens - n < 200
    assert cache.reused_tokens > 2 * n - 200
    assert cache.fallbacks == 0
    assert cache.cached_bytes > 0 and cache.nodes > 0


def _walk(node: Any) -> list[Any]:
    out = []
    for found in node.children.values():
        for child in found if isinstance(found, list) else [found]:
            assert child.parent is node and child.alive
            assert child.end == node.end + len(child.text)
            out.append(child)
            out.extend(_walk(child))
    return out


def test_byte_budget_evicts_least_recently_used_leaves() -> None:
    tok, cache = _fresh(max_bytes=30_000)
    for i in range(0, 40_000, 1_000):
        assert_same(tok, cache, CORPUS[i : i + 3_000])
        assert cache.cached_bytes <= cache.max_bytes
    assert cache.evictions > 0
    nodes = _walk(cache.trie.root)
    assert len(nodes) == cache.nodes == len(cache.trie.lru)
    assert sum(n.nbytes for n in nodes) == cache.cached_bytes
    assert sum(len(n.ids) for n in nodes) == cache.cached_tokens
    # The most recent text is still cached whole.
    recent = CORPUS[39_000:42_000]
    hits = cache.hits
    assert cache.encode(recent) == tok.encode(recent)
    assert cache.hits == hits + 1
    cache.clear()
    assert (cache.cached_bytes, cache.nodes, _walk(cache.trie.root)) == (0, 0, [])


def test_threads_share_one_cache() -> None:
    tok, cache = _fresh(max_bytes=200_000, min_chunk_chars=64)
    system = CORPUS[:6_000]
    jobs = [system + CORPUS[10_000 + 97 * i : 10_000 + 97 * i + 50 * (i % 7)] for i in range(40)]
    expected = [tok.encode(t) for t in jobs]
    errors: list[str] = []

    def run(offset: int) -> None:
        for k in range(len(jobs)):
            i = (k + offset) % len(jobs)
            if cache.encode(jobs[i]) != expected[i]:
                errors.append(f"job {i}")

    threads = [threading.Thread(target=run, args=(n * 5,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.hits + cache.partial_hits + cache.misses == 4 * len(jobs)
    nodes = _walk(cache.trie.root)
    assert len(nodes) == cache.nodes and sum(n.nbytes for n in nodes) == cache.cached_bytes


def test_long_texts_insert_in_batches_with_eviction_between_them() -> None:
    """A text of many more chunks than INSERT_BATCH goes in batch by batch; with a budget that
    evicts during the insert, other threads interleaving, the trie and its totals stay consistent."""
    tok, cache = _fresh(max_bytes=60_000, min_chunk_chars=64)
    texts = [CORPUS[i * 500 : i * 500 + 20_000] for i in range(6)]
    expected = [tok.encode(t) for t in texts]
    errors: list[str] = []

    def run(offset: int) -> None:
        for k in range(len(texts)):
            i = (k + offset) % len(texts)
            ids, commit = cache.begin(texts[i])
            if ids != expected[i]:
                errors.append(f"text {i}")
            commit()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.evictions > 0 and cache.cached_bytes <= cache.max_bytes
    nodes = _walk(cache.trie.root)
    assert len(nodes) == cache.nodes == len(cache.trie.lru)
    assert sum(n.nbytes for n in nodes) == cache.cached_bytes
    # Without a budget, one such text is one chain of more than INSERT_BATCH chunks, cached whole.
    tok, cache = _fresh(min_chunk_chars=64)
    assert cache.encode(texts[0]) == expected[0]
    assert cache.nodes > 2 * prefixcache.INSERT_BATCH
    assert cache.lookup(texts[0]).exact and cache.encode(texts[0]) == expected[0]


def test_a_seam_that_fails_verification_falls_back_to_a_full_encode() -> None:
    # Without the cut rule, which proves a seam from the text alone (no window to re-encode).
    tok, cache = _fresh(min_chunk_chars=64, cut_rule=False)
    text = CORPUS[:4_000]
    cache.encode(text)
    # Corrupt every cached chunk's first id: the overlap window (here the final piece, which the
    # longer text continues past its seam) no longer matches, so the cache must not trust the
    # prefix before it either.
    for node in cache.trie.lru:
        if len(node.ids):
            node.ids[0] = 0
    longer = text + " and more"
    assert cache.encode(longer) == tok.encode(longer)
    assert cache.fallbacks == 1


# -- what the cache refuses -----------------------------------------------------------------------------


def _refused(tok: tokenizers.Tokenizer) -> str:
    with pytest.raises(cachecheck.UnsupportedTokenizer) as e:
        prefixcache.PrefixCache(tokenizer.Tokenizer(tok, name="t"))
    return str(e.value)


def _small_bpe() -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2, " ": 3}, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def test_refuses_what_it_cannot_prove() -> None:
    tok = _small_bpe()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    assert "add_prefix_space" in _refused(tok)
    tok = _small_bpe()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    assert "Metaspace" in _refused(tok)
    tok = _small_bpe()
    tok.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex(r"(?<=a)b|\w+"), behavior="isolated")
    assert "look-behind" in _refused(tok)
    tok.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex(r"^\s+|\w+"), behavior="isolated")
    assert "anchors" in _refused(tok)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="contiguous")
    assert "Contiguous" in _refused(tok)
    tok = _small_bpe()
    tok.normalizer = normalizers.BertNormalizer()
    assert "BertNormalizer" in _refused(tok)
    tok = _small_bpe()
    tok.enable_truncation(10)
    assert "truncation" in _refused(tok)
    tok = tokenizers.Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[], dropout=0.5))
    assert "dropout" in _refused(tok)
    unigram = tokenizers.Tokenizer(models.Unigram([("a", -1.0), ("b", -2.0)], 0, False))
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()  # prepend_scheme "always"
    assert "Metaspace" in _refused(unigram)


def test_accepts_the_gpt2_and_digit_split_patterns() -> None:
    tok = _small_bpe()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(tokenizers.Regex(LLAMA3_PATTERN), behavior="isolated"), pre_tokenizers.Digits()]
    )
    prefixcache.PrefixCache(tokenizer.Tokenizer(tok, name="t"))


# -- the registry --------------------------------------------------------------------------------------


async def test_registry_uses_a_cache_per_tokenizer(
    track: Callable[[registry.Tokenizers], registry.Tokenizers],
) -> None:
    tiny = cached("epp-tiny")[0]
    gpt2 = cached("gpt2-like")[0]
    toks = track(registry.Tokenizers({"g": gpt2}, default=tiny))
    assert set(toks.prefix_caches) == {"epp-tiny", "gpt2-like"}
    text = CORPUS[:5_000]
    for _ in range(2):
        assert await toks.encode("m", text) == tiny.encode(text)
        assert await toks.encode("g", text, add_special_tokens=False) == gpt2.encode(
            text, add_special_tokens=False
        )
        await toks.drain()  # the fast engine's requests do not wait for their text to be cached
    assert toks.prefix_caches["epp-tiny"].hits == 1 and toks.prefix_caches["gpt2-like"].hits == 1
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": text}, {"role": "user", "content": "Hi"}],
    }
    assert await toks.encode_chat("m", body) == chat.encode_chat(tiny, body)
    await toks.drain()
    body["messages"].append({"role": "assistant", "content": "Hello"})
    assert await toks.encode_chat("m", body) == chat.encode_chat(tiny, body)
    await toks.drain()  # counted by the commit step
    assert toks.prefix_caches["epp-tiny"].partial_hits >= 1


async def test_a_long_text_cached_whole_is_answered_off_the_loop(
    track: Callable[[registry.Tokenizers], registry.Tokenizers], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repeated text is answered from the cache: on the loop when short, in a worker when its
    ids take longer to copy out than the hand-off (CACHED_INLINE_CHARS); the same ids."""
    tiny = cached("epp-tiny")[0]
    toks = track(registry.Tokenizers(default=tiny))
    threads: list[int] = []
    real = prefixcache.PrefixCache.cached

    def recording(self: prefixcache.PrefixCache, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(prefixcache.PrefixCache, "cached", recording)
    long = (CORPUS * (registry.CACHED_INLINE_CHARS // len(CORPUS) + 2))[: registry.CACHED_INLINE_CHARS + 1000]
    for text, off_loop in [(CORPUS[:5_000], False), (long, True)]:
        first = await toks.encode("m", text)
        await toks.drain()
        threads.clear()
        assert await toks.encode("m", text) == first == tiny.encode(text)
        assert len(threads) == 1 and (threads[0] != threading.get_ident()) is off_loop


async def test_registry_prefix_cache_can_be_disabled_and_refusals_are_recorded(
    track: Callable[[registry.Tokenizers], registry.Tokenizers],
) -> None:
    tiny = cached("epp-tiny")[0]
    assert track(registry.Tokenizers(default=tiny, prefix_cache_bytes=0)).prefix_caches == {}
    odd = _small_bpe()
    odd.pre_tokenizer = pre_tokenizers.Metaspace()
    toks = track(registry.Tokenizers({"o": tokenizer.Tokenizer(odd, name="odd")}))
    assert toks.prefix_caches == {}
    assert "Metaspace" in toks.prefix_cache_refused["odd"]
    assert await toks.encode("o", "ab " * 200) == odd.encode_batch_fast(["ab " * 200])[0].ids


class _NoWorker:
    """Stands in for the registry's worker pool: fails a test that hands work to it."""

    def __init__(self, workers: Any) -> None:
        self._workers = workers

    def submit(self, *args: object) -> None:
        raise AssertionError("handed to a worker")

    def shutdown(self, **kwargs: bool) -> None:
        self._workers.shutdown(**kwargs)


@pytest.mark.parametrize("engine", ["auto", "tokenizers"])
async def test_a_text_cached_whole_is_answered_without_a_worker(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repeated prompts skip the thread hand-off: the loop answers them from the cache. With the
    fast engine a short new part after cached chunks is encoded on the loop too, a long one in a
    worker; with `tokenizers` any new part goes to a worker."""
    shipped = tokenizer.load_shipped(engine=engine)
    assert shipped.engine == ("fastokens" if engine == "auto" else "tokenizers")
    toks = registry.Tokenizers(default=shipped, workers=1)
    try:
        text = "You are a careful assistant. Answer in full sentences. " * 100
        first = await toks.encode("m", text)
        await toks.drain()
        cache = toks.prefix_caches["epp-tiny"]
        assert cache.misses == 1
        monkeypatch.setattr(toks, "_executor", _NoWorker(toks._executor))
        assert await toks.encode("m", text) == first == shipped.backend.encode(text).ids
        assert await toks.encode("m", text, add_special_tokens=False) == shipped.encode(
            text, add_special_tokens=False
        )
        more = text + " One more sentence."
        if engine == "auto":
            assert await toks.encode("m", more) == shipped.backend.encode(more).ids
            await toks.drain()
            assert cache.partial_hits == 1 and cache.engine_mismatches == 0
            with pytest.raises(AssertionError, match="handed to a worker"):
                await toks.encode("m", more + " Tell me more." * (registry.FAST_INLINE_CHARS // 10))
        else:
            with pytest.raises(AssertionError, match="handed to a worker"):
                await toks.encode("m", more)
    finally:
        toks.close()


def test_the_memo_shortcuts_a_growing_conversation_and_survives_eviction() -> None:
    """The last seam's chain (`_Memo`) is where the next lookup starts and the next join copies
    from: a conversation's next turn extends it; ids stay exact, and a chain whose end was evicted
    is not used."""
    tok, cache = _fresh()
    text = CORPUS[:6000]
    turns = [CORPUS[6000 + 700 * i : 6700 + 700 * i] for i in range(8)]
    for i, turn in enumerate(turns):
        text += "\n<|user|>\n" + turn
        assert cache.encode(text) == tok.encode(text)
        memo = cache._memo
        if i == 0:  # a miss: no seam yet
            assert memo is None
            continue
        assert memo is not None and text.startswith(memo.text)
        assert memo.ids == tok.encode(memo.text, add_special_tokens=False)  # a checkpoint: exact
    assert cache.fallbacks == 0 and cache.partial_hits == len(turns) - 1
    # A lookup from the memo finds the same chain as a walk from the root without it.
    path, exact = cache._lookup(text + " more")
    kept, cache._memo = cache._memo, None
    assert (path, exact) == cache._lookup(text + " more")
    cache._memo = kept
    # Evict everything: the memo's chain is dead and must not be used; results stay exact.
    cache.clear()
    assert kept is not None and not kept.path[-1].alive
    assert cache._lookup(text) == ([], False)
    assert cache.encode(text + " again") == tok.encode(text + " again")


# -- encoding in pieces, and the seam at the last matched chunk ----------------------------------------


@pytest.mark.parametrize("name", ["epp-tiny", "llama3-like"])
def test_long_texts_are_encoded_in_pieces_equal_to_full_tokenization(name: str) -> None:
    tok = cached(name)[0]
    # The tokenizers' pieces: with the fast engine's (the cut rule) the commit step needs no encode.
    cache = prefixcache.PrefixCache(tok, min_chunk_chars=64, split_chars=200, pieces=4, cut_rule=False)
    text = CORPUS[:6_000]
    encoded = cache.splitter.encode(text, 0)
    assert encoded.pieces == 4 and not encoded.missed
    assert encoded.ids == tok.encode(text, add_special_tokens=False)
    assert [encoded.start_of(i) for i in range(len(encoded.ids))] == [
        start for start, _ in cache._raw.encode(text, add_special_tokens=False).offsets
    ]
    assert_same(tok, cache, text)  # a miss in pieces, then the chunks it cached answer whole
    longer = text + "\n<|user|>\n" + CORPUS[7_000:9_000]
    assert_same(tok, cache, longer)  # the part after the seam, in pieces
    # Three texts in pieces: the one above, the miss, the part after the seam.
    assert cache.splitter.splits == 3 and cache.splitter.misses == 0 and cache.partial_hits == 1


def test_a_cut_that_is_not_a_checkpoint_is_encoded_again_whole() -> None:
    # gpt2-like's `<|sep|>` strips the space after it: the only cut candidate (the space before
    # "b") is inside that added token's match, not a token start.
    tok = cached("gpt2-like")[0]
    cache = prefixcache.PrefixCache(tok, min_chunk_chars=64, split_chars=100, pieces=2)
    text = "a" * 300 + "<|sep|> b" + "c" * 300
    assert cache.splitter.cuts(text, 0) == [307]
    encoded = cache.splitter.encode(text, 0)
    assert encoded.missed and encoded.pieces == 1
    assert encoded.ids == tok.encode(text, add_special_tokens=False)
    assert_same(tok, cache, text)
    # WordPiece drops the space at every cut: after a few misses the cache stops cutting.
    tok = cached("wordpiece")[0]
    cache = prefixcache.PrefixCache(tok, min_chunk_chars=64, split_chars=100, pieces=2)
    for i in range(12):
        assert_same(tok, cache, CORPUS[i * 1_000 : i * 1_000 + 900])
    assert cache.splitter.misses == 9 and cache.splitter.splits == 0
    assert cache.splitter.cuts(CORPUS[:900], 0) == []


def test_the_seam_is_the_last_matched_chunk_when_the_text_follows_its_continuation() -> None:
    """A warm chat: the system prompt was seen with another question. When the new text shares at
    least `margin` characters with the cached chunk after the last one it matches, only what
    follows that chunk is encoded; otherwise that chunk is encoded again as the window. (Without
    the cut rule, which proves a seam at the last matched chunk from the text alone.)"""
    tok, cache = _fresh(min_chunk_chars=64, cut_rule=False)
    system = CORPUS[:6_000]
    cache.encode(system + "\n<|user|>\nPlease answer carefully. What is a token?")
    shrunk = 0
    for n in range(0, 160, 8):
        text = system + "\n<|user|>\nPlease answer carefully. " + CORPUS[9_000 : 9_000 + n] + " Why?"
        path = cache.lookup(text).path
        last = path[-1]
        follows = [
            child
            for found in last.children.values()
            for child in (found if isinstance(found, list) else [found])
            if text.startswith(child.text[: cache.margin], last.end) and len(child.text) >= cache.margin
        ]
        seam = last if follows else path[-2]
        before = cache.encoded_tokens
        assert cache.encode(text) == tok.encode(text)
        assert cache.encoded_tokens - before == len(tok.encode(text[seam.end :], add_special_tokens=False))
        assert cache._memo is not None and cache._memo.path[-1] is seam
        shrunk += seam is last
    assert shrunk > 5 and cache.fallbacks == 0


@pytest.mark.parametrize("cut_rule", [True, False])
def test_user_messages_after_a_shared_prompt_do_not_pile_up_under_one_key(cut_rule: bool) -> None:
    """Each text leaving a cached one partway ends its first new chunk where it leaves it, so the
    next chunks are keyed by what differs: a lookup compares a few children, not one per request."""
    for length in range(6_000, 6_200, 25):  # the prompt's last chunk ends at varying distances
        tok, cache = _fresh(cut_rule=cut_rule)
        for i in range(12):
            text = CORPUS[:length] + "\n<|user|>\n" + CORPUS[8_000 + 300 * i : 8_000 + 300 * i + 250]
            assert cache.encode(text) == tok.encode(text)
        widest = max(
            len(found) if isinstance(found, list) else 1
            for node in [cache.trie.root, *cache.trie.lru]
            for found in node.children.values()
        )
        assert widest <= 2, length
        assert cache.partial_hits == 11 and cache.fallbacks == 0


def test_begin_on_the_loop_raises_would_block_before_a_long_tokenizers_encode() -> None:
    """With `blocking_chars`, a text whose reuse needs `tokenizers` past that many characters (here
    a miss) raises before any work or count; the same call without it answers exactly."""
    tok, cache = _fresh()
    text = CORPUS[:6000]
    with pytest.raises(pieces.WouldBlock):
        cache.begin(text, fast=False, blocking_chars=256)
    assert cache.misses == 0 and cache.nodes == 0
    ids, commit = cache.begin(text, fast=True, blocking_chars=256)  # the fast engine needs no tokenizers
    commit()
    assert ids == tok.backend.encode(text).ids and cache.misses == 1


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread niceness is Linux's")
def test_commit_steps_run_on_a_lower_priority_thread(
    track: Callable[[registry.Tokenizers], registry.Tokenizers],
) -> None:
    toks = track(registry.Tokenizers(default=tokenizer.load_shipped(), workers=1))
    niceness = toks._committer.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    assert niceness.result(timeout=10) == os.getpriority(os.PRIO_PROCESS, 0) + pool_work.COMMIT_NICENESS


@pytest.mark.parametrize(
    "n", [0, 1, chunktrie.LIST_SLICE - 1, chunktrie.LIST_SLICE, 2 * chunktrie.LIST_SLICE + 5]
)
def test_as_list_is_tolist_in_slices(n: int) -> None:
    ids = array.array("I", range(7, 7 + n))
    assert chunktrie.as_list(ids) == ids.tolist()
