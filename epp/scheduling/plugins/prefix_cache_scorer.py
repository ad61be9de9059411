"""`prefix-cache-scorer`: prefer endpoints likely to hold the request's prompt prefix in KV cache.

What it does: the approximate prefix-cache scorer (GIE's, for pools without KV events). epp cannot
see the model servers' caches, so it learns from its own decisions: after a request is routed, the
primary endpoint is assumed to hold the request's prompt blocks. The prompt is cut into blocks, each
identified by a chained hash (`h_i = hash(h_{i-1}, block_i)`, seeded by the target model so models
never share entries), so a block hash stands for the whole prefix up to and including that block.

- `score`: walks the request's block hashes in order; an endpoint's match is the number of leading
  blocks it holds consecutively, and it scores `matched / total blocks`. The walk stops at the
  first block no endpoint still in the running holds.
- `pre_request`: records every block of the request on the primary target (and, as GIE does for
  prefill/decode disaggregation, on the target of a profile named `prefill`).
- Index: per endpoint an LRU of block hashes, plus a reverse map hash -> endpoint(s) for `score`.
  Entries of endpoints removed from the datastore are purged at once (datastore subscription).

Blocks: token ids are cut every `blockSizeTokens` ids; they are the tokenizer's output when a
tokenizer is known for the model (`consumes_tokens`), or the ids a completions prompt was given as.
Without them the text is cut every `blockSizeTokens * 4` characters, as GIE does (it assumes 4
characters per token). At most `maxPrefixBlocksToMatch` blocks are hashed,
the rest of a longer prompt is ignored. A trailing partial block is hashed too (GIE PR #2823), so a
repeated identical prompt scores 1.0 rather than (n-1)/n. A prompt shorter than one full block
gets no hashes at all, hence score 0 everywhere and nothing recorded: vLLM caches only full blocks,
so such a prompt gains nothing from affinity, and hashing it would pile every repeat of a short
prompt (health probes, "hi") onto one endpoint.

Inputs consumed: `InferenceRequest.target_model`; `token_ids` when known, else `prompt_texts`
concatenated in order (completions prompt(s), chat message texts); `Endpoint.metrics`
`num_gpu_blocks` and `block_size` (scraped `vllm:cache_config_info`) when `autoTune` is on. Writes
the request's block-hash list (`list[int]`) to `CycleState[<plugin name>]`, and the number of
candidates holding a prefix of it to `CycleState[matched_key(<plugin name>)]` (when any does).

Parameters (GIE names; each must be > 0, else the factory raises `registry.ConfigError`):
- `blockSizeTokens` (16): tokens per block; 4x as many characters for text prompts.
- `maxPrefixBlocksToMatch` (256): blocks hashed per request (16384 characters by default).
- `lruCapacityPerServer` (31250): blocks remembered per endpoint (H100 80GB: ~500K tokens / 16).
- `autoTune` (true): when an endpoint reports `num_gpu_blocks`, its LRU capacity is its real KV
  cache size instead, converted to our blocks as `num_gpu_blocks * block_size / blockSizeTokens`.
  Unlike GIE, the block size itself is not tuned from the metrics: hashes of one request must not
  depend on which endpoint happened to be the first candidate.
- `maxPrefixTokensToMatch` (0): when > 0, replaces `maxPrefixBlocksToMatch` by this many tokens'
  worth of whole blocks (at least one), as in GIE.
- `hashBlockSize` (GIE v1.0): the block size in characters, which v1.0 cut prompt text by; text is
  cut every `hashBlockSize` characters and token ids every `hashBlockSize // 4` (at least 1). Not
  together with `blockSizeTokens`.
- `blockSize`: GIE's deprecated block size in characters, refused as GIE (v1.1+) refuses it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Annotated, Any, Final

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry

CHARS_PER_TOKEN = 4  # GIE's averageCharactersPerToken


def matched_key(name: str) -> str:
    """The CycleState key under which scorer `name` leaves how many candidates hold a prefix of
    the request (absent: none), for `no-hit-lru-scorer`."""
    return f"{name}/matched"


def matches_key(name: str) -> str:
    """The CycleState key under which scorer `name` leaves {endpoint: leading blocks held} for the
    request (absent: nobody holds its first block), for the P/D deciders (epp.scheduling.disagg)."""
    return f"{name}/matches"


_Positive = Annotated[int, msgspec.Meta(gt=0)]


@registry.register("prefix-cache-scorer")
class PrefixCacheScorer(registry.PluginBase):
    consumes_tokens: Final = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        blockSizeTokens: _Positive | None = None  # None: 16, or derived from hashBlockSize
        maxPrefixBlocksToMatch: _Positive = 256
        lruCapacityPerServer: _Positive = 31250
        autoTune: bool = True
        hashBlockSize: _Positive | None = None  # GIE v1.0: characters per block
        blockSize: int | None = None  # GIE v1.1-v1.5's deprecated characters per block: refused
        maxPrefixTokensToMatch: Annotated[int, msgspec.Meta(ge=0)] = 0  # > 0: overrides blocks

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        label = f"plugin {name!r} (type {self.type!r})"
        if params.blockSize is not None:
            # GIE (v1.1+) refuses it alike: it was a size in characters, blockSizeTokens replaced it.
            raise registry.ConfigError(
                f"{label}: parameter blockSize ({params.blockSize}) is GIE's deprecated block size in "
                "characters, which GIE itself refuses; use blockSizeTokens (tokens per block)"
            )
        if params.hashBlockSize is not None and params.blockSizeTokens is not None:
            raise registry.ConfigError(
                f"{label}: give blockSizeTokens or GIE v1.0's hashBlockSize (characters), not both"
            )
        if params.hashBlockSize is not None:
            # GIE v1.0 cut the prompt text every hashBlockSize characters; token ids, which v1.0
            # never hashed, are cut at the same length in GIE's 4 characters per token.
            self._block_chars = params.hashBlockSize
            self._block_tokens = max(1, params.hashBlockSize // CHARS_PER_TOKEN)
        else:
            self._block_tokens = params.blockSizeTokens or 16
            self._block_chars = self._block_tokens * CHARS_PER_TOKEN
        self._max_blocks = params.maxPrefixBlocksToMatch
        if params.maxPrefixTokensToMatch > 0:  # GIE: takes precedence, in whole blocks
            self._max_blocks = max(1, params.maxPrefixTokensToMatch // self._block_tokens)
        self._capacity = params.lruCapacityPerServer
        self._auto_tune = params.autoTune
        self._start_index(handle)

    def _start_index(self, handle: interfaces.Handle) -> None:
        self._datastore = handle.datastore
        # Per endpoint: its block hashes, least recently used first (OrderedDict pops the oldest in
        # O(1); a plain dict's next(iter()) degrades as deleted slots pile up at its front).
        self._lrus: dict[Endpoint, OrderedDict[int, None]] = {}
        # Block hash -> the endpoint holding it, or a set once two or more do. One owner is the
        # common case, and a set per block would cost ~200 bytes for each of ~250K entries.
        self._owners: dict[int, Endpoint | set[Endpoint]] = {}
        # PreRequest hooks get no CycleState, but the Director calls them right after `schedule`,
        # with no await in between, so the last request scored is the one being recorded; any
        # other request is simply hashed again.
        self._last: tuple[InferenceRequest, list[int]] | None = None
        handle.datastore.subscribe(self._on_endpoints_changed)

    # --- decision -------------------------------------------------------------------------------

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        hashes = self.block_hashes(request, endpoints)
        cycle[self.name] = hashes
        self._last = (request, hashes)
        if not hashes or not self._owners:
            return [0.0] * len(endpoints)
        matched = self._match(hashes)
        if not matched:
            return [0.0] * len(endpoints)
        cycle[matched_key(self.name)] = sum(1 for ep in endpoints if ep in matched)
        cycle[matches_key(self.name)] = matched
        inverse = 1.0 / len(hashes)
        return [matched.get(ep, 0) * inverse for ep in endpoints]

    def match_info(
        self, cycle: interfaces.CycleState, endpoints: Sequence[Endpoint]
    ) -> list[tuple[float, int, int]]:
        """After `score`: per endpoint (leading blocks held, request blocks, tokens per block), the
        PrefixCacheMatchInfo llm-d's prefix-cache-scorer reads from a producer."""
        hashes = cycle.get(self.name)
        total = len(hashes) if isinstance(hashes, list) else 0
        matches: dict[Endpoint, int] = cycle.get(matches_key(self.name), {})
        return [(float(matches.get(ep, 0)), total, self._block_tokens) for ep in endpoints]

    @property
    def block_tokens(self) -> int:
        """Tokens per hashed block (text is cut every 4x as many characters)."""
        return self._block_tokens

    def block_hashes(self, request: InferenceRequest, endpoints: Sequence[Endpoint] = ()) -> list[int]:
        """The request's chained block hashes, at most `maxPrefixBlocksToMatch`; [] if < 1 block.

        Python's built-in `hash` of a (previous hash, block) tuple: SipHash over the str slice in
        C, no UTF-8 encoding and no hash object per block, ~4x faster than hashlib.blake2b
        (measured on a 16 KB prompt: ~50 us vs ~200 us per request, mean, Python 3.11).
        Values differ between processes (hash randomisation), which is fine for a per-process index.
        """
        h = hash(request.target_model)
        out: list[int] = []
        ids = request.token_ids
        if ids:
            size = self._block_tokens
            if len(ids) < size:
                return out
            for i in range(0, min(len(ids), size * self._max_blocks), size):
                h = hash((h, tuple(ids[i : i + size])))
                out.append(h)
            return out
        if not request.prompt_texts:
            return out
        size = self._block_chars
        prompt: str
        limit = size * self._max_blocks
        prompt = _text_prefix(request.prompt_texts, limit)
        if len(prompt) < size:
            return out
        for i in range(0, min(len(prompt), limit), size):
            h = hash((h, prompt[i : i + size]))
            out.append(h)
        return out

    def _match(self, hashes: list[int]) -> dict[Endpoint, int]:
        """Endpoint -> number of leading blocks it holds consecutively (endpoints with 0 omitted)."""
        get = self._owners.get
        counts: dict[Endpoint, int] = {}
        first = get(hashes[0])
        if first is None:
            return counts
        # Copied: `alive` shrinks as endpoints drop out and must not alias a set of the index.
        alive = set(first) if isinstance(first, set) else {first}
        k = 1  # blocks every endpoint in `alive` holds so far
        for h in hashes[1:]:
            owners = get(h)
            if owners is None:
                break
            if isinstance(owners, set):
                if alive <= owners:  # nobody drops out: no new set (halves the 8-owner walk)
                    k += 1
                    continue
                still = alive & owners
            elif owners in alive:
                if len(alive) == 1:  # the common case: one endpoint holds the whole prefix
                    k += 1
                    continue
                still = {owners}
            else:
                break
            for ep in alive - still:
                counts[ep] = k
            alive = still
            if not alive:
                break
            k += 1
        for ep in alive:
            counts[ep] = k
        return counts

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        """What it matched: the request's blocks and each candidate's leading run of them in this
        epp's own record of its decisions. Matched again here (explain only): the record changes in
        `pre_request`, which runs after the explain call."""
        hashes = cycle.get(self.name)
        if not isinstance(hashes, list):
            return {}
        matched = self._match(hashes) if hashes and self._owners else {}
        return framework.explain_inputs(
            cycle,
            lambda ep: {"matched_blocks": matched.get(ep, 0)},
            {"request_blocks": len(hashes), "block_size_tokens": self._block_tokens},
        )

    # --- effect ---------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        last = self._last
        self._last = None  # do not keep the request (and its body) alive past this call
        hashes = (
            last[1] if last is not None and last[0] is request else self.block_hashes(request, result.targets)
        )
        if not hashes:
            return
        targets = result.targets
        if targets:
            self._record(targets[0], hashes)
        prefill = result.profiles.get("prefill")
        if prefill is not None and prefill.targets and prefill.targets[0] not in targets[:1]:
            self._record(prefill.targets[0], hashes)

    def _record(self, ep: Endpoint, hashes: Sequence[int]) -> None:
        lru = self._lrus.get(ep)
        if lru is None:
            if self._datastore.get(ep.name) is not ep:
                return  # already removed: its entries would never be purged
            lru = self._lrus[ep] = OrderedDict()
        owners = self._owners
        # Reversed, so the first block ends most recent: vLLM frees a request's blocks tail first
        # for the same reason, a leading block is shared by more requests than a trailing one, and
        # losing it would void every block after it for the consecutive-prefix match.
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            held = owners.get(h)
            if held is None:
                owners[h] = ep
            elif isinstance(held, set):
                held.add(ep)
            else:
                owners[h] = {held, ep}
        capacity = self._capacity_of(ep)
        while len(lru) > capacity:
            self._disown(lru.popitem(last=False)[0], ep)

    def _capacity_of(self, ep: Endpoint) -> int:
        m = ep.metrics
        if self._auto_tune and m.num_gpu_blocks > 0:
            # vLLM blocks hold `block_size` tokens, ours ~`blockSizeTokens`: compare in tokens.
            tokens = m.num_gpu_blocks * (m.block_size or self._block_tokens)
            return max(1, tokens // self._block_tokens)
        return self._capacity

    def _disown(self, h: int, ep: Endpoint) -> None:
        held = self._owners[h]
        if not isinstance(held, set):
            del self._owners[h]
            return
        held.discard(ep)
        if len(held) == 1:
            self._owners[h] = held.pop()  # back to the single-owner shape `_match` expects most

    def _on_endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        for ep in removed:
            lru = self._lrus.pop(ep, None)
            if lru is not None:
                for h in lru:
                    self._disown(h, ep)

    # --- introspection (tests, future indexer-size metrics) -------------------------------------

    def held_blocks(self, endpoint: Endpoint) -> int:
        """Blocks currently recorded for `endpoint`."""
        lru = self._lrus.get(endpoint)
        return 0 if lru is None else len(lru)

    def indexed_blocks(self) -> int:
        """Distinct block hashes held by any endpoint."""
        return len(self._owners)


def _text_prefix(texts: list[str], limit: int) -> str:
    """The texts concatenated, stopping once `limit` characters are reached (a long chat history
    beyond the hashed prefix is not copied)."""
    if len(texts) == 1:
        return texts[0]
    pieces: list[str] = []
    n = 0
    for text in texts:
        pieces.append(text)
        n += len(text)
        if n >= limit:
            break
    return "".join(pieces)
