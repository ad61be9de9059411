"""Prefix-tokenization cache: a text that extends one tokenized before costs only its new part.

Typical traffic repeats a long system prompt or grows a conversation turn by turn, so most of the
~1.1 us per token `Tokenizer.encode` spends is spent again on text it has seen. `PrefixCache.encode`
returns exactly `Tokenizer.encode(text)` (tests/tokenize/test_prefixcache.py checks this with
generated texts), reusing the token ids of the longest cached prefix it can prove safe.

Structure. A trie of chunks (`epp.tokenize.chunktrie`): each node holds a piece of text
`[start, end)` and its token ids, children are keyed by the first KEY_CHARS characters of their
text. A chunk ends at a *checkpoint*:
a character offset where, in the full tokenization of the text that inserted it, a pre-token
starts (the token's word id changes) and a token starts. Chunks are at least
`max(min_chunk_chars, start // 256)` characters long, so a 400k-character conversation is a chain
of ~1,000 nodes rather than 3,000, and the same text always cuts at the same places (two texts
sharing a prefix share its chunks). One exception: a text inserted after a seam ends its first
chunk where it leaves the cached chunk it followed (at a checkpoint at most KEY_CHARS before,
and at least `margin` characters from the seam), so texts that differ from there on are keyed
apart rather than piled up as siblings under one key. The last piece of each inserted text,
after its last checkpoint, is stored as a *final* node that only matches a text ending exactly
there.

Lookup walks the trie along the text (a dict lookup and a `str.startswith` per node: O(len) with
memcmp constants). With an exact match (the whole text was seen) the ids are returned as they are.
Otherwise, with matched chunks n1..nk, the *seam* is where reuse stops: nk's end when the text
follows one of nk's cached children for at least `margin` characters (a system prompt seen with
another question: the child holds the prompt's end and the other question), else the start of nk
(k >= 2). The text from the seam is encoded, its first tokens are checked against the chunk after
the seam (that child, or nk: the *overlap window*), and the result is the cached ids up to the seam
followed by the new encoding. The text need not continue as the cached one did, so only the
window's ids up to `margin` characters before the texts part (and the pre-tokens reaching that
point) must agree; if they do not, the whole text is encoded instead (`fallbacks` counts this). The
new encoding's checkpoints then insert the text's new chunks. With the cut rule (`ruled`, below)
nk's end is the seam whenever a space between a non-space and a letter sits there in the text:
that proves a pre-token starts there, and no window is encoded again. A long text to encode is cut
into pieces (`epp.tokenize.pieces`); a tokenizer the cache cannot prove exact is refused at
construction (`epp.tokenize.cachecheck`).

Why the stitched result equals full tokenization. A `tokenizers` pipeline splits the text at added
tokens (special or not, e.g. `<|user|>`: leftmost-longest matching, at most the longest added
token's length of context), normalizes each segment, pre-tokenizes it (left-to-right regex scans:
each piece is decided by the text from the piece's start up to a few characters past its end) and
runs the model on each pre-token on its own (BPE without dropout, WordPiece, WordLevel and Unigram
depend only on the pre-token). So if position c is a pre-token start of text X, and the scans have
no look-behind or anchors, the tokens of X are the tokens of X[:c] followed by the tokens of X[c:]
encoded alone (the scans restart at c in the same state they would have inside X). And whether c is
a pre-token start of X depends only on X[:c + L] for a small L: the scans' right context. A
checkpoint c of a cached text T is a pre-token start of T; the seam is reused only when X equals T up
to the end of the following chunk (chunks are at least `margin` >= MARGIN_CHARS characters long),
or (a seam at the last matched chunk's end) for at least `margin` characters of the child that T
continued with, which exceeds L for every pattern accepted here (the GPT-2, Llama 3 and Qwen
patterns look at most one character past a whitespace run; the margin also covers the longest
added token). Chunk ends are stored only when they lie `margin` characters before the end of the
inserting text, for the same reason.
The overlap window re-checks this at each seam, in the new text's context, for patterns whose
look-ahead is longer than the margin (a `(?=...)` could be): a disagreement falls back to a full encode.

Memory: per cached token about 4 bytes of ids, plus its text (1 byte per character for ASCII, 2-4
beyond; ~2.7 characters per epp-tiny token on English prose and code), plus NODE_OVERHEAD_BYTES per
chunk (bench: ~8-9 bytes per cached token in all). `max_bytes` bounds the total; least recently used
chunks are evicted first. A node is always touched after its children, so the least recently used
node is a leaf and eviction never orphans a subtree.

Engines: the ids a request gets come from the tokenizer's fast engine (fastokens) when it has
one. Chunking needs checkpoints, which `tokenizers`' offsets and word ids give. For the tokenizers
most models ship, `cutrules` finds checkpoints in the text itself (a space after a non-space and
before a letter always starts a pre-token there: `ruled`), so `begin` cuts the new part at those
places into chunk-sized pieces and encodes them in one fastokens call: the pieces' ids are the
answer and the pieces are the chunks, at any length (a cold 100k-token prompt ~4x faster than
`tokenizers`; fastokens takes each piece `FastEngine.takes` accepts, `tokenizers` the others).
`commit` then only inserts; it also encodes with `tokenizers` and compares for the first
VERIFY_FIRST such texts and one in VERIFY_EVERY after (`verified`, `unverified`): a difference
turns the fast engine off, as it does on the other path. Otherwise (a tokenizer the rule is not
proved for) `begin` answers with the fast ids of a new part `FastEngine.takes` accepts whole, and
`commit` encodes it again with `tokenizers` (off the request path), compares the two, and chunks
that encoding. Without the fast engine `begin` encodes with `tokenizers` and `commit` only chunks
and inserts. Token ids only steer routing (which pod holds the prefix), never what a model reads,
so a sampled check is what the ids are worth: a difference costs cache hits, not answers.

Threads: `encode` runs in the tokenizer's worker threads; `lookup` and `cached` are cheap enough
for the event loop, which hands a worker its `lookup` so the walk is not repeated (or, for a short
new part and the fast engine, runs `begin` itself). `begin` returns the ids and a `commit` step
that chunks and inserts the text (a text not committed yet is not cached: a request following at
once re-encodes its part). One lock guards the trie, the LRU
order and the counters; encoding, verifying and building chunks happen outside it. The critical
sections are the walk (string compares over the matched text: ~30 us for 400k characters) and the
insert, INSERT_BATCH chunks at a time (the loop's `lookup` waits for one batch at most);
`contended` counts acquisitions that had to wait.
"""

from __future__ import annotations

import array
import json
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import tokenizers

from epp.tokenize import cachecheck, cutrules, tokenizer
from epp.tokenize.chunktrie import KEY_CHARS, ChunkTrie, Node, join, shared
from epp.tokenize.pieces import (
    SPLIT_CHARS,
    Encoded,
    FastPieces,
    TokenizersPieces,
    check_blocking,
    checkpoint_chunks,
    fast_pieces,
    parallelism,
    window_agrees,
)
from epp.tokenize.tokenizer import FastEngine

DEFAULT_MAX_BYTES = 64 << 20
MARGIN_CHARS = 32  # right context that decides a pre-token start; plus the longest added token
MIN_CHUNK_CHARS = 128
DEPTH_DIVISOR = 256  # a chunk starting at offset p is at least p // DEPTH_DIVISOR characters long
INSERT_BATCH = 64  # chunks inserted per hold of the lock
MEMO_MAX_TOKENS = 262_144  # the last seam's joined ids are kept up to this many (`_Memo`)
VERIFY_FIRST = 32  # texts the fast engine encodes in pieces that are all checked against `tokenizers`
VERIFY_EVERY = 64  # after those, one in this many is


class Lookup(NamedTuple):
    """`PrefixCache.lookup`'s answer: the cached chunks a text starts with; `exact` if they end it."""

    path: list[Node]
    exact: bool


def _done() -> None:
    """`begin`'s step for a text cached whole: nothing to insert (counted already)."""


class _Memo(NamedTuple):
    """The last seam's chunk chain, its joined ids and its text (`text[:path[-1].end]`).

    Requests split at the seam of the one before them: many share a system prompt (the same seam),
    and a conversation's next turn extends the previous turn's text (a longer chain starting with
    the same chunks). Both reuse this: `_lookup` checks the text prefix in one compare instead of a
    dict lookup and a compare per chunk (~3 us each: 2.4 ms for a 100k-token conversation's ~800
    chunks), and `_joined` copies the ids and joins only the chunks past it (the join and its
    `tolist` were another ~2 ms there). A node determines its ancestors (the trie is a tree), so a
    chain holding `path[-1]` at the same depth starts with `path`. At most MEMO_MAX_TOKENS ids
    (~9 MB of list and text at the cap, not counted in `max_bytes`)."""

    path: tuple[Node, ...]
    ids: list[int]
    text: str


class PrefixCache:
    """Token ids of texts through one tokenizer, reusing those of cached prefixes. Thread-safe.

    Counters (read them for metrics; updated under the lock; the trie's sizes, `evictions`,
    `cached_bytes`, `cached_tokens` and `nodes`, are read through from `trie`):
    `hits` (the whole text was cached), `partial_hits` (a prefix was reused), `misses`,
    `fallbacks` (a seam failed verification: counted as a miss too), `evictions` (chunks),
    `cached_bytes`, `cached_tokens`, `nodes`, `reused_tokens` and `encoded_tokens` (tokens taken
    from the cache and tokens the tokenizer produced, seam windows included), `contended`,
    `engine_mismatches` (texts the fast engine encoded differently: it is turned off at the first).

    Raises:
        cachecheck.UnsupportedTokenizer: at construction, for a tokenizer the cache cannot prove safe.
    """

    def __init__(
        self,
        tok: tokenizer.Tokenizer,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        min_chunk_chars: int = MIN_CHUNK_CHARS,
        split_chars: int = SPLIT_CHARS,
        pieces: int | None = None,
        cut_rule: bool = True,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        if split_chars <= min_chunk_chars:
            raise ValueError(f"split_chars must be > min_chunk_chars ({min_chunk_chars}), got {split_chars}")
        config = json.loads(tok.backend.to_str())
        self.ascii_checkpoints, longest_added = cachecheck.check(config)
        self.margin = MARGIN_CHARS + longest_added
        if min_chunk_chars < max(KEY_CHARS, self.margin):
            raise ValueError(
                f"min_chunk_chars must be >= {max(KEY_CHARS, self.margin)}, got {min_chunk_chars}"
            )
        self.name = tok.name
        self.min_chunk_chars = min_chunk_chars
        self.split_chars = split_chars
        self._tok = tok
        # The same pipeline without its post-processor: content ids and untrimmed offsets (ByteLevel's
        # post-processor trims spaces off offsets); special tokens are added around the content.
        self._raw = tokenizers.Tokenizer.from_str(tok.backend.to_str())
        self._raw.post_processor = None
        self._head, self._tail = cachecheck.specials(tok.backend, self._raw)
        self.splitter = TokenizersPieces(
            self._raw,
            pieces=pieces if pieces is not None else parallelism(),
            split_chars=split_chars,
            overlap=min_chunk_chars,
        )
        # Whether the fast engine's ids are cut into chunks by `cutrules` (`begin`); why not if not.
        why = "turned off" if not cut_rule else "no fast engine" if tok.fast is None else None
        why = why or cutrules.refusal(config) or cutrules.probe(self._raw)
        self.ruled = why is None
        self.ruled_note = why or "the fast engine's pieces are cut at spaces before letters"
        self._ruled_count = 0
        self.trie = ChunkTrie(max_bytes)
        self._lock = threading.Lock()
        self._memo: _Memo | None = None  # one assignment swaps it: threads see old or new
        self.hits = 0
        self.partial_hits = 0
        self.misses = 0
        self.fallbacks = 0
        self.reused_tokens = 0
        self.encoded_tokens = 0
        self.contended = 0
        self.engine_mismatches = 0
        self.verified = 0
        self.unverified = 0

    @property
    def max_bytes(self) -> int:
        return self.trie.max_bytes

    @property
    def cached_bytes(self) -> int:
        return self.trie.cached_bytes

    @property
    def cached_tokens(self) -> int:
        return self.trie.cached_tokens

    @property
    def nodes(self) -> int:
        return self.trie.nodes

    @property
    def evictions(self) -> int:
        return self.trie.evictions

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Exactly `Tokenizer.encode(text, add_special_tokens=...)`, reusing cached prefixes.

        Releases the GIL while tokenizing; the lookup and the join of cached ids hold it (~1-3 ms
        for 100k cached tokens). `begin` then `commit` is the same with the caching step after the
        answer.
        """
        ids, commit = self.begin(text, add_special_tokens=add_special_tokens)
        commit()
        return ids

    def lookup(self, text: str) -> Lookup:
        """Where `text` stands in the cache: cheap (a dict lookup and a string compare per cached
        chunk), so the event loop can try it before handing a text to a worker thread."""
        return Lookup(*self._lookup(text))

    def cached(
        self, text: str, *, add_special_tokens: bool = True, found: Lookup | None = None
    ) -> list[int] | None:
        """`encode(text)` when `text` is cached whole, else None (nothing counted then). `found`:
        this text's `lookup`, if already made."""
        path, exact = found or self._lookup(text)
        if not exact:
            return None
        ids = self._joined(path)
        with self._locked():
            self.hits += 1
            self.reused_tokens += len(ids)
        return self._specials(ids, add_special_tokens, owned=True)

    def begin(
        self,
        text: str,
        *,
        add_special_tokens: bool = True,
        found: Lookup | None = None,
        fast: bool | None = None,
        blocking_chars: int | None = None,
    ) -> tuple[list[int], Callable[[], None]]:
        """`encode(text)`'s ids, and the step that caches `text`'s new chunks and counts the
        request: call it once. `found`: this text's `lookup`, if already made (each walk of a long
        cached prefix costs tens of microseconds). `fast`: True when the caller checked that the
        fast engine may take the text after the cached chunks whole (`FastEngine.takes`); None:
        checked here; False: `tokenizers` only. `blocking_chars`: the most characters `tokenizers`
        may encode in this call (the event loop calls it with the fast engine); past it
        `pieces.WouldBlock` is raised before any work.

        With the tokenizer's fast engine (`Tokenizer.fast`) the ids come from it. Where the cut
        rule holds (`ruled`) the new part is encoded in pieces cut at rule positions, which are
        also its chunks: the step only inserts them, and checks the ids against `tokenizers` for
        the first VERIFY_FIRST texts and one in VERIFY_EVERY after (`verified`, `unverified`).
        Otherwise the step does the `tokenizers` encode that chunking needs (offsets, word ids)
        and compares: the request need not wait for it (a warm 4k chat: ~0.15 ms to the ids, then
        ~0.8 ms to commit). A difference turns the fast engine off (`engine_mismatches`). Without
        the fast engine the ids come from that encode and the step only chunks and inserts."""
        found = found or self.lookup(text)
        if found.exact:
            ids = self.cached(text, add_special_tokens=add_special_tokens, found=found)
            assert ids is not None
            return ids, _done
        engine = self._tok.fast
        ruled = self.ruled and engine is not None and fast is not False
        path = found.path
        where = self._seam(text, path)
        seam = where[0] if where is not None else None
        length = 0
        # Where the cut rule holds in `text` at the last matched chunk's end, that end is a
        # pre-token start of `text` (`cutrules`): the seam, with no window to re-encode.
        if ruled and path and cutrules.first_cut(text, path[-1].end, path[-1].end) is not None:
            length = where[2] if where is not None and where[0] is path[-1] else 0
            seam = path[-1]
            where = None
        start = seam.end if seam is not None else 0
        if engine is None:
            fast = False
        elif fast is None:
            fast = engine.takes(text, start)
        fresh: Encoded | None = None  # the `tokenizers` encoding, when made now
        parts: FastPieces | None = None  # the fast engine's pieces, when they made `new`
        new: list[int] | None = None  # the ids after the seam (or of the whole text)
        first: tuple[int, int] | None = None
        if seam is not None and where is None:  # the rule's seam
            # The first chunk ends where the text leaves the cached child it follows (as below).
            # It may be short: a seam at its end is proved by the rule, not by `margin` of text.
            first = (max(1, length - KEY_CHARS + 1), length) if length else None
            parts = self._fast_pieces(text, start, first, fast, blocking_chars)
            if parts is not None:
                new = parts.ids
            else:  # the rule's places are too far apart here: `tokenizers`, chunked by checkpoints
                check_blocking(len(text) - start, blocking_chars)
                fresh = self.splitter.encode(text, start)
                new = fresh.ids
        elif where is not None:
            seam, window, length = where
            # End the first new chunk where the text leaves the cached window (if a checkpoint is
            # there, or less than KEY_CHARS before): that chunk is then the window itself, or a
            # piece of it shared by both texts, and the chunks after it are keyed by what differs.
            # Otherwise every user message after a shared system prompt became one more sibling
            # under one key, each lookup comparing them all (after 200 requests: 201 siblings,
            # lookup 31 -> 5 us).
            if seam is path[-1]:  # the text leaves the window partway
                first = (max(self.margin, length - KEY_CHARS + 1), length)
            else:  # the window is matched whole: keep it as it is
                first = (length, length)
            if ruled:
                parts = self._fast_pieces(text, start, first, fast, blocking_chars)
                new = None if parts is None else parts.ids
            elif fast:
                new = self._tok.encode_fast(text[start:], add_special_tokens=False)
            # The window repeated id for id is `window_agrees`' first test; anything else
            # needs word ids, which only `tokenizers` gives.
            if new is not None and array.array("I", new[: len(window.ids)]) != window.ids:
                new = parts = None
            if new is None:
                check_blocking(len(text) - start, blocking_chars)
                fresh = self.splitter.encode(text, seam.end)
                if window_agrees(fresh, window.ids, length, self.margin):
                    new = fresh.ids
                else:
                    fresh = None
        if new is None or seam is None:
            base = self.trie.root
            whole = None
            if ruled:
                parts = self._fast_pieces(text, 0, None, fast and start == 0, blocking_chars)
                whole = None if parts is None else parts.ids
            elif fast and (start == 0 or FastEngine.takes(text)):
                whole = self._tok.encode_fast(text, add_special_tokens=False)
            if whole is not None:
                new = whole
                fresh = None
            else:
                check_blocking(len(text), blocking_chars)
                fresh = self.splitter.encode(text, 0)
                new = fresh.ids
            ids = new
            reused = 0
        else:
            base = seam
            ids = self._joined(path if seam is path[-1] else path[:-1], remember=text)
            reused = len(ids)
            ids.extend(new)
        answer = self._specials(ids, add_special_tokens, owned=ids is not new)
        fallback = seam is not None and base is self.trie.root
        if fresh is not None:
            parts = None

        def commit() -> None:
            encoding = fresh
            unverified = 0
            if parts is not None and not self._verify_due():
                unverified = 1
            elif encoding is None:
                encoding = self.splitter.encode(text, base.end)
                if encoding.ids != new:
                    self._mismatch(text[base.end :], new, encoding.ids)
            if encoding is None or (parts is not None and encoding.ids == new):
                assert parts is not None
                chunks = parts.chunks
            else:
                chunks = checkpoint_chunks(
                    text,
                    base.end,
                    encoding,
                    first if base is seam else None,
                    margin=self.margin,
                    min_chars=self.min_chunk_chars,
                    divisor=DEPTH_DIVISOR,
                    ascii_only=self.ascii_checkpoints,
                )
            node: Node | None = base
            # In batches, the lock released between them: the event loop's `lookup` waits for
            # one batch, not for the ~1,000 chunks of a new 100k-token prompt.
            for at in range(0, len(chunks), INSERT_BATCH):
                with self._locked():
                    if at == 0:
                        if base is self.trie.root:
                            self.misses += 1
                            self.fallbacks += fallback
                        else:
                            self.partial_hits += 1
                        self.reused_tokens += reused
                        self.encoded_tokens += len(new)
                        self.unverified += unverified
                        if parts is not None:
                            self.verified += 1 - unverified
                    node = self.trie.insert(node, chunks[at : at + INSERT_BATCH])
                if node is None:
                    break
                time.sleep(0)  # let the event loop's thread have the GIL

        return answer, commit

    def _verify_due(self) -> bool:
        """Whether the next text the fast engine encoded in pieces is checked against `tokenizers`.
        A plain count: commits racing on it at worst check one text more or less."""
        self._ruled_count += 1
        return self._ruled_count <= VERIFY_FIRST or self._ruled_count % VERIFY_EVERY == 0

    def _fast_pieces(
        self, text: str, start: int, first: tuple[int, int] | None, checked: bool, blocking: int | None
    ) -> FastPieces | None:
        end = len(text) - self.margin  # a chunk's end needs `margin` characters after it
        cuts = cutrules.cuts(
            text, start, end, first=first, min_chars=self.min_chunk_chars, divisor=DEPTH_DIVISOR
        )
        return fast_pieces(self._tok, self._raw, text, start, cuts, checked=checked, blocking_chars=blocking)

    def _mismatch(self, text: str, fast: list[int], reference: list[int]) -> None:
        """The fast engine gave other ids than `tokenizers` for `text`: count it and stop using it."""
        at = next((i for i, (a, b) in enumerate(zip(fast, reference, strict=False)) if a != b), None)
        at = min(len(fast), len(reference)) if at is None else at
        with self._locked():
            self.engine_mismatches += 1
        self._tok.disable_fast(
            f"{len(fast)} vs {len(reference)} ids for a {len(text)}-character text, first difference at"
            f" token {at} ({fast[at : at + 3]} vs {reference[at : at + 3]})"
        )

    def _seam(self, text: str, path: list[Node]) -> tuple[Node, Node, int] | None:
        """Where `text` stops reusing cached ids (the seam: a node of `path`), the cached chunk
        after it that the new encoding must repeat (the window), and how many characters of that
        chunk `text` shares; None when no seam can be proved.

        The seam is the last matched chunk when `text` continues as one of its cached children
        for at least `margin` characters: its end is a checkpoint of the text that inserted that
        child, and `text` agrees with that text that far past it. Only the new part is encoded
        then (a warm 4k chat whose system prompt was seen: 628 -> ~560 tokens). Otherwise it is
        the chunk before, and the last matched chunk is encoded again as the window.
        """
        if not path:
            return None
        last = path[-1]
        pos = last.end
        margin = self.margin
        with self._locked():  # children change under the lock
            options = self.trie.options(last, text, pos)
        for child in options:
            if len(child.text) >= margin and text.startswith(child.text[:margin], pos):
                return last, child, shared(text, pos, child.text, margin)
        if len(path) >= 2 and last.end - path[-2].end >= margin:  # chunks from `first` may be short
            return path[-2], last, last.end - path[-2].end
        return None

    def _specials(self, ids: list[int], add_special_tokens: bool, *, owned: bool) -> list[int]:
        """`ids` with the tokenizer's special tokens around them. `owned`: `ids` is the caller's
        own list (`_joined`'s, never the memo's), changed in place; otherwise (`new`, which
        `commit` still reads) copied once. Two copies of a seen 100k-token prompt's ids cost
        ~0.28 ms here; the head's insert moves its pointers once."""
        if not add_special_tokens or not (self._head or self._tail):
            return ids
        if not owned:
            return [*self._head, *ids, *self._tail]
        if self._head:
            ids[:0] = self._head
        ids.extend(self._tail)
        return ids

    def _joined(self, path: list[Node], *, remember: str | None = None) -> list[int]:
        """The ids of `path`'s chunks as a new list, from the memo where `path` extends it (see
        `_Memo`). With `remember` (a text `path` starts), `path` becomes the memo: a seam's
        chain, which the next request is likely to share or extend. A chunk's ids never change,
        even once evicted, so the memo stays valid. The memo's text is cut from `remember` only
        when the memo changes: a seen 100k-token prompt's cut copied ~1 MB on every request."""
        if not path:
            return []
        kept = self._memo
        start = 0
        if kept is not None and len(path) >= len(kept.path) and path[len(kept.path) - 1] is kept.path[-1]:
            ids = kept.ids.copy()
            start = len(kept.path)
            if start == len(path):
                return ids
            ids.extend(join(path[start:]))
        else:
            ids = join(path)
        if remember is not None and len(ids) <= MEMO_MAX_TOKENS:
            self._memo = _Memo(tuple(path), ids.copy(), remember[: path[-1].end])
        return ids

    def _locked(self) -> _Lock:
        return _Lock(self)

    def _lookup(self, text: str) -> tuple[list[Node], bool]:
        """The chain of chunks `text` starts with, and whether the last is a final node ending it.

        Only an exact match is marked used here: a partial one is by the insert that follows."""
        path: list[Node] = []
        kept = self._memo
        with self._locked():
            node = self.trie.root
            # The memo's chain, when the text starts with its text: one compare, not one per chunk.
            # Its last node alive means the whole chain is (eviction takes leaves first).
            if kept is not None and kept.path[-1].alive and text.startswith(kept.text):
                path.extend(kept.path)
                node = kept.path[-1]
            exact = self.trie.walk(text, node, path)
        return path, exact

    def clear(self) -> None:
        """Drop every cached chunk (counters other than the sizes are kept)."""
        with self._locked():
            self.trie.clear()


class _Lock:
    """The cache's lock as a context manager that counts contended acquisitions."""

    __slots__ = ("_cache",)

    def __init__(self, cache: PrefixCache) -> None:
        self._cache = cache

    def __enter__(self) -> None:
        lock = self._cache._lock
        if not lock.acquire(blocking=False):
            lock.acquire()
            self._cache.contended += 1

    def __exit__(self, *exc: object) -> None:
        self._cache._lock.release()
