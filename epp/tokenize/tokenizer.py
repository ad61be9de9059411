"""One model's tokenizer, loaded from Hugging Face files, and the epp-tiny tokenizer shipped with epp.

`Tokenizer.load(path)` takes a directory holding `tokenizer.json`, or that file itself; the
`tokenizer_config.json` and `chat_template.jinja` beside it are read when present (they name the
BOS/EOS tokens and carry the chat template). Only the fast-tokenizer format is supported: a
directory with just a sentencepiece `tokenizer.model` is refused with a message saying so. Every
failure is a `TokenizerError` naming the file and what is wrong with it.

`encode` is "plain" tokenization: the text through the tokenizer's normaliser, pre-tokeniser,
model and post-processor, as `transformers`' `tokenizer(text)` does for a fast tokenizer with
`add_special_tokens`. Settings that `transformers` applies on top of `tokenizer.json` for some
tokenizer classes (Llama's `add_bos_token`/`add_eos_token` rebuilding the post-processor, for
one) are not applied: the tokenizer.json's post-processor is taken as it is. vLLM-identical
tokenization is a separate step built on this one.

Engine. `encode` runs on fastokens (a Rust reimplementation of the `tokenizers` pipeline from the
same tokenizer.json: PCRE2-JIT pre-tokenization, caches of pre-token ids, ids only) when it loads
the tokenizer.json and gives the same ids as `tokenizers` on ENGINE_PROBES, with and without
special tokens; otherwise, or with EPP_TOKENIZER_ENGINE=tokenizers in the environment, on
`tokenizers` itself, which vLLM uses. Measured on epp-tiny, 2 vCPUs (`tests/tokenize/bench_tokenize.py
engines`): ~800 tokens of this repository's prose and code in 0.12-0.19 ms against 0.48-0.68 ms,
fastokens alone 4-6x `tokenizers` up to 100k tokens (texts that long are not given to it: "Memory"
below). A tokenizer fastokens refuses (Metaspace, BertPreTokenizer) or
encodes differently on a probe stays on `tokenizers` (`engine_note` says why). `backend` is always
the `tokenizers` object: offsets, word ids, decoding and the vocabulary come from it, and the prefix
cache re-encodes with it off the request path, so every text it caches also checks fastokens' ids
(`disable_fast` on a difference or an error: the tokenizer stays on `tokenizers` from then).
Exactness is tested with hypothesis over generated texts and every Unicode code point in contexts
(tests/tokenize/test_engine.py).

Memory. fastokens caches the ids of every pre-token it encodes, bounded in entries, not bytes, and
keeps its pools' capacity after a clear: texts of long unique pre-tokens (runs of rare characters)
grew the process by ~95 KB per 2,000-character text, 1.9 GB after 20,000 of them. So a text goes to
fastokens only when it is at most MAX_FAST_CHARS long and no run of word characters, of other
non-space characters, or of spaces is longer than MAX_RUN_CHARS (MAX_ASCII_RUN_CHARS for the
alphanumeric or other runs of an ASCII word; `FastEngine.takes`, in C: ~3.5 ns a character), and
only if the tokenizer's pre-tokens end at spaces (checked at load). The same flood with runs of 32
random rare characters levelled off at +227 MB on one thread, with ASCII words of 128 random
letters at +180 MB. Other texts go to `tokenizers`: 1-2% of 1,700- and 4,096-character pieces of
this repository, 6% of 10,800-character ones (whitespace runs, long non-ASCII words), and every
text over MAX_FAST_CHARS (the scan holds the GIL; the prefix cache hands fastokens a longer text
in pieces, each checked: `prefixcache`, `cutrules`). kitoken (no caches, faster still) was measured
too and not taken: the code-point sweep found it splitting `\t's` apart where `tokenizers` keeps
the contraction, and 3 Unicode 16 letters.

GIL (measured with tokenizers 0.23.3 on 2 vCPUs; tests/tokenize/bench_tokenize.py):
`tokenizers.Tokenizer.encode` holds the GIL for the whole call: run in a worker thread, a 16k-token
encode stalled the event loop for 20-30 ms, a 100k-token one for ~200 ms. `encode_batch` and
`encode_batch_fast` release it: the loop's lag stayed at p99 ~1 ms, max 3-4 ms. `encode_batch_fast`
also skips character offsets, which epp never reads, and is the fastest of the three: 100k tokens
of this repository's Markdown and code in 100-140 ms against 160-210 ms for `encode` (16k: 21-28
against 25-36 ms; the VM's timings vary by ~30%). So `Tokenizer.encode` calls
`encode_batch_fast([text])`. That single-item batch runs on tokenizers' rayon pool (or in the
calling thread with TOKENIZERS_PARALLELISM=false; both measured the same). tokenizers' own
`async_encode*` run on a tokio pool that grew to ~100 OS threads under 64 concurrent encodes and
lagged the loop by 100-150 ms on 2 vCPUs, so epp does not use them. fastokens' `encode` releases
the GIL too (a thread encoding 100k-token texts back to back: the loop's ticks' p99 gap 2.6 ms).
"""

from __future__ import annotations

import array
import json
import logging
import os
import sys
import threading
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fastokens
import tokenizers

from epp.tokenize import _runs

# fastokens spreads a batch's BPE over threads that spin while they wait: the ~700 pieces of a
# 270k-character prompt took 36 ms of CPU for 20 ms of wall time, one thread 24 ms for 24 ms. epp
# serves many requests at once on few cores, so CPU is what counts. fastokens reads it at first use.
os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")

SHIPPED_NAME = "epp-tiny"
SHIPPED_DIR = Path(__file__).resolve().parent / "data"
"""epp-tiny's files (scripts/build_tokenizer.py builds them): byte-level BPE, 8,192 ids, BOS `<s>` = 1."""

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"

ENGINE_ENV = "EPP_TOKENIZER_ENGINE"
"""`tokenizers` keeps every tokenizer on the `tokenizers` engine; unset or `auto`: fastokens when it
agrees (module docstring)."""

MAX_FAST_CHARS = 16_384
"""Longer texts go to `tokenizers`: `FastEngine.takes` holds the GIL for its scan, and on cold
100k-token prompts that lagged the event loop (p99 26 ms against 7 ms, when the scan cost ~20 ns
a character in Python)."""
MAX_RUN_CHARS = 32
MAX_ASCII_RUN_CHARS = 128
"""fastokens takes a text only when no run of word characters, of other non-space characters, or of
spaces is longer (MAX_ASCII_RUN_CHARS within an ASCII word): its caches grow with long unique
pre-tokens (module docstring, "Memory")."""
# Every pre-token of the GPT-2, Llama 3 and Qwen patterns is one such run (plus a leading
# character, and newlines after punctuation): letters and numbers are word characters (`\w`),
# `_` and the separators `\x1c-\x1f` (Python's whitespace, not the tokenizers') count as other.
# The rule is checked in C (epp/tokenize/_runs.c: one pass, CPython's character classes): its
# Python form (str.split() and three regexes, the oracle of tests/tokenize/test_runs.py) cost
# 8.7 ms over the 730 pieces of a cold 100k-token prompt (~85 ms in all on a slow 2-core VM),
# the C one 1.4 ms.
ENGINES = ("auto", "tokenizers")

ENGINE_PROBES = (
    "Hello world",
    "",
    " ",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nnewlines\n\n\n  \n",
    "numbers 1 12 123 1234 12345 3.14159 -7 1,000,000",
    "it's they're we've I'm you'll he'd IT'S THEY'RE",
    'punctuation!?... "quoted" (parens) [brackets] {braces} <angle> a/b\\c',
    "def f(x):\n    return x ** 2  # comment\n",
    "日本語のテキスト、中文\uff0c한국어 텍스트",  # a fullwidth comma
    "Ünïcödé café naïve résumé İstanbul straße ΩΣ",
    "emoji 👍🏽 👨\u200d👩\u200d👧 🇫🇷",
    "combining e\u0301 a\u0308 \u0915\u094d\u0937",
    "zero\u200bwidth\u00a0nbsp\u3000ideographic",
    "   \n\n   ",
    "x" * 300,
    " " * 300 + "end",
)
"""Texts fastokens must encode exactly as `tokenizers` does before it is used (with and without
special tokens; each tokenizer's added tokens are probed too)."""

log = logging.getLogger("epp.tokenize")


class TokenizerError(Exception):
    """A tokenizer could not be loaded; the message names the path and the problem."""


class Tokenizer:
    """A loaded tokenizer for one model. Immutable; safe to share between threads."""

    __slots__ = (
        "_backend",
        "_fast",
        "bos_token_id",
        "chat_template",
        "engine_note",
        "eos_token_id",
        "model_max_length",
        "name",
        "path",
        "special_tokens",
    )

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        name: str,
        path: Path | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str | list[str]] | None = None,
        engine: str | None = None,
        model_max_length: int | None = None,
    ) -> None:
        self._backend = backend
        # `engine`: one of ENGINES; None reads ENGINE_ENV. One assignment swaps `_fast` (to None in
        # `disable_fast`): threads encoding meanwhile see the old or the new engine.
        self._fast, self.engine_note = _fast_engine(backend, _engine_choice(engine))
        self.name = name  # for logs and metrics: the model directory's name unless given
        self.path = path  # the tokenizer.json it was loaded from, if any
        self.bos_token_id = bos_token_id  # from tokenizer_config.json's bos_token; None if not named
        self.eos_token_id = eos_token_id
        # tokenizer_config.json's context length, the last fallback for vLLM's max_model_len
        # (epp.api.context_length); None when absent or Hugging Face's "unset" value.
        self.model_max_length = model_max_length
        self.chat_template = chat_template  # Jinja source; chat_template.jinja wins over the config's
        # The config's special-token strings by name (bos_token, eos_token, ..., and the list
        # additional_special_tokens): chat templates read them as variables, as transformers passes them.
        self.special_tokens: Mapping[str, str | list[str]] = types.MappingProxyType(
            dict(special_tokens or {})
        )

    @classmethod
    def load(cls, path: str | Path, *, name: str | None = None, engine: str | None = None) -> Tokenizer:
        """Load from a directory holding tokenizer.json, or from a tokenizer.json file. `engine`:
        one of ENGINES (default: ENGINE_ENV's, else "auto").

        Raises:
            TokenizerError: the path is missing, or a file is unreadable or malformed.
        """
        given = Path(path)
        if given.is_dir():
            file = given / TOKENIZER_FILE
            if not file.is_file():
                hint = (
                    "; its sentencepiece tokenizer.model is not supported (transformers can save the"
                    " tokenizer as tokenizer.json)"
                    if (given / "tokenizer.model").exists()
                    else ""
                )
                raise TokenizerError(f"{given}: no {TOKENIZER_FILE} in this directory{hint}")
        elif given.exists():
            file = given
        else:
            raise TokenizerError(f"{given}: no such file or directory")
        folder = file.parent
        backend = _backend(file)
        config = _config(folder / CONFIG_FILE)
        template = _template_file(folder / TEMPLATE_FILE)
        if template is None:
            template = _config_template(config, folder / CONFIG_FILE)
        made = cls(
            backend,
            name=name or folder.resolve().name,
            path=file,
            bos_token_id=_special_id(backend, config, "bos_token", folder / CONFIG_FILE),
            eos_token_id=_special_id(backend, config, "eos_token", folder / CONFIG_FILE),
            chat_template=template,
            special_tokens=_special_strings(config),
            engine=engine,
            model_max_length=_model_max_length(config),
        )
        log.info("tokenizer %s (%s): encoding with %s: %s", made.name, file, made.engine, made.engine_note)
        return made

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer`, for what this class does not wrap (decode, vocab)."""
        return self._backend

    @property
    def engine(self) -> str:
        """ "fastokens" or "tokenizers": what `encode` runs on now (see the module docstring)."""
        return "tokenizers" if self._fast is None else "fastokens"

    @property
    def fast(self) -> FastEngine | None:
        """The fastokens engine while it is in use, else None."""
        return self._fast

    def disable_fast(self, reason: str) -> None:
        """Encode with `tokenizers` from now on (fastokens failed or gave other ids); logged once."""
        if self._fast is None:
            return
        self._fast = None
        self.engine_note = reason
        log.warning("tokenizer %s: fastokens disagreed with tokenizers, now off: %s", self.name, reason)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The token ids of `text`; with `add_special_tokens`, as the post-processor adds them (BOS).

        Releases the GIL while it works (see the module docstring), so it may run in a thread
        beside the event loop.
        """
        fast = self._fast
        if fast is not None and fast.takes(text):
            ids = self.encode_fast(text, add_special_tokens=add_special_tokens)
            if ids is not None:
                return ids
        return self._backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_fast(self, text: str, *, add_special_tokens: bool) -> list[int] | None:
        """fastokens' ids for a text the caller checked with `FastEngine.takes`; None when fastokens
        is off, or fails on it (it is then turned off)."""
        fast = self._fast
        if fast is None:
            return None
        try:
            return fast.encode(text, add_special_tokens=add_special_tokens)
        except Exception as e:  # fastokens raises where tokenizers drops a byte it has no id for
            self.disable_fast(f"fastokens failed on a {len(text)}-character text: {e}")
            return None

    def encode_fast_pieces(self, texts: list[str]) -> tuple[array.array[int], array.array[int]] | None:
        """fastokens' ids of each of `texts` (each checked with `FastEngine.takes`), without
        special tokens: all the ids in one array, and where each text's start (`len(texts) + 1`
        offsets). None when fastokens is off, or fails (it is then turned off)."""
        fast = self._fast
        if fast is None:
            return None
        try:
            return fast.encode_pieces(texts)
        except Exception as e:  # as in `encode_fast`
            self.disable_fast(f"fastokens failed on {len(texts)} pieces of text: {e}")
            return None

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, path={str(self.path)!r})"


def _engine_choice(engine: str | None) -> str:
    choice = engine if engine is not None else (os.environ.get(ENGINE_ENV) or "auto")
    if choice not in ENGINES:
        raise TokenizerError(f"{ENGINE_ENV}={choice!r}: expected one of {', '.join(ENGINES)}")
    return choice


class FastEngine:
    """fastokens for one tokenizer.json, and which texts it may take (`takes`). Safe to share
    between threads.

    fastokens pre-tokenizes with regex-automata, whose regexes keep their search caches in a pool:
    the first thread that ever searches with a regex owns one cache and takes it without a lock;
    every other thread pops one from a mutex-guarded stack and pushes it back, on every search. The
    probes (`_fast_engine`) run on the loading thread, never the one that encodes long prompts, so
    those paid that on each pre-token: 0.3-0.35 ms of a seen 100k-token prompt's ~2.6 ms in the
    tokenizer thread (`tests.requestcontrol.bench_long_prompts steady`), as much as the regex VM
    itself. So the first batch of pieces (a long text: `fast_pieces`) starts a second instance's
    build in the background (`_build`: 70 ms for epp-tiny, ~0.3 s at 60k tokens of vocabulary,
    the GIL mostly released), and the next batch, in a worker thread, searches with it first and
    swaps it in (`_owned`). One instance at a time stays alive; a pool of several workers has one
    owner among them, the others as before."""

    __slots__ = ("_fast", "_fresh", "_json")

    def __init__(self, fast: fastokens.Tokenizer, spec: str | None = None) -> None:
        self._fast = fast
        # The tokenizer.json (0.2 MB for epp-tiny, ~10 MB for a 128k vocabulary), held until the
        # owned instance is built from it: never, for a tokenizer that sees no long prompt.
        self._json = spec
        self._fresh: fastokens.Tokenizer | None = None

    def _owned(self) -> fastokens.Tokenizer:
        """The instance to encode with in this thread, adopting or starting the owned one."""
        fresh = self._fresh
        if fresh is not None:
            self._fresh = None  # (two threads racing here both search with it: the first owns)
            try:
                for probe in ENGINE_PROBES:
                    fresh.encode(probe, add_special_tokens=False)
            except Exception as e:  # as in `Tokenizer.encode_fast`: the first instance stays
                log.debug("fastokens: the second instance failed, keeping the first: %s", e)
            else:
                self._fast = fresh
        elif self._json is not None:
            spec, self._json = self._json, None
            threading.Thread(target=self._build, args=(spec,), name="epp-fastokens", daemon=True).start()
        return self._fast

    def _build(self, spec: str) -> None:
        try:
            self._fresh = fastokens.Tokenizer.from_json_str(spec)
        except Exception as e:  # it loaded once; if it no longer does, the first one serves
            log.debug("fastokens: a second instance cannot be built: %s", e)

    @staticmethod
    def takes(text: str, start: int = 0) -> bool:
        """Whether `text[start:]` is at most MAX_FAST_CHARS long with no run longer than
        MAX_RUN_CHARS (module docstring, "Memory"; the rule in full: epp/tokenize/_runs.c).
        A part too long is refused before it is read; nothing is copied."""
        if len(text) - start > MAX_FAST_CHARS:
            return False
        return _runs.fits(text, start, MAX_RUN_CHARS, MAX_ASCII_RUN_CHARS)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        ids: list[int] = self._fast.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def encode_pieces(self, texts: list[str]) -> tuple[array.array[int], array.array[int]]:
        """`Tokenizer.encode_fast_pieces`: one flat buffer from fastokens, no Python int per token
        until the caller asks (a 270k-character text in ~700 pieces on one thread: 24-27 ms of CPU,
        as one text 20-22 ms)."""
        flat, bounds = self._owned().encode_batch_flat(texts, add_special_tokens=False)
        ids = array.array("I")
        ids.frombytes(flat)
        starts = array.array("Q")
        starts.frombytes(bounds)
        if sys.byteorder == "big":  # fastokens writes little-endian
            ids.byteswap()
            starts.byteswap()
        return ids, starts


def _fast_engine(backend: tokenizers.Tokenizer, choice: str) -> tuple[FastEngine | None, str]:
    """fastokens for `backend`'s pipeline if it loads and agrees on the probes, and why not if not."""
    if choice == "tokenizers":
        return None, f"{ENGINE_ENV}=tokenizers"
    # Pre-tokens must end at spaces, or `takes` does not bound them: without a pre-tokenizer (Llama
    # 2 style) a whole text is one.
    words = backend.encode("ab " * 60, add_special_tokens=False).word_ids
    if not words or max(words.count(w) for w in set(words)) > 4:
        return None, "its pre-tokens do not end at spaces, so fastokens' caches would hold whole texts"
    spec = backend.to_str()
    try:
        fast = FastEngine(fastokens.Tokenizer.from_json_str(spec), spec)
    except Exception as e:  # fastokens raises ValueError and others for what it does not implement
        return None, f"fastokens cannot load it: {e}"
    added = [t.content for t in backend.get_added_tokens_decoder().values()]
    probes = [*ENGINE_PROBES, " ".join(added), "a" + "b ".join(added) + "\n"]
    for probe in probes:
        for special in (True, False):
            want = backend.encode(probe, add_special_tokens=special).ids
            try:
                got = fast.encode(probe, add_special_tokens=special)
            except Exception as e:
                return None, f"fastokens fails on {probe[:40]!r}: {e}"
            if got != want:
                return None, f"fastokens differs on {probe[:40]!r} (add_special_tokens={special})"
    return fast, "fastokens agreed on every probe"


def load_shipped(*, engine: str | None = None) -> Tokenizer:
    """epp-tiny, the tokenizer shipped in the package; the default when none is configured."""
    return Tokenizer.load(SHIPPED_DIR, name=SHIPPED_NAME, engine=engine)


def _backend(file: Path) -> tokenizers.Tokenizer:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{file}: cannot read: {e}") from e
    try:
        return tokenizers.Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise TokenizerError(f"{file}: not a valid tokenizer.json: {e}") from e


def _config(file: Path) -> dict[str, Any]:
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{file}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{file}: invalid JSON: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


# transformers writes int(1e30) (its VERY_LARGE_INTEGER) when a tokenizer has no length of its own.
_UNSET_LENGTH = int(1e30)


def _model_max_length(config: Mapping[str, Any]) -> int | None:
    """`model_max_length` when it is a real length: a positive integer below transformers' sentinel
    (written as an int or, by some tools, a float)."""
    value = config.get("model_max_length")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    length = int(value)
    return length if 0 < length < _UNSET_LENGTH else None


def _template_file(file: Path) -> str | None:
    if not file.exists():
        return None
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{file}: cannot read: {e}") from e


def _config_template(config: dict[str, Any], file: Path) -> str | None:
    """The config's `chat_template`: a string, or a list of named templates ("default" is used)."""
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item.get("name") == "default":
                template = item.get("template")
                if isinstance(template, str):
                    return template
        return None
    raise TokenizerError(f"{file}: chat_template must be a string or a list, got {type(value).__name__}")


SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _special_strings(config: Mapping[str, Any]) -> dict[str, str | list[str]]:
    """The special tokens the config names, as strings (AddedToken objects give their content).

    Only tokens that are set appear, as in transformers' `special_tokens_map`: a template testing
    `pad_token is defined` sees the same answer.
    """
    found: dict[str, str | list[str]] = {}
    for key in SPECIAL_TOKEN_NAMES:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[key] = value
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        texts = [t.get("content") if isinstance(t, dict) else t for t in extra]
        strings = [t for t in texts if isinstance(t, str)]
        if strings:
            found["additional_special_tokens"] = strings
    return found


def _special_id(backend: tokenizers.Tokenizer, config: dict[str, Any], key: str, file: Path) -> int | None:
    """The id of the config's `bos_token`/`eos_token`: a string or an AddedToken object {"content": ...}."""
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    if value is None:
        return None
    if not isinstance(value, str):
        raise TokenizerError(f"{file}: {key} must be a string or an object with content")
    token_id = backend.token_to_id(value)
    if token_id is None:
        raise TokenizerError(f"{file}: {key} {value!r} is not in the tokenizer's vocabulary")
    return token_id
