"""Prefix-tokenization cache: a text that extends one tokenized before costs only its new part.

Typical traffic repeats a long system prompt or grows a conversation turn by turn, so most of the
~1.1 us per token `Tokenizer.encode` spends is spent again on text it has seen. `PrefixCache.encode`
returns exactly `Tokenizer.encode(text)` (tests/tokenize/test_prefixcache.py checks this with
generated texts), reusing the token ids of the longest cached prefix it can prove safe.

Structure. A trie of chunks: each node holds a piece of text `[start, end)` and its token ids,
children are keyed by the first KEY_CHARS characters of their text. A chunk ends at a *checkpoint*:
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
new encoding's checkpoints then insert the text's new chunks.

Pieces. A text to encode (from the seam, or whole on a miss) of at least 2 x `split_chars`
characters is cut into up to `pieces` pieces (default: the CPUs tokenizers' pool may use; fewer
while other texts are being encoded, which share those cores) at
spaces before a letter, each but the last running `min_chunk_chars` past the next one's start,
and encoded in one `encode_batch`, which runs them in parallel with the GIL released. A cut is kept
only if it is a checkpoint of the piece before it (the seam's argument below, with that piece as
the cached text); else the text is encoded again whole (`split_misses`; a tokenizer missing often,
such as WordPiece, which drops the space, is no longer cut). `splits` counts texts encoded in
pieces.

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

What the cache refuses (`UnsupportedTokenizer`, checked at construction): normalizers other than
Unicode normal forms and Lowercase (NFC and friends can compose across a seam, so with them a
checkpoint must sit on an ASCII character, which no composition involves); pre-tokenizers that add
text at a segment's start (ByteLevel `add_prefix_space`, Metaspace with a prepend scheme), merge
runs (`Contiguous`) or use look-behind, anchors or `\\b` in their patterns; BPE dropout; truncation
or padding; and post-processors that do not just add fixed ids before and after the text (checked
on sample texts). Special tokens from the post-processor (BOS) are added around the cached content
ids, as they are around a full encode's.

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
import bisect
import collections
import itertools
import json
import os
import re
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import tokenizers

from epp.tokenize import cutrules, tokenizer
from epp.tokenize.tokenizer import FastEngine

DEFAULT_MAX_BYTES = 64 << 20
KEY_CHARS = 32  # children are keyed by this many leading characters of their text
MARGIN_CHARS = 32  # right context that decides a pre-token start; plus the longest added token
MIN_CHUNK_CHARS = 128
DEPTH_DIVISOR = 256  # a chunk starting at offset p is at least p // DEPTH_DIVISOR characters long
NODE_OVERHEAD_BYTES = 250  # node object, its dict and LRU entries, array and str headers (estimate)
INSERT_BATCH = 64  # chunks inserted per hold of the lock
MEMO_MAX_TOKENS = 262_144  # the last seam's joined ids are kept up to this many (`_Memo`)
SPLIT_CHARS = 2048  # texts to encode are cut into pieces of at least this many characters (`_encode`)
VERIFY_FIRST = 32  # texts the fast engine encodes in pieces that are all checked against `tokenizers`
VERIFY_EVERY = 64  # after those, one in this many is

# Where a piece may start: a space between a non-space and an ASCII letter. With the GPT-2, Llama 3
# and Qwen patterns and Metaspace a pre-token starts there; each cut is still verified.
_CUT_AT = re.compile(r"(?<=\S) (?=[A-Za-z])")

_NORMALIZERS_LOCAL = {"Lowercase"}
_NORMALIZERS_ASCII = {"NFC", "NFD", "NFKC", "NFKD"}
_SPLIT_BEHAVIOURS = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext"}
# Constructs that make a regex scan depend on text before the piece, or on where the text starts.
_UNSAFE_REGEX = re.compile(r"\(\?<[=!]|\\[bBAzZG]")


class UnsupportedTokenizer(Exception):
    """The cache cannot prove its results equal full tokenization for this tokenizer; says why."""


class WouldBlock(Exception):
    """`begin` would encode more than its `blocking_chars` with `tokenizers`: call it in a worker."""


def _check_blocking(chars: int, limit: int | None) -> None:
    if limit is not None and chars > limit:
        raise WouldBlock(f"{chars} characters for tokenizers, over {limit}")


class Lookup(NamedTuple):
    """`PrefixCache.lookup`'s answer: the cached chunks a text starts with; `exact` if they end it."""

    path: list[_Node]
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

    path: tuple[_Node, ...]
    ids: list[int]
    text: str


class _Pieces(NamedTuple):
    """A new part encoded by the fast engine in pieces cut at rule positions (`_fast_pieces`):
    its ids, and its pieces as the chunks to cache (text, ids, final), the last one final."""

    ids: list[int]
    chunks: list[tuple[str, array.array[int], bool]]


class _Encoded:
    """The encoding of `text[start:]` (offsets below are relative to `start`): one `tokenizers`
    Encoding, or several encoded as one batch and joined at verified checkpoints (`_encode`).

    `ids` and `words` (word ids: a change marks a pre-token start) are lists; `start_of(i)` is
    token i's first character. At a join the word ids may repeat across it: that only hides a
    checkpoint from `_chunks`, never invents one (the join itself is a checkpoint)."""

    __slots__ = ("_bases", "_firsts", "_parts", "ids", "missed", "pieces", "words")

    def __init__(
        self,
        parts: list[tokenizers.Encoding],
        bases: list[int],
        firsts: list[int],
        ids: list[int],
        words: list[int | None],
        *,
        missed: bool = False,
    ) -> None:
        self._parts = parts
        self._bases = bases  # each part's first character
        self._firsts = firsts  # each part's first token in `ids`
        self.ids = ids
        self.words = words
        self.pieces = len(parts)
        self.missed = missed  # a cut failed verification: this is the whole text, encoded again

    @classmethod
    def whole(cls, encoding: tokenizers.Encoding, *, missed: bool = False) -> _Encoded:
        return cls([encoding], [0], [0], encoding.ids, encoding.word_ids, missed=missed)

    def start_of(self, i: int) -> int:
        k = bisect.bisect_right(self._firsts, i) - 1 if len(self._parts) > 1 else 0
        span = self._parts[k].token_to_chars(i - self._firsts[k])
        assert span is not None  # no post-processor: every token covers text
        return self._bases[k] + span[0]


class _Node:
    __slots__ = ("alive", "children", "end", "final", "ids", "nbytes", "parent", "text")

    def __init__(self, parent: _Node | None, text: str, ids: array.array[int], end: int, final: bool) -> None:
        self.parent = parent
        self.text = text
        self.ids = ids
        self.end = end  # character offset of this chunk's end in the texts that contain it
        self.final = final  # matches only a text that ends exactly here
        self.children: dict[str, _Node | list[_Node]] = {}
        self.alive = True
        self.nbytes = len(text.encode("utf-8", "surrogatepass")) + 4 * len(ids) + NODE_OVERHEAD_BYTES


class PrefixCache:
    """Token ids of texts through one tokenizer, reusing those of cached prefixes. Thread-safe.

    Counters (plain attributes, read them for metrics; updated under the lock):
    `hits` (the whole text was cached), `partial_hits` (a prefix was reused), `misses`,
    `fallbacks` (a seam failed verification: counted as a miss too), `evictions` (chunks),
    `cached_bytes`, `cached_tokens`, `nodes`, `reused_tokens` and `encoded_tokens` (tokens taken
    from the cache and tokens the tokenizer produced, seam windows included), `contended`,
    `engine_mismatches` (texts the fast engine encoded differently: it is turned off at the first).

    Raises:
        UnsupportedTokenizer: at construction, for a tokenizer the cache cannot prove safe.
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
        self.ascii_checkpoints, longest_added = _check(config)
        self.margin = MARGIN_CHARS + longest_added
        if min_chunk_chars < max(KEY_CHARS, self.margin):
            raise ValueError(
                f"min_chunk_chars must be >= {max(KEY_CHARS, self.margin)}, got {min_chunk_chars}"
            )
        self.name = tok.name
        self.max_bytes = max_bytes
        self.min_chunk_chars = min_chunk_chars
        self.split_chars = split_chars
        self.pieces = pieces if pieces is not None else _parallelism()
        self._tok = tok
        # The same pipeline without its post-processor: content ids and untrimmed offsets (ByteLevel's
        # post-processor trims spaces off offsets); special tokens are added around the content.
        self._raw = tokenizers.Tokenizer.from_str(tok.backend.to_str())
        self._raw.post_processor = None
        self._head, self._tail = _specials(tok.backend, self._raw)
        # Whether the fast engine's ids are cut into chunks by `cutrules` (`begin`); why not if not.
        why = "turned off" if not cut_rule else "no fast engine" if tok.fast is None else None
        why = why or cutrules.refusal(config) or cutrules.probe(self._raw)
        self.ruled = why is None
        self.ruled_note = why or "the fast engine's pieces are cut at spaces before letters"
        self._ruled_count = 0
        self._root = _Node(None, "", array.array("I"), 0, False)
        self._lru: collections.OrderedDict[_Node, None] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._memo: _Memo | None = None  # one assignment swaps it: threads see old or new
        self.hits = 0
        self.partial_hits = 0
        self.misses = 0
        self.fallbacks = 0
        self.evictions = 0
        self.cached_bytes = 0
        self.cached_tokens = 0
        self.nodes = 0
        self.reused_tokens = 0
        self.encoded_tokens = 0
        self.contended = 0
        self.splits = 0
        self.split_misses = 0
        self.engine_mismatches = 0
        self.verified = 0
        self.unverified = 0
        # One entry per `_encode` under way (deque append and pop are atomic): the cores are
        # shared between the texts being encoded at once.
        self._inflight: collections.deque[None] = collections.deque()

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
        return self._specials(ids, add_special_tokens)

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
        `WouldBlock` is raised before any work.

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
            fast = engine.takes(text[start:])  # False at once past MAX_FAST_CHARS
        fresh: _Encoded | None = None  # the `tokenizers` encoding, when made now
        pieces: _Pieces | None = None  # the fast engine's pieces, when they made `new`
        new: list[int] | None = None  # the ids after the seam (or of the whole text)
        first: tuple[int, int] | None = None
        if seam is not None and where is None:  # the rule's seam
            # The first chunk ends where the text leaves the cached child it follows (as below).
            # It may be short: a seam at its end is proved by the rule, not by `margin` of text.
            first = (max(1, length - KEY_CHARS + 1), length) if length else None
            pieces = self._fast_pieces(text, start, first, fast, blocking_chars)
            new = None if pieces is None else pieces.ids
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
                pieces = self._fast_pieces(text, start, first, fast, blocking_chars)
                new = None if pieces is None else pieces.ids
            elif fast:
                new = self._tok.encode_fast(text[start:], add_special_tokens=False)
            # The window repeated id for id is `_window_agrees`' first test; anything else
            # needs word ids, which only `tokenizers` gives.
            if new is not None and array.array("I", new[: len(window.ids)]) != window.ids:
                new = pieces = None
            if new is None:
                _check_blocking(len(text) - start, blocking_chars)
                fresh = self._encode(text, seam.end)
                if _window_agrees(fresh, window, length, self.margin):
                    new = fresh.ids
                else:
                    fresh = None
        if new is None or seam is None:
            base = self._root
            whole = None
            if ruled:
                pieces = self._fast_pieces(text, 0, None, fast and start == 0, blocking_chars)
                whole = None if pieces is None else pieces.ids
            elif fast and (start == 0 or FastEngine.takes(text)):
                whole = self._tok.encode_fast(text, add_special_tokens=False)
            if whole is not None:
                new = whole
                fresh = None
            else:
                _check_blocking(len(text), blocking_chars)
                fresh = self._encode(text, 0)
                new = fresh.ids
            ids = new
            reused = 0
        else:
            base = seam
            ids = self._joined(path if seam is path[-1] else path[:-1], remember=text[: seam.end])
            reused = len(ids)
            ids.extend(new)
        answer = self._specials(ids, add_special_tokens)
        fallback = seam is not None and base is self._root
        if fresh is not None:
            pieces = None

        def commit() -> None:
            encoding = fresh
            unverified = 0
            if pieces is not None and not self._verify_due():
                unverified = 1
            elif encoding is None:
                encoding = self._encode(text, base.end)
                if encoding.ids != new:
                    self._mismatch(text[base.end :], new, encoding.ids)
            if encoding is None or (pieces is not None and encoding.ids == new):
                assert pieces is not None
                chunks = pieces.chunks
            else:
                chunks = self._chunks(text, base.end, encoding, first if base is seam else None)
            node: _Node | None = base
            # In batches, the lock released between them: the event loop's `lookup` waits for
            # one batch, not for the ~1,000 chunks of a new 100k-token prompt.
            for at in range(0, len(chunks), INSERT_BATCH):
                with self._locked():
                    if at == 0:
                        if base is self._root:
                            self.misses += 1
                            self.fallbacks += fallback
                        else:
                            self.partial_hits += 1
                        self.reused_tokens += reused
                        self.encoded_tokens += len(new)
                        self.unverified += unverified
                        if pieces is not None:
                            self.verified += 1 - unverified
                        elif encoding is not None:
                            self.splits += encoding.pieces > 1
                            self.split_misses += encoding.missed
                    node = self._insert(node, chunks[at : at + INSERT_BATCH])
                if node is None:
                    break

        return answer, commit

    def _verify_due(self) -> bool:
        """Whether the next text the fast engine encoded in pieces is checked against `tokenizers`.
        A plain count: commits racing on it at worst check one text more or less."""
        self._ruled_count += 1
        return self._ruled_count <= VERIFY_FIRST or self._ruled_count % VERIFY_EVERY == 0

    def _fast_pieces(
        self,
        text: str,
        start: int,
        first: tuple[int, int] | None,
        checked: bool,
        blocking_chars: int | None,
    ) -> _Pieces | None:
        """`text[start:]` encoded in pieces cut at rule positions (`cutrules`), as the chunks to
        cache; None if the fast engine failed (it is then off). A piece `FastEngine.takes` refuses
        is encoded by `tokenizers` (none when `checked`: the caller checked the whole part)."""
        end = len(text) - self.margin  # a chunk's end needs `margin` characters after it
        cuts = cutrules.cuts(
            text, start, end, first=first, min_chars=self.min_chunk_chars, divisor=DEPTH_DIVISOR
        )
        bounds = [start, *cuts, len(text)]
        texts = [text[a:b] for a, b in itertools.pairwise(bounds)]
        slow = set() if checked else {k for k, piece in enumerate(texts) if not FastEngine.takes(piece)}
        if slow:
            _check_blocking(sum(len(texts[k]) for k in slow), blocking_chars)
        elif len(texts) == 1:  # a short new part (a question after a system prompt): no batch
            ids = self._tok.encode_fast(texts[0], add_special_tokens=False)
            return None if ids is None else _Pieces(ids, [(texts[0], array.array("I", ids), True)])
        got = self._tok.encode_fast_pieces([piece for k, piece in enumerate(texts) if k not in slow])
        if got is None:
            return None
        flat, starts = got
        parts: list[array.array[int]] = []
        if slow:
            done = iter(
                self._raw.encode_batch_fast([texts[k] for k in sorted(slow)], add_special_tokens=False)
            )
            k_fast = 0
            for k in range(len(texts)):
                if k in slow:
                    parts.append(array.array("I", next(done).ids))
                else:
                    parts.append(flat[starts[k_fast] : starts[k_fast + 1]])
                    k_fast += 1
            flat = array.array("I")
            for part in parts:
                flat.extend(part)
        else:
            parts = [flat[starts[k] : starts[k + 1]] for k in range(len(texts))]
        chunks = [(piece, part, False) for piece, part in zip(texts, parts, strict=True)]
        chunks[-1] = (texts[-1], parts[-1], True)
        return _Pieces(flat.tolist(), chunks)

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

    def _seam(self, text: str, path: list[_Node]) -> tuple[_Node, _Node, int] | None:
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
            found = last.children.get(text[pos : pos + KEY_CHARS])
            options = () if found is None else tuple(found) if isinstance(found, list) else (found,)
        for child in options:
            if len(child.text) >= margin and text.startswith(child.text[:margin], pos):
                return last, child, _shared(text, pos, child.text, margin)
        if len(path) >= 2 and last.end - path[-2].end >= margin:  # chunks from `first` may be short
            return path[-2], last, last.end - path[-2].end
        return None

    def _encode(self, text: str, start: int) -> _Encoded:
        """`text[start:]` encoded; a long one in pieces, one batch, spread over the cores.

        `encode_batch` runs a batch's texts on tokenizers' thread pool with the GIL released, so a
        text cut into as many pieces as there are cores can be encoded in about the time of its
        longest piece. Waking the pool's idle threads costs ~0.1 ms on the 2-vCPU VM measured, and
        the two vCPUs gave at most ~1.35x: a 10,000-character text 5.3 -> 3.9 ms, 4,000 characters
        2.0 -> 1.9 ms, 1,600 (a warm 4k chat's new part) 0.70 -> 0.81 ms, slower (each call after
        0.2 ms of other work, as between requests); hence SPLIT_CHARS. Exactness is the
        seam's argument again: each piece but the last runs `min_chunk_chars` past the next
        piece's start, and that start is kept only if it is a checkpoint in this piece (a token
        and a pre-token start there, decided by the text up to `margin` characters further);
        otherwise the whole text is encoded again (`split_misses`). A tokenizer whose pre-tokens do
        not start at `_CUT_AT` (WordPiece drops the space) stops being split after a few misses.
        The pieces are as many as the cores not taken by other texts being encoded (`_cuts`).
        """
        inflight = self._inflight
        cuts = self._cuts(text, start, len(inflight) + 1)
        inflight.append(None)
        try:
            return self._encode_cut(text, start, cuts)
        finally:
            inflight.pop()

    def _encode_cut(self, text: str, start: int, cuts: list[int]) -> _Encoded:
        if cuts:
            over = self.min_chunk_chars
            starts = [start, *cuts]
            texts = [text[a : b + over] for a, b in zip(starts, cuts, strict=False)]
            texts.append(text[cuts[-1] :])
            parts = self._raw.encode_batch(texts, add_special_tokens=False)
            joined = _join_pieces(parts, [a - start for a in starts])
            if joined is not None:
                return joined
        whole = self._raw.encode_batch([text[start:]], add_special_tokens=False)[0]
        return _Encoded.whole(whole, missed=bool(cuts))

    def _cuts(self, text: str, start: int, sharing: int = 1) -> list[int]:
        """Where to cut `text[start:]` into pieces (absolute offsets, increasing); [] for one piece.
        `sharing`: texts being encoded at once, this one included, which share the cores. Cutting
        when the cores are busy anyway gained nothing and cost throughput: two threads encoding
        cold 4k-token texts back to back, 1.1-1.2 M -> 0.76-0.95 M tokens/s."""
        size = len(text) - start
        count = min(self.pieces // sharing, size // self.split_chars)
        if count < 2 or (self.split_misses > 8 and self.split_misses * 4 > self.splits):
            return []
        over = self.min_chunk_chars
        step = (size + (count - 1) * over) // count - over  # pieces of about equal length
        end = len(text) - over  # the last piece must be as long as the overlap
        cuts: list[int] = []
        at = start
        for k in range(1, count):
            found = _CUT_AT.search(text, max(start + k * step, at + 1), end)
            if found is None:
                break
            at = found.start()
            cuts.append(at)
        return cuts

    def _specials(self, ids: list[int], add_special_tokens: bool) -> list[int]:
        if add_special_tokens and (self._head or self._tail):
            return self._head + ids + self._tail
        return ids

    def _joined(self, path: list[_Node], *, remember: str | None = None) -> list[int]:
        """The ids of `path`'s chunks as a new list, from the memo where `path` extends it (see
        `_Memo`). With `remember` (the text `path` covers), `path` becomes the memo: a seam's
        chain, which the next request is likely to share or extend. A chunk's ids never change,
        even once evicted, so the memo stays valid."""
        if not path:
            return []
        kept = self._memo
        start = 0
        if kept is not None and len(path) >= len(kept.path) and path[len(kept.path) - 1] is kept.path[-1]:
            ids = kept.ids.copy()
            start = len(kept.path)
            if start == len(path):
                return ids
            ids.extend(_join(path[start:]))
        else:
            ids = _join(path)
        if remember is not None and len(ids) <= MEMO_MAX_TOKENS:
            self._memo = _Memo(tuple(path), ids.copy(), remember)
        return ids

    def _locked(self) -> _Lock:
        return _Lock(self)

    def _lookup(self, text: str) -> tuple[list[_Node], bool]:
        """The chain of chunks `text` starts with, and whether the last is a final node ending it.

        Only an exact match is marked used here: a partial one is by the insert that follows."""
        path: list[_Node] = []
        exact = False
        size = len(text)
        kept = self._memo
        with self._locked():
            node = self._root
            pos = 0
            # The memo's chain, when the text starts with its text: one compare, not one per chunk.
            # Its last node alive means the whole chain is (eviction takes leaves first).
            if kept is not None and kept.path[-1].alive and text.startswith(kept.text):
                path.extend(kept.path)
                node = kept.path[-1]
                pos = node.end
            while True:
                found = node.children.get(text[pos : pos + KEY_CHARS])
                if found is None:
                    break
                nxt = None
                for child in found if isinstance(found, list) else (found,):
                    if child.final:
                        if child.end == size and text.startswith(child.text, pos):
                            nxt = child
                            exact = True
                            break
                    elif text.startswith(child.text, pos):
                        nxt = child
                if nxt is None:
                    break
                path.append(nxt)
                if exact:
                    break
                node = nxt
                pos = nxt.end
            if exact:
                self._touch(path[-1])
        return path, exact

    def _chunks(
        self, text: str, start: int, fresh: _Encoded, first: tuple[int, int] | None = None
    ) -> list[tuple[str, array.array[int], bool]]:
        """Cut `fresh` (the encoding of text[start:]) at checkpoints into (text, ids, final) chunks.
        `first`: a range of offsets (from `start`) where the first chunk should end (see `begin`).

        Each chunk ends at the first checkpoint at least `need` characters after its start. To
        find it, a galloping search (from `need // 4` tokens ahead: tokens average ~2.7 characters
        here) then a binary one find the first token starting that far, and the scan steps from
        there to the next pre-token start: ~7 offset look-ups per chunk. A Python pass over every
        token, or building the whole offsets list, cost as much as half of the encode itself, and
        stepping from `need // 4` tokens ahead (~14 look-ups) was ~0.1 ms of a warm 4k chat's
        ~0.8 ms (measured, bench `prefix`).
        """
        words = fresh.words
        ids = fresh.ids
        chars = fresh.start_of
        count = len(ids)
        limit = len(text) - start - self.margin
        ascii_only = self.ascii_checkpoints
        out: list[tuple[str, array.array[int], bool]] = []
        cur_char = 0
        cur_tok = 0
        if first is not None:  # the first chunk ends at a checkpoint in [lo, hi] if there is one
            lo, hi = first
            i = bisect.bisect_left(range(count), lo, 1, count, key=chars)
            while i < count:
                word = words[i]
                if word is not None and word != words[i - 1]:
                    c = chars(i)
                    if c > min(hi, limit):
                        break
                    if not (ascii_only and text[start + c] >= "\x80"):
                        out.append((text[start : start + c], array.array("I", ids[:i]), False))
                        cur_char = c
                        cur_tok = i
                        break
                i += 1
        while True:
            need = max(self.min_chunk_chars, (start + cur_char) // DEPTH_DIVISOR)
            target = cur_char + need
            if target > limit:
                break
            lo = cur_tok  # starts before target
            step = max(1, need // 4)
            hi = lo + step
            while hi < count and chars(hi) < target:
                lo = hi
                step *= 2
                hi = lo + step
            # Token starts never decrease, so the first one at or past target is found by bisection.
            i = bisect.bisect_left(range(count), target, lo + 1, min(hi, count), key=chars)
            cut = -1
            while i < count:
                word = words[i]
                if word is not None and word != words[i - 1]:
                    c = chars(i)
                    if c > limit:
                        break
                    if not (ascii_only and text[start + c] >= "\x80"):
                        cut = c
                        break
                i += 1
            if cut < 0:
                break
            out.append((text[start + cur_char : start + cut], array.array("I", ids[cur_tok:i]), False))
            cur_char = cut
            cur_tok = i
        out.append((text[start + cur_char :], array.array("I", ids[cur_tok:]), True))
        return out

    def _insert(self, base: _Node | None, chunks: list[tuple[str, array.array[int], bool]]) -> _Node | None:
        """Add `chunks` below `base` (reusing equal chunks), touch the path, evict; the last
        chunk's node, or None if `base` is gone. Under the lock."""
        if base is None or not base.alive:
            return None  # evicted meanwhile; the next request for this text inserts it again
        node = base
        for text, ids, final in chunks:
            key = text[:KEY_CHARS]
            found = node.children.get(key)
            same = None
            if found is not None:
                for child in found if isinstance(found, list) else (found,):
                    if child.final == final and child.text == text:
                        same = child
                        break
            if same is None:
                same = _Node(node, text, ids, node.end + len(text), final)
                if found is None:
                    node.children[key] = same
                elif isinstance(found, list):
                    found.append(same)
                else:
                    node.children[key] = [found, same]
                self._lru[same] = None
                self.cached_bytes += same.nbytes
                self.cached_tokens += len(ids)
                self.nodes += 1
            node = same
        if node is not base:
            self._touch(node)
        self._evict()
        return node if node.alive else None

    def _touch(self, node: _Node | None) -> None:
        """Mark `node` and its ancestors used, children before parents (the LRU's invariant)."""
        lru = self._lru
        while node is not None and node.parent is not None:
            lru.move_to_end(node)
            node = node.parent

    def _evict(self) -> None:
        while self.cached_bytes > self.max_bytes and self._lru:
            node, _ = self._lru.popitem(last=False)
            assert not node.children, "LRU order puts parents after their children"
            parent = node.parent
            assert parent is not None
            key = node.text[:KEY_CHARS]
            found = parent.children[key]
            if isinstance(found, list):
                found.remove(node)
                if len(found) == 1:
                    parent.children[key] = found[0]
            else:
                del parent.children[key]
            node.alive = False
            self.cached_bytes -= node.nbytes
            self.cached_tokens -= len(node.ids)
            self.nodes -= 1
            self.evictions += 1

    def clear(self) -> None:
        """Drop every cached chunk (counters other than the sizes are kept)."""
        with self._locked():
            for node in self._lru:
                node.alive = False
            self._lru.clear()
            self._root.children = {}
            self.cached_bytes = self.cached_tokens = self.nodes = 0


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


def _join(path: list[_Node]) -> list[int]:
    if not path:
        return []
    joined = array.array("I")
    for node in path:
        joined.extend(node.ids)
    return joined.tolist()


def _join_pieces(parts: list[tokenizers.Encoding], bases: list[int]) -> _Encoded | None:
    """`parts` (pieces starting at `bases`, each but the last running past the next's start) as
    one encoding, or None if a piece's successor does not start at a checkpoint of that piece.
    Every cut is at a space (`_CUT_AT`): ASCII, as checkpoints must be under NFC-like normalizers."""
    ids: list[int] = []
    words: list[int | None] = []
    firsts: list[int] = []
    for k, part in enumerate(parts):
        firsts.append(len(ids))
        if k == len(parts) - 1:
            ids.extend(part.ids)
            words.extend(part.word_ids)
            break
        cut = bases[k + 1] - bases[k]
        j = part.char_to_token(cut)
        if not j:  # None, or 0: the piece is at least split_chars long, so never a real cut
            return None
        span = part.token_to_chars(j)
        word = part.token_to_word(j)
        if span is None or span[0] != cut or word is None or word == part.token_to_word(j - 1):
            return None
        ids.extend(part.ids[:j])
        words.extend(part.word_ids[:j])
    return _Encoded(parts, bases, firsts, ids, words)


def _shared(text: str, pos: int, other: str, known: int) -> int:
    """How many characters `text[pos:]` and `other` share, knowing the first `known` agree."""
    lo, hi = known, min(len(other), len(text) - pos) + 1  # lo agree, hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if text.startswith(other[lo:mid], pos + lo):
            lo = mid
        else:
            hi = mid
    return lo


def _parallelism() -> int:
    """Pieces to cut a long text into: the cores tokenizers' pool may use, 1 if it may not."""
    if os.environ.get("TOKENIZERS_PARALLELISM", "").lower() in ("0", "false", "off", "no"):
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _window_agrees(fresh: _Encoded, window: _Node, length: int, margin: int) -> bool:
    """Whether `fresh` (the text encoded from the window's start) repeats the window's cached ids
    up to `margin` characters before the end of what the texts share (`length` characters of the
    window): beyond that point the new text may legitimately tokenize differently, since it need
    not continue as the cached one did. A pre-token reaching that point may differ as a whole (BPE
    merges within it), so the first difference may sit in any pre-token that ends past it."""
    n = len(window.ids)
    ids = fresh.ids
    if array.array("I", ids[:n]) == window.ids:
        return True
    cached = window.ids
    same = 0
    limit = min(n, len(ids))
    while same < limit and ids[same] == cached[same]:
        same += 1
    if same >= len(ids):
        return True  # the new text ends inside the window, every id agreeing
    words = fresh.words
    word = words[same]
    after = same + 1
    while word is not None and after < len(ids) and words[after] == word:
        after += 1
    return after >= len(ids) or fresh.start_of(after) > length - margin


def _specials(backend: tokenizers.Tokenizer, raw: tokenizers.Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after the content; refuses anything else."""
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


def _check(config: dict[str, Any]) -> tuple[bool, int]:
    """Refuse what the exactness argument does not cover; return (ASCII-only checkpoints, longest
    added token in characters)."""
    if config.get("truncation") is not None or config.get("padding") is not None:
        raise UnsupportedTokenizer("truncation or padding is configured in tokenizer.json")
    ascii_only = False
    for norm in _flatten(config.get("normalizer"), "normalizers"):
        kind = norm.get("type")
        if kind in _NORMALIZERS_ASCII:
            ascii_only = True
        elif kind not in _NORMALIZERS_LOCAL:
            raise UnsupportedTokenizer(f"normalizer {kind} is not known to be local")
    for pre in _flatten(config.get("pre_tokenizer"), "pretokenizers"):
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


def _flatten(item: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    if item is None:
        return []
    if item.get("type") == "Sequence":
        out: list[dict[str, Any]] = []
        for sub in item.get(key) or ():
            out.extend(_flatten(sub, key))
        return out
    return [item]
