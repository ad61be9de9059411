"""Encoding a long text in pieces, for the prefix cache (`epp.tokenize.prefixcache`).

`tokenizers`' pieces (`TokenizersPieces`). A text to encode (from the prefix cache's seam, or
whole on a miss) of at least 2 x `split_chars` characters is cut into up to `pieces` pieces
(default: the CPUs tokenizers' pool may use; fewer while other texts are being encoded, which share
those cores) at spaces before a letter, each but the last running `overlap` past the next one's
start, and encoded in one `encode_batch`, which runs them in parallel with the GIL released. A cut
is kept only if it is a checkpoint of the piece before it (the seam's argument in `prefixcache`,
with that piece as the cached text); else the text is encoded again whole (`misses`; a tokenizer
missing often, such as WordPiece, which drops the space, is no longer cut). `splits` counts texts
encoded in pieces.

fastokens' pieces (`fast_pieces`). For a tokenizer the cut rule is proved for (`cutrules`), a
text is cut at the rule's positions into the prefix cache's chunk sizes, and fastokens encodes the
pieces in one call: its ids need no checking at the cuts, and the pieces are the chunks to cache.
"""

from __future__ import annotations

import array
import bisect
import collections
import itertools
import os
import time
from typing import NamedTuple

import tokenizers

from epp.tokenize import chunktrie, cutrules, tokenizer
from epp.tokenize.tokenizer import FastEngine

SPLIT_CHARS = 2048  # texts to encode are cut into pieces of at least this many characters
YIELD_PIECES = 64  # pieces `fast_pieces` checks between two hand-overs of the GIL
MAX_PIECE_CHARS = tokenizer.MAX_FAST_CHARS  # `fast_pieces` declines a text with a longer piece

Chunk = tuple[str, "array.array[int]", bool]
"""A chunk to cache: its text, its ids, and whether it is final (matches only a text ending there)."""


class WouldBlock(Exception):
    """`begin` would encode more than its `blocking_chars` with `tokenizers`: call it in a worker."""


def check_blocking(chars: int, limit: int | None) -> None:
    if limit is not None and chars > limit:
        raise WouldBlock(f"{chars} characters for tokenizers, over {limit}")


class FastPieces(NamedTuple):
    """A new part encoded by the fast engine in pieces cut at rule positions (`fast_pieces`):
    its ids, and its pieces as the chunks to cache (text, ids, final), the last one final."""

    ids: list[int]
    chunks: list[Chunk]


class Encoded:
    """The encoding of `text[start:]` (offsets below are relative to `start`): one `tokenizers`
    Encoding, or several encoded as one batch and joined at verified checkpoints
    (`TokenizersPieces.encode`).

    `ids` and `words` (word ids: a change marks a pre-token start) are lists; `start_of(i)` is
    token i's first character. At a join the word ids may repeat across it: that only hides a
    checkpoint from `checkpoint_chunks`, never invents one (the join itself is a checkpoint)."""

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
    def whole(cls, encoding: tokenizers.Encoding, *, missed: bool = False) -> Encoded:
        return cls([encoding], [0], [0], encoding.ids, encoding.word_ids, missed=missed)

    def start_of(self, i: int) -> int:
        k = bisect.bisect_right(self._firsts, i) - 1 if len(self._parts) > 1 else 0
        span = self._parts[k].token_to_chars(i - self._firsts[k])
        assert span is not None  # no post-processor: every token covers text
        return self._bases[k] + span[0]


class TokenizersPieces:
    """`tokenizers` (`raw`: without its post-processor) encoding a long text in up to `pieces`
    pieces of at least `split_chars` characters, each but the last running `overlap` characters
    into the next. Counters: `splits` (texts encoded in pieces), `misses` (cuts that were not
    checkpoints: the text was encoded again whole). Thread-safe."""

    def __init__(self, raw: tokenizers.Tokenizer, *, pieces: int, split_chars: int, overlap: int) -> None:
        self.raw = raw
        self.pieces = pieces
        self.split_chars = split_chars
        self.overlap = overlap
        self.splits = 0
        self.misses = 0
        # One entry per `encode` under way (deque append and pop are atomic): the cores are
        # shared between the texts being encoded at once.
        self._inflight: collections.deque[None] = collections.deque()

    def encode(self, text: str, start: int) -> Encoded:
        """`text[start:]` encoded; a long one in pieces, one batch, spread over the cores.

        `encode_batch` runs a batch's texts on tokenizers' thread pool with the GIL released, so a
        text cut into as many pieces as there are cores can be encoded in about the time of its
        longest piece. Waking the pool's idle threads costs ~0.1 ms on the 2-vCPU VM measured, and
        the two vCPUs gave at most ~1.35x: a 10,000-character text 5.3 -> 3.9 ms, 4,000 characters
        2.0 -> 1.9 ms, 1,600 (a warm 4k chat's new part) 0.70 -> 0.81 ms, slower (each call after
        0.2 ms of other work, as between requests); hence SPLIT_CHARS. Exactness is the seam's
        argument again: each piece but the last runs `overlap` past the next piece's start, and
        that start is kept only if it is a checkpoint in this piece (a token and a pre-token start
        there, decided by the text up to the cache's `margin` characters further); otherwise the
        whole text is encoded again (`misses`). A tokenizer whose pre-tokens do not start at
        `cutrules.CUT_AT` (WordPiece drops the space) stops being split after a few misses. The
        pieces are as many as the cores not taken by other texts being encoded (`cuts`).
        """
        inflight = self._inflight
        cuts = self.cuts(text, start, len(inflight) + 1)
        inflight.append(None)
        try:
            encoded = self._encode_cut(text, start, cuts)
        finally:
            inflight.pop()
        self.splits += encoded.pieces > 1  # racing threads may miss a count: only a heuristic's
        self.misses += encoded.missed
        return encoded

    def _encode_cut(self, text: str, start: int, cuts: list[int]) -> Encoded:
        if cuts:
            over = self.overlap
            starts = [start, *cuts]
            texts = [text[a : b + over] for a, b in zip(starts, cuts, strict=False)]
            texts.append(text[cuts[-1] :])
            parts = self.raw.encode_batch(texts, add_special_tokens=False)
            joined = _join_pieces(parts, [a - start for a in starts])
            if joined is not None:
                return joined
        whole = self.raw.encode_batch([text[start:]], add_special_tokens=False)[0]
        return Encoded.whole(whole, missed=bool(cuts))

    def cuts(self, text: str, start: int, sharing: int = 1) -> list[int]:
        """Where to cut `text[start:]` into pieces (absolute offsets, increasing); [] for one piece.
        `sharing`: texts being encoded at once, this one included, which share the cores. Cutting
        when the cores are busy anyway gained nothing and cost throughput: two threads encoding
        cold 4k-token texts back to back, 1.1-1.2 M -> 0.76-0.95 M tokens/s."""
        size = len(text) - start
        count = min(self.pieces // sharing, size // self.split_chars)
        if count < 2 or (self.misses > 8 and self.misses * 4 > self.splits):
            return []
        over = self.overlap
        step = (size + (count - 1) * over) // count - over  # pieces of about equal length
        end = len(text) - over  # the last piece must be as long as the overlap
        cuts: list[int] = []
        at = start
        for k in range(1, count):
            found = cutrules.CUT_AT.search(text, max(start + k * step, at + 1), end)
            if found is None:
                break
            at = found.start()
            cuts.append(at)
        return cuts


def fast_pieces(
    tok: tokenizer.Tokenizer,
    raw: tokenizers.Tokenizer,
    text: str,
    start: int,
    cuts: list[int],
    *,
    checked: bool,
    blocking_chars: int | None,
) -> FastPieces | None:
    """`text[start:]` encoded by `tok`'s fast engine in pieces cut at `cuts` (rule positions:
    `cutrules.cuts`), as the chunks to cache; None if a piece would be longer than
    MAX_PIECE_CHARS, or the fast engine failed (it is then off). A piece `FastEngine.takes`
    refuses is encoded by `raw` (`tokenizers` without its post-processor); none is checked when
    `checked` (the caller checked the whole part). Raises WouldBlock past `blocking_chars` for
    `tokenizers`."""
    bounds = [start, *cuts, len(text)]
    if max(b - a for a, b in itertools.pairwise(bounds)) > MAX_PIECE_CHARS:
        return None  # CJK prose, minified code: few spaces before letters, chunks would be huge
    texts = [text[a:b] for a, b in itertools.pairwise(bounds)]
    slow: set[int] = set()
    if not checked:
        for k, piece in enumerate(texts):
            if not FastEngine.takes(piece):
                slow.add(k)
            if k % YIELD_PIECES == YIELD_PIECES - 1:
                time.sleep(0)  # let the event loop's thread have the GIL
    if slow:
        check_blocking(sum(len(texts[k]) for k in slow), blocking_chars)
    elif len(texts) == 1:  # a short new part (a question after a system prompt): no batch
        ids = tok.encode_fast(texts[0], add_special_tokens=False)
        return None if ids is None else FastPieces(ids, [(texts[0], array.array("I", ids), True)])
    got = tok.encode_fast_pieces([piece for k, piece in enumerate(texts) if k not in slow])
    if got is None:
        return None
    flat, starts = got
    parts: list[array.array[int]] = []
    if slow:
        done = iter(raw.encode_batch_fast([texts[k] for k in sorted(slow)], add_special_tokens=False))
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
    return FastPieces(chunktrie.as_list(flat), chunks)


def checkpoint_chunks(
    text: str,
    start: int,
    fresh: Encoded,
    first: tuple[int, int] | None,
    *,
    margin: int,
    min_chars: int,
    divisor: int,
    ascii_only: bool,
) -> list[Chunk]:
    """Cut `fresh` (the encoding of text[start:]) at checkpoints into (text, ids, final) chunks.
    `first`: a range of offsets (from `start`) where the first chunk should end (the prefix
    cache's `begin`). Chunks are at least `max(min_chars, start // divisor)` characters long and
    end `margin` characters before the text's end at the latest; with `ascii_only` a checkpoint
    must sit on an ASCII character.

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
    limit = len(text) - start - margin
    out: list[Chunk] = []
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
        need = max(min_chars, (start + cur_char) // divisor)
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


def window_agrees(fresh: Encoded, cached: array.array[int], length: int, margin: int) -> bool:
    """Whether `fresh` (the text encoded from the window's start) repeats the window's `cached` ids
    up to `margin` characters before the end of what the texts share (`length` characters of the
    window): beyond that point the new text may legitimately tokenize differently, since it need
    not continue as the cached one did. A pre-token reaching that point may differ as a whole (BPE
    merges within it), so the first difference may sit in any pre-token that ends past it."""
    n = len(cached)
    ids = fresh.ids
    if array.array("I", ids[:n]) == cached:
        return True
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


def _join_pieces(parts: list[tokenizers.Encoding], bases: list[int]) -> Encoded | None:
    """`parts` (pieces starting at `bases`, each but the last running past the next's start) as
    one encoding, or None if a piece's successor does not start at a checkpoint of that piece.
    Every cut is at a space (`cutrules.CUT_AT`): ASCII, as checkpoints must be under NFC-like normalizers."""
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
    return Encoded(parts, bases, firsts, ids, words)


def parallelism() -> int:
    """Pieces to cut a long text into: the cores tokenizers' pool may use, 1 if it may not."""
    if os.environ.get("TOKENIZERS_PARALLELISM", "").lower() in ("0", "false", "off", "no"):
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
