"""Which tokenizer serves which model, and tokenizing for the request path without stalling the loop.

Per-model tokenizers come from three sources (docs/tokenization.md shows each), in precedence order:
1. `--tokenizer MODEL=PATH` (repeatable; `parse_tokenizer_arg`), source FLAG;
2. the endpoints file's per-entry `tokenizer:` (for that entry's `model`), source ENDPOINTS_FILE,
   reloaded with the file (`reload_models`);
3. the EndpointPickerConfig's `tokenizer` plugins (llm-d's form: `modelName`, plus epp's `path`),
   source CONFIG.
A model named by several sources gets the first one's tokenizer: the command line is the operator's
override, the endpoints file describes the servers as they are now, the config is static and often
shared between pools. `--tokenizer PATH` (no `MODEL=`, at most one) is the default for every model
no source names. With no tokenizer named anywhere at start-up, every model gets epp-tiny, the
tokenizer shipped in the package (the one the simulator tokenizes with: `use_shipped_default`), so
text prompts route on real token ids out of the box; once any is named, epp-tiny is no longer
implied (the choice is made once, at start-up). Models without a tokenizer are counted per model
name in `missing` (`epp_tokenizer_missing_total{model}`) and routed without token ids.
In `MODEL=PATH` the first `=` splits, so a model name cannot contain `=` (a path may:
`llama=/models/a=b`), and a default PATH cannot either.

Loading: each resolved path is loaded once and shared by every model and source naming it; a path
is read when first named, so changing the files under a path already loaded needs a restart (or a
new path). At start-up (`load_models`) a missing or unreadable tokenizer is a `TokenizerError`
naming the model, the source and the path, and `epp serve` exits. On a reload (`reload_models`)
new paths load in a thread, never on the loop; a path that fails is logged at ERROR with the model
and the path, and that model keeps the tokenizer it had (if any).

Lookup for a request (`for_model`): the model's own tokenizer; else its base model's, when the
caller knows the model is a LoRA adapter of that base (adapters share their base's tokenizer);
else the default; else none.

`encode` runs on the event loop's behalf:
- Texts over `max_chars` (400,000 by default, ~100k tokens of English) are cut to that prefix
  first. Prefix routing only looks at the leading blocks, and the cut changes only the tokens of
  the last, cut word: every earlier id equals the full text's (byte-level BPE never merges across
  pre-token boundaries). It bounds the work a single request can cause (~0.1-0.2 s of one core).
- Texts of at most `INLINE_CHARS` are encoded on the loop itself: handing work to a thread and
  awaiting it cost the loop's thread ~100 us of CPU (measured), about what encoding 200-250
  characters costs with `tokenizers`. With the fast engine (`tokenizer.Tokenizer.fast`, ~0.08 us
  per character) the bound is FAST_INLINE_CHARS, ~0.3 ms of the loop's time, for texts it takes
  (`FastEngine.takes`): the hand-off and the wake-up of the awaiting task cost a warm 4k-token chat
  0.3-0.7 ms of latency (measured), more than the encode.
- Longer texts go through the tokenizer's `prefixcache.PrefixCache` (one per tokenizer, each
  bounded by `prefix_cache_bytes`, 64 MiB by default; 0 disables; tokenizers it cannot prove exact
  for are listed in `prefix_cache_refused` and encoded plainly): looked up on the loop (a text
  cached whole is answered there), else in a worker thread starting from that lookup, or on the
  loop when the fast engine takes the (at most FAST_INLINE_CHARS) text after the cached chunks
  (a seam that turns out to need `tokenizers` raises `pieces.WouldBlock` and goes to a
  worker). With the fast engine the request gets its ids before the cache's `commit` step (an
  insert of the fast engine's pieces where the cut rule holds, else the `tokenizers` encode that
  chunking needs, ~4x the fast one) runs on one more thread; at most
  MAX_PENDING_COMMITS wait for it, past that a text is not cached (counted in `commits_dropped`):
  under overload the cache stops growing rather than delaying requests. Without it (or for a text
  it does not take) the worker caches the text before answering, as the commit is then cheap.
- Longer texts go to a small ThreadPoolExecutor. `Tokenizer.encode` releases the GIL (see
  `epp.tokenize.tokenizer`), so the loop keeps running meanwhile. Encoding 16k- or 100k-token
  prompts back to back this way, the loop's lag was p99 ~1 ms, max 3-4 ms (idle: max 2 ms); on
  the loop, or in a thread with tokenizers' GIL-holding `encode`, every encode stalls the loop for
  its whole duration (20-30 ms for 16k tokens of this repository's text, ~200 ms for 100k).
- Workers default to the CPUs this process may use, at most 4. On 2 vCPUs, 64 concurrent
  4k-token encodes ran at 0.8-0.9M tokens/s with 1 worker (loop lag p99 1.0-1.2 ms), 1.4-1.6M
  with 2 (p99 3.5-4.4 ms) and 1.3M with 4 (p99 7-9 ms). Pass `workers=` lower to keep a core for the loop when
  latency matters more than tokenizing throughput; in a container with a CPU quota below the
  host's CPU count, set it to the quota. (tests/tokenize/bench_tokenize.py)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import types
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from epp.tokenize import cachecheck, chat, dialects, pieces, pool_work, prefixcache, tokenizer

# `--tokenizer` values, parsed (their own module; imported from here by callers).
from epp.tokenize.spec import TokenizerSpec as TokenizerSpec
from epp.tokenize.spec import parse_tokenizer_arg as parse_tokenizer_arg

DEFAULT_MAX_CHARS = 400_000
INLINE_CHARS = 256
FAST_INLINE_CHARS = 4096
# A text the prefix cache holds whole is answered on the loop up to this size (the hand-off to a
# worker costs the loop ~100 us); past it, copying its ids out takes longer than the hand-off.
CACHED_INLINE_CHARS = 65536
RENDER_INLINE_MESSAGES = 64  # ~0.3 ms of rendering: longer chats are rendered by a worker
MAX_PENDING_COMMITS = 16
# The work the pool may have queued, in characters per worker: ~2 s of encoding at ~4 M
# characters a second per worker. Past it `Saturated` is raised at once (the request is
# answered 503): an unbounded queue made a burst wait for everything before it.
BACKLOG_CHARS_PER_WORKER = 8_000_000
MAX_COUNTED_MODELS = 256  # distinct names kept in `missing`; the rest count under OTHER_MODELS
OTHER_MODELS = "<other>"

FLAG = "--tokenizer"
ENDPOINTS_FILE = "endpoints file"
CONFIG = "EndpointPickerConfig"
SOURCES = (FLAG, ENDPOINTS_FILE, CONFIG)
"""Where per-model tokenizers come from, highest precedence first."""

log = logging.getLogger("epp.tokenize")
_T = TypeVar("_T")


class Saturated(Exception):
    """The worker pool has more text queued than it encodes in about two seconds."""


def _default_workers() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cpus))


class Tokenizers:
    """Model name -> tokenizer, an optional default, and the off-loop `encode` the request path awaits.

    `missing` counts, per requested model name, the encodes that found no tokenizer (the first
    MAX_COUNTED_MODELS names, then OTHER_MODELS: clients choose these names); `truncated` counts,
    per tokenizer name, the texts cut to `max_chars`. Both are plain dicts for the metrics layer to
    read. `by_model` given here is source FLAG's. Call `close()` when done: it stops the worker
    threads. Every method but the encodes' worker part runs on the event loop's thread.
    """

    def __init__(
        self,
        by_model: Mapping[str, tokenizer.Tokenizer] | None = None,
        *,
        default: tokenizer.Tokenizer | None = None,
        max_chars: int = DEFAULT_MAX_CHARS,
        workers: int | None = None,
        prefix_cache_bytes: int = prefixcache.DEFAULT_MAX_BYTES,
    ) -> None:
        if max_chars <= 0:
            raise ValueError(f"max_chars must be > 0, got {max_chars}")
        self._layers: dict[str, dict[str, tokenizer.Tokenizer]] = {FLAG: dict(by_model or {})}
        self._by_model: dict[str, tokenizer.Tokenizer] = dict(by_model or {})
        self._loaded: dict[Path, tokenizer.Tokenizer] = {}  # resolved path -> its tokenizer
        self.default = default
        # The default is epp-tiny because nothing named a tokenizer: a stand-in, whose counts are
        # not the model's (so never held to the pods' context length: `is_models_own`).
        self.default_is_stand_in = False
        self.max_chars = max_chars
        self.missing: dict[str, int] = {}
        self.truncated: dict[str, int] = {}
        self.commits_dropped: dict[str, int] = {}  # per tokenizer name (module docstring)
        self.prefix_cache_bytes = prefix_cache_bytes
        # Keyed by the tokenizer object itself (identity), dropped when no source uses it any more.
        self._caches: dict[tokenizer.Tokenizer, prefixcache.PrefixCache | None] = {}
        self.prefix_cache_refused: dict[str, str] = {}
        for tok in self._in_use():
            self._cache_for(tok)
        self._closed = False
        pool = workers if workers is not None else _default_workers()
        self._executor = ThreadPoolExecutor(max_workers=pool, thread_name_prefix="epp-tokenize")
        # Characters handed to the pool and not yet encoded, and the bound (`_offload`).
        self._backlog = 0
        self.backlog_limit = pool * BACKLOG_CHARS_PER_WORKER
        self.saturated = 0  # texts refused with `Saturated`
        # The prefix caches' commit steps (fast engine): one thread, so they never hold up the
        # encodes requests wait for in the pool above, at a lower CPU priority, so under cold
        # traffic (a commit is a second, slower encode of each new text) the loop and the
        # request encodes get the cores first.
        self._committer = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="epp-tokenize-commit", initializer=pool_work.lower_priority
        )
        self._commits: set[concurrent.futures.Future[None]] = set()

    @classmethod
    def from_spec(
        cls,
        spec: TokenizerSpec,
        *,
        shipped_default: bool = True,
        max_chars: int = DEFAULT_MAX_CHARS,
        workers: int | None = None,
        prefix_cache_bytes: int = prefixcache.DEFAULT_MAX_BYTES,
    ) -> Tokenizers:
        """Load every tokenizer `spec` names (each path once). An empty spec means epp-tiny for all
        models, unless `shipped_default` is False (`epp serve` decides that after the other sources).

        Raises:
            TokenizerError: a path cannot be loaded; the message names the model and the path.
        """
        loaded, errors, by_path = _load_paths(spec.by_model, {})
        if errors:
            model, error = next(iter(errors.items()))
            raise tokenizer.TokenizerError(f"tokenizer for model {model!r}: {error}")
        if spec.default is not None:
            more, errors, extra = _load_paths({"": spec.default}, by_path)
            if errors:
                raise tokenizer.TokenizerError(f"default tokenizer: {errors['']}")
            by_path.update(extra)
            default: tokenizer.Tokenizer | None = more[""]
        elif not spec and shipped_default:
            default = tokenizer.load_shipped()
        else:
            default = None
        stand_in = default is not None and spec.default is None
        made = cls(
            loaded,
            default=default,
            max_chars=max_chars,
            workers=workers,
            prefix_cache_bytes=prefix_cache_bytes,
        )
        made._loaded = by_path
        made.default_is_stand_in = stand_in
        return made

    @property
    def models(self) -> Mapping[str, tokenizer.Tokenizer]:
        """The per-model tokenizers, all sources merged by precedence (read-only view)."""
        return types.MappingProxyType(self._by_model)

    def models_from(self, source: str) -> Mapping[str, tokenizer.Tokenizer]:
        """The tokenizers `source` (one of SOURCES) names, whether or not a higher one overrides them."""
        return types.MappingProxyType(self._layers.get(source, {}))

    def use_shipped_default(self) -> None:
        """Make epp-tiny the default when there is none (`epp serve`: nothing configured anywhere)."""
        if self.default is None:
            self.default = tokenizer.load_shipped()
            self.default_is_stand_in = True
            self._cache_for(self.default)

    def load_models(self, source: str, paths: Mapping[str, Path], *, origin: str = "") -> None:
        """Make `paths` (model -> tokenizer directory or tokenizer.json) `source`'s tokenizers,
        loading them now, in this thread (start-up). Replaces what `source` named before.

        Raises:
            TokenizerError: naming the first model whose tokenizer cannot be loaded, `origin`
                (default: the source) and the path; nothing changes then.
        """
        _check_source(source)
        loaded, errors, by_path = _load_paths(paths, self._loaded)
        if errors:
            model, error = next(iter(errors.items()))
            raise tokenizer.TokenizerError(f"tokenizer for model {model!r} ({origin or source}): {error}")
        self._set_layer(source, loaded, by_path)

    async def reload_models(self, source: str, paths: Mapping[str, Path], *, origin: str = "") -> bool:
        """Make `paths` `source`'s tokenizers, loading paths not loaded yet in a thread (a large
        tokenizer.json takes 0.1-1 s to parse). Never raises: a path that fails is logged at ERROR
        with the model and the path, and that model keeps the tokenizer `source` gave it before
        (none if it had none). Models `source` no longer names are dropped from it. True if every
        path loaded."""
        _check_source(source)
        if self._closed:
            return False
        loaded, errors, by_path = await asyncio.to_thread(_load_paths, paths, dict(self._loaded))
        where = origin or source
        before = self._layers.get(source, {})
        for model, error in errors.items():
            kept = before.get(model)
            keeps = f"keeping its previous tokenizer ({kept.path})" if kept is not None else "it has none"
            log.error("tokenizer for model %r (%s): %s; %s", model, where, error, keeps)
            if kept is not None:
                loaded[model] = kept
        for model, tok in sorted(loaded.items()):
            if before.get(model) is not tok:
                log.info("tokenizer for model %r (%s): %s", model, where, tok.path)
        for model in sorted(set(before) - set(loaded)):
            log.info("tokenizer for model %r (%s): removed", model, where)
        self._set_layer(source, loaded, by_path)
        return not errors

    def source(self, source: str, *, origin: str = "") -> TokenizerSource:
        """`load_models` and `reload_models` bound to one source, for a component that owns it
        (the endpoints file) without knowing this registry."""
        _check_source(source)
        return TokenizerSource(self, source, origin or source)

    def _set_layer(
        self,
        source: str,
        models: Mapping[str, tokenizer.Tokenizer],
        by_path: Mapping[Path, tokenizer.Tokenizer],
    ) -> None:
        self._loaded.update(by_path)
        self._layers[source] = dict(models)
        merged: dict[str, tokenizer.Tokenizer] = {}
        for name in reversed(SOURCES):  # lowest precedence first: higher ones overwrite
            merged.update(self._layers.get(name, {}))
        self._by_model = merged  # replaced whole: lookups on the loop see the old or the new map
        used = set(self._in_use())
        self._loaded = {p: t for p, t in self._loaded.items() if t in used}
        self._caches = {t: c for t, c in self._caches.items() if t in used}

    def _in_use(self) -> list[tokenizer.Tokenizer]:
        found = [tok for layer in self._layers.values() for tok in layer.values()]
        return found + ([self.default] if self.default is not None else [])

    @property
    def prefix_caches(self) -> Mapping[str, prefixcache.PrefixCache]:
        """The prefix caches by tokenizer name, for the metrics layer (empty when disabled)."""
        return {cache.name: cache for cache in self._caches.values() if cache is not None}

    def _cache_for(self, tok: tokenizer.Tokenizer) -> prefixcache.PrefixCache | None:
        """`tok`'s prefix cache, made on first use; None when disabled or `tok` is refused."""
        if tok in self._caches:
            return self._caches[tok]
        cache = None
        if self.prefix_cache_bytes > 0:
            try:
                cache = prefixcache.PrefixCache(tok, max_bytes=self.prefix_cache_bytes)
                log.info("tokenizer %s: prefix cache: %s", tok.name, cache.ruled_note)
            except cachecheck.UnsupportedTokenizer as e:
                self.prefix_cache_refused[tok.name] = str(e)
        self._caches[tok] = cache
        return cache

    def for_model(self, model: str, *, base_model: str | None = None) -> tokenizer.Tokenizer | None:
        """The tokenizer for `model`; for a LoRA adapter pass its `base_model`. None if there is none."""
        found = self._by_model.get(model)
        if found is None and base_model is not None:
            found = self._by_model.get(base_model)
        return found if found is not None else self.default

    def is_models_own(self, model: str, *, base_model: str | None = None) -> bool:
        """Whether `model` is served by a tokenizer named for it (or named as every model's
        default), not by the stand-in epp-tiny implied when nothing names one."""
        tok = self.for_model(model, base_model=base_model)
        return tok is not None and not (tok is self.default and self.default_is_stand_in)

    async def encode(
        self, model: str, text: str, *, base_model: str | None = None, add_special_tokens: bool = True
    ) -> list[int] | None:
        """`text`'s token ids with `model`'s tokenizer (None, counted in `missing`, if it has none).

        Text beyond `max_chars` is dropped first (see the module docstring). Awaiting this never
        blocks the loop for more than encoding INLINE_CHARS characters (FAST_INLINE_CHARS with
        the fast engine).

        Raises:
            RuntimeError: after `close()`.
        """
        if self._closed:
            raise RuntimeError("Tokenizers.encode after close()")
        tok = self._serving(model, base_model)
        if tok is None:
            return None
        return await self._encode_with(tok, text, add_special_tokens)

    async def _encode_with(self, tok: tokenizer.Tokenizer, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) > self.max_chars:
            text = text[: self.max_chars]
            self.truncated[tok.name] = self.truncated.get(tok.name, 0) + 1
        engine = tok.fast
        if len(text) <= INLINE_CHARS:
            return tok.encode(text, add_special_tokens=add_special_tokens)
        if engine is not None and len(text) <= FAST_INLINE_CHARS and engine.takes(text):
            ids = tok.encode_fast(text, add_special_tokens=add_special_tokens)  # checked: no second scan
            # None only the once fastokens fails and is turned off: `tokenizers` on the loop then.
            return ids if ids is not None else tok.encode(text, add_special_tokens=add_special_tokens)
        cache = self._cache_for(tok)
        if cache is None:
            return await self._offload(len(text), pool_work.encode, tok, text, add_special_tokens)
        # A text seen whole (a repeated prompt) is answered here: the hand-off to a worker
        # cost the loop ~100 us, more than the lookup (~20 us for a 4 KB chat). Otherwise the
        # worker starts from this lookup rather than walking the cached prefix again.
        found = cache.lookup(text)
        if found.exact:
            if len(text) <= CACHED_INLINE_CHARS:
                whole = cache.cached(text, add_special_tokens=add_special_tokens, found=found)
            else:  # copying a long prompt's ids out of the cache: ~2 ms per 200k tokens
                whole = await self._offload(0, pool_work.cached, cache, text, add_special_tokens, found)
            assert whole is not None
            return whole
        covered = found.path[-1].end if found.path else 0
        fits = engine is not None and engine.takes(text, covered)
        if engine is None or not (fits or cache.ruled):
            # `tokenizers` encodes the new part: its encoding is the one chunking needs, so the
            # commit step is cheap and runs in the worker before the answer.
            return await self._offload(
                len(text) - covered, pool_work.encode_cached, cache, text, add_special_tokens, found
            )
        begun: tuple[list[int], Callable[[], None]] | None = None
        if fits and len(text) - covered <= FAST_INLINE_CHARS:
            # On the loop; a seam that needs `tokenizers` (its window re-encoded differently, or
            # only partly shared) raises WouldBlock before encoding more than INLINE_CHARS.
            with contextlib.suppress(pieces.WouldBlock):
                begun = cache.begin(
                    text,
                    add_special_tokens=add_special_tokens,
                    found=found,
                    fast=True,
                    blocking_chars=INLINE_CHARS,
                )
        if begun is None:
            # A long new part (or one with runs fastokens must not cache) goes to the fast
            # engine in pieces (`PrefixCache.ruled`), each piece checked there.
            begun = await self._offload(
                len(text) - covered, pool_work.begin, cache, text, add_special_tokens, found, fits or None
            )
        ids, commit = begun
        self._commit(tok, commit)
        return ids

    async def _offload(self, chars: int, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` in the pool, counted as `chars` characters of encoding in its backlog.
        Raises `Saturated` when the backlog is over its bound (a text alone may always go)."""
        if self._backlog and self._backlog + chars > self.backlog_limit:
            self.saturated += 1
            raise Saturated(f"epp's tokenizer pool has {self._backlog} characters queued (about 2 s of work)")
        self._backlog += chars
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self._backlog -= chars

    def _commit(self, tok: tokenizer.Tokenizer, commit: Callable[[], None]) -> None:
        """Run a prefix cache's `commit` step on the commit thread, unless too many wait (~40 us of
        the loop's time, most of it waking that thread; `run_in_executor` cost the same)."""
        if len(self._commits) >= MAX_PENDING_COMMITS or self._closed:
            self.commits_dropped[tok.name] = self.commits_dropped.get(tok.name, 0) + 1
            return
        future = self._committer.submit(commit)
        self._commits.add(future)
        future.add_done_callback(self._committed)  # on the commit thread: set.discard is atomic

    def _committed(self, future: concurrent.futures.Future[None]) -> None:
        self._commits.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("prefix cache commit failed", exc_info=future.exception())

    async def encode_chat(
        self, model: str, body: Mapping[str, Any], *, base_model: str | None = None
    ) -> list[int] | None:
        """The prompt token ids vLLM's chat endpoint computes for a decoded chat completions
        `body` (`encode_dialect` of `Dialect.CHAT`)."""
        found = await self.encode_dialect(model, dialects.Dialect.CHAT, body, base_model=base_model)
        return None if found is None else found[0]

    async def encode_dialect(
        self,
        model: str,
        dialect: dialects.Dialect,
        body: Mapping[str, Any],
        *,
        base_model: str | None = None,
    ) -> tuple[list[int], dialects.Prepared] | None:
        """The prompt token ids vLLM computes for a decoded `body` of an API it renders with the
        chat template (`dialects.prepare`: the template rendered after vLLM's preprocessing,
        encoded without special tokens unless the API or the body asks), with the facts of its
        chat body; None, counted in `missing`, if `model` has no tokenizer.

        The template is rendered on the loop: a 10-turn, 4k-token chat rendered in 25-65 us
        (median, four template styles; a one-message chat ~20 us), less than a hand-off to a worker
        costs the loop (~100 us), while encoding the result took ~2.6 ms. A request of more than
        RENDER_INLINE_MESSAGES messages (input items) is rendered by a worker instead (10,000
        messages took ~60 ms of CPU: Python the loop can preempt there, every
        sys.getswitchinterval()). The text then takes `encode`'s path (cut to `max_chars`, inline
        when short, else a worker).

        Raises:
            chat.ChatTemplateError: vLLM would refuse the request (400) or the template failed;
                the caller routes without token ids.
            RuntimeError: after `close()`.
        """
        if self._closed:
            raise RuntimeError("Tokenizers.encode_dialect after close()")
        tok = self._serving(model, base_model)
        if tok is None:
            return None
        messages = body.get("messages", body.get("input"))
        if isinstance(messages, list) and len(messages) > RENDER_INLINE_MESSAGES:
            prepared = await self._offload(0, dialects.prepare, tok, dialect, body)
        else:
            prepared = dialects.prepare(tok, dialect, body)
        return await self._encode_prepared(tok, prepared.prompt), prepared

    def chat_template_for(self, model: str, *, base_model: str | None = None) -> chat.ChatTemplated | None:
        """The tokenizer whose chat template renders `model`'s chat requests (for a renderer in
        another process); None, counted in `missing`, if there is none."""
        return self._serving(model, base_model)

    async def encode_prompt(
        self, model: str, prompt: chat.ChatPrompt, *, base_model: str | None = None
    ) -> list[int] | None:
        """`encode_chat`'s last step, for a chat rendered elsewhere (`chat_template_for`)."""
        if self._closed:
            raise RuntimeError("Tokenizers.encode_prompt after close()")
        tok = self.for_model(model, base_model=base_model)
        if tok is None:
            return prompt.token_ids  # forwarded ids need no tokenizer; else None
        return await self._encode_prepared(tok, prompt)

    async def _encode_prepared(self, tok: tokenizer.Tokenizer, prompt: chat.ChatPrompt) -> list[int]:
        if prompt.token_ids is not None:  # ids forwarded in the body: vLLM takes them as they are
            return prompt.token_ids
        return await self._encode_with(tok, prompt.text, prompt.add_special_tokens)

    def _serving(self, model: str, base_model: str | None) -> tokenizer.Tokenizer | None:
        """`for_model`, counting a miss in `missing`."""
        tok = self.for_model(model, base_model=base_model)
        if tok is None:
            key = model if model in self.missing or len(self.missing) < MAX_COUNTED_MODELS else OTHER_MODELS
            self.missing[key] = self.missing.get(key, 0) + 1
        return tok

    async def drain(self) -> None:
        """Wait for the prefix caches' pending commit steps (a bench's warm-up, a test's next step)."""
        while self._commits:
            await asyncio.wait([asyncio.wrap_future(f) for f in set(self._commits)])

    @property
    def engines(self) -> Mapping[str, str]:
        """Tokenizer name -> the engine its `encode` runs on now, for the metrics layer."""
        return {tok.name: tok.engine for tok in self._in_use()}

    def close(self) -> None:
        """Stop the workers: queued encodes and commits are cancelled, running ones finish."""
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._committer.shutdown(wait=True, cancel_futures=True)


class TokenizerSource:
    """One source's `load` (start-up, raises) and `reload` (off the loop, logs) of per-model paths."""

    __slots__ = ("_origin", "_registry", "_source")

    def __init__(self, registry: Tokenizers, source: str, origin: str) -> None:
        self._registry = registry
        self._source = source
        self._origin = origin

    def load(self, paths: Mapping[str, Path]) -> None:
        self._registry.load_models(self._source, paths, origin=self._origin)

    async def reload(self, paths: Mapping[str, Path]) -> bool:
        return await self._registry.reload_models(self._source, paths, origin=self._origin)


def _check_source(source: str) -> None:
    if source not in SOURCES:
        raise ValueError(f"unknown tokenizer source {source!r}; expected one of {SOURCES}")


def _key(path: Path) -> Path:
    return path.expanduser().resolve()


def _load_paths(
    paths: Mapping[str, Path], known: Mapping[Path, tokenizer.Tokenizer]
) -> tuple[dict[str, tokenizer.Tokenizer], dict[str, str], dict[Path, tokenizer.Tokenizer]]:
    """(model -> tokenizer, model -> error, resolved path -> tokenizer) for `paths`: each resolved
    path loaded once, those in `known` not again. Blocking (it reads files and resolves paths);
    safe in a worker thread, since it only reads `known`."""
    loaded: dict[str, tokenizer.Tokenizer] = {}
    errors: dict[str, str] = {}
    by_path: dict[Path, tokenizer.Tokenizer] = {}
    failed: dict[Path, str] = {}
    for model, path in paths.items():
        key = _key(path)
        found = known.get(key) or by_path.get(key)
        if found is None and key not in failed:
            try:
                found = tokenizer.Tokenizer.load(path.expanduser())
            except tokenizer.TokenizerError as e:
                failed[key] = str(e)
        if found is None:
            errors[model] = failed[key]
        else:
            loaded[model] = by_path[key] = found
    return loaded, errors, by_path
