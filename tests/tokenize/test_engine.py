"""fastokens, the fast engine: the same ids as `tokenizers` (hypothesis over generated texts, every
Unicode code point, pathological runs), refused where it does not apply, kept from texts with long
runs, and turned off at run time when it fails or disagrees."""

from __future__ import annotations

import array
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import fastokens
import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from e2e.vllm import build_model
from epp.tokenize import prefixcache, tokenizer
from tests.tokenize import test_prefixcache as tp


def sentencepiece_like() -> tokenizer.Tokenizer:
    """Llama 2 / Mistral shape: no pre-tokenizer, `▁` for spaces by normalizers (Prepend, Replace),
    byte-fallback BPE with an unknown token, BOS added. fastokens encodes it as tokenizers does, but
    a whole text is one pre-token here, so it stays on tokenizers (its caches would hold texts)."""
    tok = tokenizers.Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    tp._train(tok, trainers.BpeTrainer(vocab_size=800, special_tokens=["<unk>", "<s>", "</s>", *bytes_]))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tokenizer.Tokenizer(tok, name="sentencepiece-like")


def vllm_e2e(tmp: Path) -> tokenizer.Tokenizer:
    """The tokenizer the real-vLLM suite serves: epp-tiny plus special and non-special added tokens."""
    build_model.build_tokenizer(tmp)
    return tokenizer.Tokenizer.load(tmp)


_built: dict[str, tokenizer.Tokenizer] = {}


def built(name: str, tmp_path_factory: pytest.TempPathFactory) -> tokenizer.Tokenizer:
    if name not in _built:
        makers: dict[str, Callable[[], tokenizer.Tokenizer]] = {
            "epp-tiny": tokenizer.load_shipped,
            "llama3-like": tp.llama3_like,
            "gpt2-like": tp.gpt2_like,
            "vllm-e2e": lambda: vllm_e2e(tmp_path_factory.mktemp("vllm-tokenizer")),
        }
        _built[name] = makers[name]()
    return _built[name]


NAMES = ["epp-tiny", "gpt2-like", "llama3-like", "vllm-e2e"]


def assert_same(tok: tokenizer.Tokenizer, text: str) -> None:
    for special in (True, False):
        want = tok.backend.encode(text, add_special_tokens=special).ids
        assert tok.encode(text, add_special_tokens=special) == want, (text[:200], special)


@pytest.mark.parametrize("name", NAMES)
def test_these_tokenizers_run_on_fastokens(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    tok = built(name, tmp_path_factory)
    assert tok.engine == "fastokens", tok.engine_note
    assert isinstance(tok.fast, tokenizer.FastEngine)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(text=tp.texts)
def test_same_ids_as_tokenizers_on_generated_texts(
    name: str, text: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tok = built(name, tmp_path_factory)
    assert_same(tok, text)
    assert tok.engine == "fastokens"  # never turned off on the way


def _contexts(code: int) -> str:
    """One code point where the pre-tokenizer patterns decide differently by its category: after a
    letter, after a space, doubled, before a digit and a contraction, after a newline."""
    c = chr(code)
    return f"a{c} {c}{c}1{c}'s\r\n {c}"


@pytest.mark.parametrize("name", ["epp-tiny", "llama3-like"])
def test_same_ids_for_every_unicode_code_point(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Unicode tables differ between regex engines (PCRE2 in fastokens, Oniguruma in tokenizers):
    every code point but the surrogates, in contexts, 1,024 to a text; straight to fastokens (past
    `takes`: these texts have long runs of rare letters)."""
    tok = built(name, tmp_path_factory)
    # Planes 4-13 are unassigned (one category, Cn): every 64th of them is enough.
    codes = [
        c
        for c in range(0x110000)
        if not 0xD800 <= c <= 0xDFFF and (c < 0x40000 or c >= 0xE0000 or c % 64 == 0)
    ]
    groups = [codes[at : at + 1024] for at in range(0, len(codes), 1024)]
    texts = ["\n".join(_contexts(c) for c in group) for group in groups]
    want = [e.ids for e in tok.backend.encode_batch_fast(texts)]
    assert tok.fast is not None
    got = [tok.fast.encode(text, add_special_tokens=True) for text in texts]
    bad = [hex(c) for k, group in enumerate(groups) if got[k] != want[k] for c in group if _differs(tok, c)]
    assert not bad, f"{name}: fastokens differs on code points {bad[:20]} ({len(bad)} in all)"


def _differs(tok: tokenizer.Tokenizer, code: int) -> bool:
    assert tok.fast is not None
    return bool(
        tok.fast.encode(_contexts(code), add_special_tokens=True) != tok.backend.encode(_contexts(code)).ids
    )


@pytest.mark.parametrize("name", NAMES)
def test_same_ids_on_long_runs(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Runs that make backtracking regexes work hard (`\\s+(?!\\S)`), and long words and numbers:
    `takes` keeps them from fastokens, and fastokens itself agrees on them too."""
    tok = built(name, tmp_path_factory)
    assert tok.fast is not None
    for text in (
        " " * 50_000,
        "\n" * 5_000 + " " * 5_000 + "x",
        " \n" * 10_000,
        "a" * 50_000,
        "1" * 30_000,
        "'" * 20_000,
        "\r\n\r\n  \t" * 3_000,
        "é" * 10_000 + "e\u0301" * 5_000,
    ):
        assert not tok.fast.takes(text)
        assert_same(tok, text)
        assert tok.fast.encode(text, add_special_tokens=True) == tok.backend.encode(text).ids


def test_takes_from_a_start_as_it_takes_the_slice() -> None:
    takes = tokenizer.FastEngine.takes
    most = tokenizer.MAX_FAST_CHARS
    seen = "word " * (most // 5 + 10)  # a cached part longer than the fast engine's limit
    for tail in ("new words here", " " * 40, "x" * (tokenizer.MAX_RUN_CHARS + 1), "y " * most):
        text = seen + tail
        for start in (0, len(seen), len(seen) + 3, len(text)):
            assert takes(text, start) == takes(text[start:]), (tail[:10], start)
    assert takes(seen + "new words", len(seen)) and not takes(seen + "new words")


def test_takes_bounds_every_kind_of_run() -> None:
    takes = tokenizer.FastEngine.takes
    limit = tokenizer.MAX_RUN_CHARS
    for unit in ("é", "日", "²", "²1", "\u0301", "é_"):  # in a word with non-ASCII characters
        short, long = unit * (limit // len(unit)), unit * (limit + 1)
        assert takes(f"x {short} y"), repr(unit)
        assert not takes(f"x {long} y"), repr(unit)
    ascii_limit = tokenizer.MAX_ASCII_RUN_CHARS
    for unit in ("a", "1", "a1", "_", "-", "!?", "_-"):  # in an ASCII word
        short, long = unit * (ascii_limit // len(unit)), unit * (ascii_limit + 1)
        assert takes(f"x {short} y"), repr(unit)
        assert not takes(f"x {long} y"), repr(unit)
    assert takes("x " + "ab-" * 100 + " y")  # a long word of short runs
    for unit in (" ", "\t", "\n", "\u3000", "\n\t"):
        short, long = unit * (limit // len(unit)), unit * (limit + 1)
        assert takes(f"x{short}y"), repr(unit)
        assert not takes(f"x{long}y"), repr(unit)
    assert not takes("x" + "\x1c" * 40 + "y")  # a separator: whitespace to Python, other to tokenizers
    # Long whitespace-free strings whose pre-tokens are short pass: the runs are of each class.
    assert takes("https://example.com/some/path/to/a/page.html?query=1&b=2")
    assert takes(("word. " * 400)[:1700])


# -- where fastokens is not used ---------------------------------------------------------------------


def test_tokenizers_whose_pre_tokens_do_not_end_at_spaces_stay_on_tokenizers() -> None:
    tok = sentencepiece_like()
    assert tok.engine == "tokenizers" and tok.fast is None
    assert "pre-tokens do not end at spaces" in tok.engine_note, tok.engine_note
    text = "Ünïcödé and bytes \x0c\x1a without pieces"
    assert tok.encode(text) == tok.backend.encode(text).ids


def test_pipelines_fastokens_does_not_implement_stay_on_tokenizers() -> None:
    wordpiece = tp.wordpiece()
    assert wordpiece.engine == "tokenizers" and wordpiece.fast is None
    assert "BertPreTokenizer" in wordpiece.engine_note


def test_a_tokenizer_fastokens_fails_on_a_probe_stays_on_tokenizers() -> None:
    """A byte-level BPE missing most bytes: tokenizers drops them, fastokens raises."""
    small = tokenizers.Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2, "Ġ": 3}, merges=[("a", "b")]))
    small.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = tokenizer.Tokenizer(small, name="small")
    assert tok.engine == "tokenizers" and "fails on" in tok.engine_note, tok.engine_note
    assert tok.encode("ab ba Hello") == small.encode("ab ba Hello").ids


def test_the_environment_can_turn_fastokens_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tokenizer.ENGINE_ENV, "tokenizers")
    tok = tokenizer.load_shipped()
    assert tok.engine == "tokenizers" and tokenizer.ENGINE_ENV in tok.engine_note
    assert tokenizer.load_shipped(engine="auto").engine == "fastokens"  # an explicit choice wins
    monkeypatch.setenv(tokenizer.ENGINE_ENV, "fast")
    with pytest.raises(tokenizer.TokenizerError, match="EPP_TOKENIZER_ENGINE='fast': expected one of auto"):
        tokenizer.load_shipped()


def test_long_texts_move_to_an_instance_first_searched_by_their_own_thread() -> None:
    """The probes ran on the loading thread; the first batch of pieces starts a second instance,
    and a later batch adopts it in its own thread (the regex caches' owner): same ids throughout."""
    tok = tokenizer.load_shipped()
    engine = tok.fast
    assert engine is not None
    first = engine._fast
    pieces = ["routing by prefix ", "keeps the cache warm\n", "and the first token early. " * 3]
    want = [tok.encode(p, add_special_tokens=False) for p in pieces]

    def encode_in_a_thread() -> list[list[int]]:
        out: list[tuple[array.array[int], array.array[int]]] = []
        worker = threading.Thread(target=lambda: out.append(engine.encode_pieces(pieces)))
        worker.start()
        worker.join()
        flat, starts = out[0]
        return [flat[starts[k] : starts[k + 1]].tolist() for k in range(len(pieces))]

    assert encode_in_a_thread() == want  # starts the build
    deadline = time.monotonic() + 30
    while engine._fresh is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine._fresh is not None and engine._json is None
    assert encode_in_a_thread() == want  # adopts it
    assert engine._fast is not first and engine._fresh is None
    assert encode_in_a_thread() == want
    assert tok.encode_fast(pieces[2], add_special_tokens=False) == want[2]


# -- turned off at run time ----------------------------------------------------------------------------


def test_an_encode_fastokens_fails_on_is_answered_by_tokenizers_and_turns_it_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tok = tokenizer.load_shipped()
    # A real fastokens for a vocabulary without most bytes: it raises where a text needs them.
    broken = tokenizers.Tokenizer(models.BPE(vocab={"a": 0, "Ġ": 1}, merges=[]))
    broken.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    fast = fastokens.Tokenizer.from_json_str(broken.to_str())
    with pytest.raises(ValueError, match="no token"):
        fast.encode("Hello")
    tok._fast = tokenizer.FastEngine(fast)
    with caplog.at_level(logging.WARNING, logger="epp.tokenize"):
        assert tok.encode("Hello world") == tok.backend.encode("Hello world").ids
    assert tok.engine == "tokenizers" and "failed" in tok.engine_note
    assert "fastokens disagreed with tokenizers, now off" in caplog.text
    assert tok.encode("Hello again") == tok.backend.encode("Hello again").ids


def test_the_prefix_cache_checks_fastokens_ids_and_turns_it_off_on_a_difference() -> None:
    """The commit step re-encodes with tokenizers; fastokens loaded from a tokenizer.json that has
    one added token more ("question") stands in for one that disagrees on rare text. Only the
    request answered before the check got the other ids; the cache holds tokenizers' and every
    later answer is exact."""
    tok = tokenizer.load_shipped()
    cache = prefixcache.PrefixCache(tok)
    system = tp.CORPUS[:3000]
    cache.encode(system)
    other = tokenizers.Tokenizer.from_str(tok.backend.to_str())
    other.add_tokens(["question"])
    tok._fast = tokenizer.FastEngine(fastokens.Tokenizer.from_json_str(other.to_str()))
    text = system + " second question?"
    ids, commit = cache.begin(text, fast=True)
    want = tok.backend.encode(text).ids
    assert ids != want  # answered with the other engine's ids for the new part
    commit()
    assert cache.engine_mismatches == 1
    assert tok.engine == "tokenizers" and "first difference at token" in tok.engine_note
    assert cache.encode(text) == want  # cached whole, from tokenizers' encoding
    more = system + " third question?"
    assert cache.encode(more) == tok.backend.encode(more).ids
