"""The simulated engine's KV block pool: vLLM's prefix cache, as far as routing can observe it.

What vLLM's block pool (`vllm/v1/core/block_pool.py`) does and this module does too:

* **Physical blocks.** `num_blocks - 1` usable blocks of `block_size` token slots (the null
  block, below). A running request holds one block per `block_size` tokens it has KV for; blocks
  are shared (reference-counted) when several requests hit the same cached prefix.
* **Block hashes.** Only full blocks are hashed, each over (parent hash, its token ids, its extra
  keys), so a hash stands for the whole prefix up to its block. Extra keys are the LoRA adapter's
  name on every block and the request's `cache_salt` on the first one (vLLM 0.19-0.30 order), so
  adapters and salts never share blocks. Two kinds of hash (`BlockHasher`): vLLM's own
  (`sha256`, its default, and `sha256_cbor`, with vLLM 0.32's seed and extra-key rules), which
  `epp sim` uses so that a router recomputing vLLM's hashes from a prompt (vllm-router's
  `kv_aware`) finds the blocks the events announce; and this simulator's fast one (blake2b, 16
  bytes, the default of the in-process benchmark, where nothing outside reads hashes). Events carry
  a hash's low 64 bits, as vLLM does by default, or, for vLLM's hashes, the whole digest
  (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`: `BlockPool.digest_for`). epp itself keys blocks from
  the events' token ids and treats these hashes as opaque.
* **The null block.** vLLM takes block 0 out of the pool at start as a placeholder
  (`BlockPool.__init__`: `self.null_block = self.free_block_queue.popleft()`), so a pool of
  `num_blocks` (vLLM's `num_gpu_blocks`, what `--num-gpu-blocks-override` sets) has
  `num_blocks - 1` usable blocks, ids 1 to `num_blocks - 1`; usage is counted over those.
* **Free queue and eviction.** Blocks nobody holds sit in one queue; new blocks are taken from
  its head, and a taken block that had a hash leaves the cache then (`BlockRemoved`, one per
  block). At start the queue holds every usable block in id order. A request frees its blocks
  tail first (`free_blocks(reversed(...))`); of those reaching no holder, the ones without a hash
  (a partial last block, or any block after a reset) go to the *front* of the queue, in that
  order, to be reused first (vLLM: "LIFO reuse of non-cached blocks"), and the cached ones to the
  back, so cached blocks are evicted least recently freed first, a prompt's last blocks before its
  first ones, and only when no hash-less block is left. A hit on a free cached block takes it out
  of the queue (`touch`).
* **Duplicates.** A block computed while an identical one is already cached (two requests racing,
  or a prompt whose last full block is never reused because the last prompt token must be
  computed) is cached again under the same hash and announced again; evicting either copy sends
  a `BlockRemoved` for that hash.
* **Events.** `BlockStored` when blocks are cached (one event per request step, with the parent's
  hash, the blocks' tokens, LoRA id and name, medium "GPU" and the untagged extra keys),
  `BlockRemoved` on eviction, `AllBlocksCleared` on reset. They queue in the pool until the
  caller `take_events()`s them, as the engine core takes them once per step.

* **Capacity checks.** `num_free` is what vLLM's `get_num_free_blocks` returns (the length of the
  free queue: never-used, hash-less and cached free blocks). The step-based engine
  (`epp.sim.core`) checks it before allocating and preempts when it falls short, as vLLM's
  scheduler does; `cache(start=, end=)` lets it commit exactly the blocks a step schedules
  (`allocate_slots` -> `cache_blocks`, at scheduling time, blocks filled by generated tokens
  included). `allocate` still makes up blocks outside the pool when none is free, for a caller
  that does not check first; those are never cached.

Deliberately absent: hybrid models (several KV cache groups, partial-block hashes), multimodal
extra keys, CPU offloading, `kv_cache_report_mode="full"` (re-announcing hit blocks).
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
from array import array
from collections.abc import Sequence
from typing import Any, Final, Literal, NewType

import cbor2

from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored

Event = BlockStored | BlockRemoved | AllBlocksCleared

Digest = NewType("Digest", bytes)
"""A block hash: 16 bytes of blake2b (the fast hasher), or vLLM's 32-byte SHA-256 digest."""

_PERSON: Final = b"epp-sim-block"
# The parent of a sequence's first block: fixed, as vLLM >= 0.29's NONE_HASH for sha256.
NONE_HASH: Final = Digest(hashlib.blake2b(b"none-hash", digest_size=16, person=_PERSON).digest())
MEDIUM: Final = "GPU"


def wire_hash(digest: Digest) -> int:
    """The int a KV event carries for `digest`: its last 8 bytes, big-endian (vLLM's default)."""
    return int.from_bytes(digest[-8:], "big")


def extra_keys(index: int, lora_name: str | None, cache_salt: str | None) -> list[str] | None:
    """Block `index`'s extra keys as events publish them (untagged): the adapter name on every block,
    then the salt on block 0; None when there are none."""
    keys = [lora_name] if lora_name else []
    if index == 0 and cache_salt:
        keys.append(cache_salt)
    return keys or None


_NO_EXTRA: Final = b"\x00"


def _encode_extra(keys: list[str] | None) -> bytes:
    if not keys:
        return _NO_EXTRA
    out = bytearray(b"\x01")
    for key in keys:
        raw = key.encode("utf-8", "surrogatepass")
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


def block_digests(
    token_ids: Sequence[int], block_size: int, *, lora_name: str | None = None, cache_salt: str | None = None
) -> list[Digest]:
    """The chained hashes of the full blocks of `token_ids` (a partial last block has none).

    Raises:
        OverflowError: a token id outside the signed 64-bit range.
    """
    out: list[Digest] = []
    extend_digests(out, token_ids, block_size, lora_name=lora_name, cache_salt=cache_salt)
    return out


def extend_digests(
    digests: list[Digest],
    token_ids: Sequence[int],
    block_size: int,
    *,
    lora_name: str | None = None,
    cache_salt: str | None = None,
) -> int:
    """Append to `digests` (the hashes of the first `len(digests)` blocks of `token_ids`) the hashes
    of the further full blocks of `token_ids`; returns how many were added.

    Only the new blocks' tokens are read, so a request growing by generated tokens hashes each
    block once.

    Raises:
        OverflowError: a token id outside the signed 64-bit range.
    """
    first = len(digests)
    last = len(token_ids) // block_size
    if last <= first:
        return 0
    # One conversion for the new tokens, then fixed-width slices: 8 bytes a token, so a block's
    # bytes cannot be read as another's.
    data = array("q", token_ids[first * block_size : last * block_size]).tobytes()
    width = block_size * 8
    plain = not lora_name and not cache_salt  # the common case: no keys to encode
    rest = _NO_EXTRA if plain else _encode_extra(extra_keys(1, lora_name, None))  # blocks after the first
    parent = digests[-1] if digests else NONE_HASH
    for i in range(first, last):
        extra = rest if i or plain else _encode_extra(extra_keys(0, lora_name, cache_salt))
        h = hashlib.blake2b(parent, digest_size=16, person=_PERSON)
        h.update(extra)
        at = (i - first) * width
        h.update(data[at : at + width])
        parent = Digest(h.digest())
        digests.append(parent)
    return last - first


HashAlgo = Literal["epp-sim", "sha256", "sha256_cbor"]
VLLM_HASH_ALGOS: Final = ("sha256", "sha256_cbor")
"""vLLM 0.32's `--prefix-caching-hash-algo` values the simulator computes (the xxhash ones need a
random seed unless PYTHONHASHSEED is set, and no router recomputes them)."""
VLLM_NONE_HASH_SEED: Final = "vllm-none-hash"
"""vLLM >= 0.29's seed of NONE_HASH for the cryptographic algorithms when PYTHONHASHSEED is unset."""


def _sha256_pickle(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


class BlockHasher:
    """How a block's hash is computed from its parent's, its token ids and its extra keys.

    `epp-sim` is `extend_digests` (blake2b over the raw ids: fast, and nobody outside the process
    reads it). `sha256` and `sha256_cbor` are vLLM 0.32's `hash_block_tokens`: the hash function
    over the tuple `(parent or NONE_HASH, tuple(block token ids), extra keys)`, pickled (protocol 5)
    or canonical CBOR, where NONE_HASH is the function of the seed string (`$PYTHONHASHSEED`, else
    "vllm-none-hash") and the extra keys are `(("lora", name, path),)` on every block of an adapter's
    request plus `("cache_salt", salt)` on block 0, or None. Equal to real vLLM's hashes:
    tests/sim/test_vllm_hashes.py checks them against vectors computed by vLLM 0.32 itself.
    """

    def __init__(self, algo: HashAlgo = "epp-sim", *, seed: str | None = None) -> None:
        if algo not in ("epp-sim", *VLLM_HASH_ALGOS):
            raise ValueError(f"unknown hash algorithm {algo!r}; known: epp-sim, {', '.join(VLLM_HASH_ALGOS)}")
        self.algo = algo
        self._fn = _sha256_cbor if algo == "sha256_cbor" else _sha256_pickle
        if seed is None:
            seed = os.environ.get("PYTHONHASHSEED", VLLM_NONE_HASH_SEED)
        self.seed = seed
        self.none_hash = NONE_HASH if algo == "epp-sim" else Digest(self._fn(seed))

    def extend(
        self,
        digests: list[Digest],
        token_ids: Sequence[int],
        block_size: int,
        *,
        lora_name: str | None = None,
        lora_path: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """`extend_digests` with this hasher; returns how many digests were added."""
        if self.algo == "epp-sim":
            return extend_digests(digests, token_ids, block_size, lora_name=lora_name, cache_salt=cache_salt)
        first = len(digests)
        last = len(token_ids) // block_size
        if last <= first:
            return 0
        lora: list[Any] = [("lora", lora_name, lora_path or lora_name)] if lora_name else []
        rest = tuple(lora) or None
        parent = digests[-1] if digests else self.none_hash
        fn = self._fn
        for i in range(first, last):
            extra = rest
            if i == 0 and cache_salt:
                extra = (*lora, ("cache_salt", cache_salt))
            parent = Digest(fn((parent, tuple(token_ids[i * block_size : (i + 1) * block_size]), extra)))
            digests.append(parent)
        return last - first

    def digests(
        self,
        token_ids: Sequence[int],
        block_size: int,
        *,
        lora_name: str | None = None,
        lora_path: str | None = None,
        cache_salt: str | None = None,
    ) -> list[Digest]:
        out: list[Digest] = []
        self.extend(
            out, token_ids, block_size, lora_name=lora_name, lora_path=lora_path, cache_salt=cache_salt
        )
        return out


FAST_HASHER: Final = BlockHasher()


class PrefixDigests:
    """Block hashes of shared prompt prefixes, remembered by a label (a tenant, a system prompt, a
    conversation), so a driver sending many prompts that share a prefix hashes it once.

    Hashing is the cost of admitting a long prompt (~1 ms for 7,200 tokens): a benchmark run sends
    tens of thousands of prompts built from a few hundred prefixes. A label is only a hint: the
    remembered tokens are compared with the new prompt's before their hashes are reused (once per
    prompt object: a few recently checked objects per label are remembered), so a wrong label costs
    a hash, never a wrong digest. At most `max_labels` labels are kept, least recently used dropped
    first. No LoRA adapter or cache salt (they change every hash).
    """

    _CHECKED_PER_LABEL = 8

    def __init__(self, block_size: int, *, max_labels: int = 256) -> None:
        self.block_size = block_size
        self.max_labels = max_labels
        # label -> (tokens whose leading blocks were hashed, those blocks' digests, prompt objects
        # already found to share that many leading blocks with them, by id; holding the objects
        # keeps their ids unique).
        self._known: collections.OrderedDict[
            str, tuple[Sequence[int], list[Digest], dict[int, tuple[Sequence[int], int]]]
        ] = collections.OrderedDict()

    def prefix(self, label: str, token_ids: Sequence[int], shared_tokens: int) -> list[Digest]:
        """The digests of the full blocks within the first `shared_tokens` of `token_ids` (a new
        list the caller may keep), reusing what `label`'s previous prompts had hashed."""
        bs = self.block_size
        want = min(shared_tokens, len(token_ids)) // bs
        if want <= 0:
            return []
        known = self._known.get(label)
        reuse = 0
        if known is not None:
            self._known.move_to_end(label)
            tokens, digests, checked = known
            reuse = min(want, len(digests))
            seen = checked.get(id(token_ids))
            if seen is None or seen[0] is not token_ids or seen[1] < reuse:
                # Equal leading tokens give equal digests: compare the blocks both prompts have.
                while reuse > 0 and tokens[: reuse * bs] != token_ids[: reuse * bs]:
                    reuse //= 2  # a shorter common prefix (a conversation that branched)
            if reuse == want:
                if len(checked) >= self._CHECKED_PER_LABEL:
                    del checked[next(iter(checked))]
                checked[id(token_ids)] = (token_ids, want)
                return digests[:want]
            digests = digests[:reuse]
        else:
            digests = []
        extend_digests(digests, token_ids[: want * bs], bs)
        self._known[label] = (token_ids, digests, {id(token_ids): (token_ids, want)})
        self._known.move_to_end(label)
        if len(self._known) > self.max_labels:
            self._known.popitem(last=False)
        return digests[:]


class Block:
    """One physical block. `digest` is set while it is cached; `ref` counts requests holding it."""

    __slots__ = ("digest", "id", "ref")

    def __init__(self, block_id: int) -> None:
        self.id = block_id  # < 0: outside the pool (see BlockPool.allocate)
        self.digest: Digest | None = None
        self.ref = 0


class BlockPool:
    """vLLM's block pool for prefix caching; see the module docstring.

    Single-threaded: callers are the simulator's coroutines, on one event loop.
    """

    def __init__(
        self, num_blocks: int, block_size: int, *, record_events: bool = False, keep_digests: bool = False
    ) -> None:
        """`num_blocks`: vLLM's `num_gpu_blocks`, the null block included (so one fewer is usable).
        `keep_digests`: remember each event hash's whole digest (`digest_for`), for a publisher
        that sends digests rather than their low 64 bits.

        Raises:
            ValueError: `block_size` < 1 or `num_blocks` < 1 (vLLM asserts both).
        """
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0 (the null block included), got {num_blocks}")
        self.num_blocks = num_blocks
        self.usable = num_blocks - 1  # block 0 is vLLM's null block, never handed out
        self.block_size = block_size
        self.record_events = record_events
        self.held = 0  # pool blocks some request holds
        self.outside = 0  # blocks running requests hold beyond the pool (no free block was left)
        self.cached = 0  # blocks with a digest (a digest held by two blocks counts twice)
        # vLLM's one free queue, kept as three runs that together are that queue, head first:
        # hash-less blocks put at the front by `free` (most recently freed run first), the
        # never-used blocks (ids `num_blocks - _fresh` up, as a count: profiles have ~30k), and
        # the blocks appended by `free` (cached when freed), least recently freed first. Every
        # block `free` prepends has no hash and nothing gives a free block one, so `touch` only
        # ever takes blocks out of the last run.
        self._front: collections.deque[Block] = collections.deque()
        self._fresh = self.usable
        self._free: collections.OrderedDict[int, Block] = collections.OrderedDict()
        # digest -> its blocks: one block, or a dict of duplicates by id (the common case is one,
        # so no dict is built for it).
        self._by_digest: dict[Digest, Block | dict[int, Block]] = {}
        self._events: list[Event] = []
        self._outside_ids = 0
        # Event hash -> whole digest, for every digest cached now, and for the ones that left the
        # cache until the events announcing it were taken and published (`_forget`: the digests
        # that left since the last `take_events`, `_forgetting`: those of the batch before).
        self._book: dict[int, Digest] | None = {} if keep_digests else None
        self._forget: list[Digest] = []
        self._forgetting: list[Digest] = []

    # --- queries --------------------------------------------------------------------------------

    def usage(self) -> float:
        """Share of the usable blocks held by running requests (free cached blocks count as free),
        as vLLM's `get_usage` (which leaves the null block out)."""
        if self.usable <= 0:
            return 0.0
        return min(1.0, (self.held + self.outside) / self.usable)

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now: the free queue's length (never used, hash-less or
        cached), as vLLM's `get_num_free_blocks`."""
        return len(self._front) + self._fresh + len(self._free)

    def lookup(self, digests: Sequence[Digest], limit: int | None = None) -> list[Block]:
        """The cached blocks of the longest cached prefix of `digests`, at most `limit` of them
        (nothing is touched)."""
        found: list[Block] = []
        by_digest = self._by_digest
        for d in digests if limit is None or limit < 0 else digests[:limit]:
            hit = by_digest.get(d)
            if hit is None:
                break
            found.append(hit if isinstance(hit, Block) else next(iter(hit.values())))
        return found

    @property
    def distinct_cached(self) -> int:
        """Distinct hashes cached (`cached` counts duplicate copies too)."""
        return len(self._by_digest)

    # --- request lifecycle ----------------------------------------------------------------------

    def touch(self, blocks: Sequence[Block]) -> None:
        """A request starts holding these (cached) blocks: a free one leaves the queue."""
        for b in blocks:
            if b.ref == 0:
                del self._free[b.id]
                self.held += 1
            b.ref += 1

    def allocate(self, n: int) -> list[Block]:
        """`n` new blocks from the head of the free queue (`get_new_blocks`), evicting the hash of a
        cached one.

        With nothing free, blocks outside the pool are made up (vLLM would not schedule the request):
        the request runs, its usage shows 100%, and those blocks are never cached. The step-based
        engine never gets here: it checks `num_free` first, as vLLM's scheduler does.
        """
        out: list[Block] = []
        for _ in range(n):
            if self._front:
                block = self._front.popleft()
                self.held += 1
            elif self._fresh:
                block = Block(self.num_blocks - self._fresh)
                self._fresh -= 1
                self.held += 1
            elif self._free:
                _, block = self._free.popitem(last=False)
                if block.digest is not None:
                    self._evict(block)
                self.held += 1
            else:
                self._outside_ids -= 1
                block = Block(self._outside_ids)
                self.outside += 1
            block.ref = 1
            out.append(block)
        return out

    def cache(
        self,
        blocks: Sequence[Block],
        digests: Sequence[Digest],
        token_ids: Sequence[int],
        *,
        lora_id: int | None = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        start: int | None = None,
        end: int | None = None,
    ) -> int:
        """Cache the request's computed full blocks that have no digest yet; one `BlockStored`.

        `blocks[i]` holds block i of the request, whose hash is `digests[i]`. Without `start`, the
        blocks to store are those from the first one without a digest (after a hit: the first
        computed one; after a forced reset: block 0) up to the last full block or the first block
        outside the pool. With `start` and `end` (vLLM's per-request count of cached blocks and
        the full blocks this step completes), exactly blocks `start..end-1` are stored, with no
        scan: each must be in the pool and have no digest. Returns how many were stored.
        """
        if start is None or end is None:
            n = min(len(blocks), len(digests))
            start = 0
            while start < n and blocks[start].digest is not None:
                start += 1
            end = start
            while end < n and blocks[end].id >= 0 and blocks[end].digest is None:
                end += 1
        if end <= start:
            return 0
        for i in range(start, end):
            block, digest = blocks[i], digests[i]
            assert block.digest is None and block.id >= 0, "only new pool blocks are cached"
            block.digest = digest
            self._index(block, digest)
        self.cached += end - start
        if self.record_events:
            bs = self.block_size
            self._events.append(
                BlockStored(
                    block_hashes=[wire_hash(d) for d in digests[start:end]],
                    parent_block_hash=wire_hash(digests[start - 1]) if start else None,
                    token_ids=list(token_ids[start * bs : end * bs]),
                    block_size=bs,
                    lora_id=lora_id,
                    medium=MEDIUM,
                    lora_name=lora_name,
                    extra_keys=[extra_keys(i, lora_name, cache_salt) for i in range(start, end)]
                    if lora_name or cache_salt
                    else [None] * (end - start),
                )
            )
        return end - start

    def free(self, blocks: Sequence[Block]) -> None:
        """A request lets go of its blocks (`blocks` in request order), as vLLM's `free_blocks` of
        them reversed: blocks no request holds any more join the free queue, the hash-less ones at
        its front (reused first: a partial block is never a hit), the cached ones at its back,
        tail first (so a prompt's last blocks are evicted before its first ones)."""
        first: list[Block] = []
        for b in reversed(blocks):
            b.ref -= 1
            if b.ref:
                continue
            if b.id < 0:
                self.outside -= 1
                continue
            self.held -= 1
            if b.digest is None:
                first.append(b)
            else:
                self._free[b.id] = b
        if first:
            # prepend_n: the run goes to the front in its own order.
            self._front.extendleft(reversed(first))

    def reset(self, *, force: bool = False) -> bool:
        """Drop every cached hash (vLLM's reset_prefix_cache); one `AllBlocksCleared`.

        Refused (False, nothing changes) while requests hold blocks, unless `force`: then held
        blocks lose their hashes too and their requests cache them again from block 0, as vLLM
        recomputes the requests it preempts for a forced reset.
        """
        if (self.held or self.outside) and not force:
            return False
        for hit in self._by_digest.values():
            for b in (hit,) if isinstance(hit, Block) else hit.values():
                b.digest = None
        if self._book is not None:
            self._forget.extend(self._by_digest)
        self._by_digest.clear()
        self.cached = 0
        if self.record_events:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[Event]:
        """The events since the last call, oldest first (the list is handed over, not copied)."""
        events, self._events = self._events, []
        if self._book is not None:
            # The batch before this one has been published: its departed digests may go, unless
            # cached again since.
            for digest in self._forgetting:
                if digest not in self._by_digest:
                    self._book.pop(wire_hash(digest), None)
            self._forgetting, self._forget = self._forget, []
        return events

    def digest_for(self, event_hash: int) -> bytes:
        """The whole digest of a hash in the events `take_events` returned last (or in the
        batch before): what vLLM sends with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`.

        Raises:
            KeyError: the pool keeps no digests (`keep_digests=False`), or never announced it.
        """
        if self._book is None:
            raise KeyError(event_hash)
        return self._book[event_hash]

    # --- internals ------------------------------------------------------------------------------

    def _index(self, block: Block, digest: Digest) -> None:
        if self._book is not None:
            self._book[wire_hash(digest)] = digest
        known = self._by_digest.get(digest)
        if known is None:
            self._by_digest[digest] = block
        elif isinstance(known, Block):
            self._by_digest[digest] = {known.id: known, block.id: block}
        else:
            known[block.id] = block

    def _evict(self, block: Block) -> None:
        digest = block.digest
        assert digest is not None
        block.digest = None
        self.cached -= 1
        known = self._by_digest[digest]
        if isinstance(known, Block):
            del self._by_digest[digest]
            if self._book is not None:
                self._forget.append(digest)
        else:
            del known[block.id]
            if len(known) == 1:
                self._by_digest[digest] = next(iter(known.values()))
        if self.record_events:
            self._events.append(BlockRemoved(block_hashes=[wire_hash(digest)], medium=MEDIUM))
