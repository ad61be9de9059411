"""`approx-prefix-cache-producer`: llm-d v0.9+'s approximate prefix producer, which a
`prefix-cache-scorer` reads (`epp.scheduling.plugins.prefix_match_scorer`).

It is epp's approximate prefix index (`prefix_cache_scorer.PrefixCacheScorer`: it learns from
epp's own decisions which endpoint holds which prompt blocks) run with llm-d v0.10's parameters
and defaults, which differ from GIE v1.5's scorer in these ways (llm-d's `approximateprefix`
package):

- block size: `blockSizeTokens` (16), or with `autoTune` (on) the block size the first candidate
  endpoint reports (`vllm:cache_config_info`), but never below 64 tokens (llm-d #1158: one index
  entry per block and endpoint, so small blocks cost memory); llm-d logs a warning when the
  configured size is below 64, and so does epp;
- match cap: `maxPrefixTokensToMatch` (131072) tokens' worth of whole blocks when > 0, else
  `maxPrefixBlocksToMatch` (2048) blocks, and both 0 means the whole prompt;
- blocks: token ids cut every block size, a trailing partial block included, so a prompt shorter
  than one block is one block (GIE's scorer skips such prompts); the chain is seeded with the
  target model and the request's `cache_salt`. Without token ids (no tokenizer for the model)
  the prompt text is cut every 4x block size characters, as epp's scorer does;
- capacity per endpoint: with `autoTune`, the number of GPU blocks the endpoint reports (not
  converted to this producer's block size: llm-d counts entries, one per block); else
  `lruCapacityPerServer` (31250; a value <= 0 means the default, as in llm-d);
- `blockSize` (deprecated): taken as `blockSizeTokens` when that is left at its default.

Negative sizes and caps are refused (llm-d accepts them and then hashes nothing).

Differences that remain: llm-d hashes each prompt of a batched completions request apart and
sums the matches; epp hashes the first prompt's token ids (or all prompts' text). Hashes are
Python's, per process (llm-d's are xxhash): a replica's index is its own in both.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins.prefix_cache_scorer import CHARS_PER_TOKEN, PrefixCacheScorer, _text_prefix

log = logging.getLogger(__name__)

MIN_BLOCK_TOKENS = 64  # llm-d's minBlockSizeTokens
DEFAULT_BLOCK_TOKENS = 16
DEFAULT_MAX_BLOCKS = 2048
DEFAULT_MAX_TOKENS = 131072
DEFAULT_CAPACITY = 31250
UNLIMITED = 1 << 62


@registry.register("approx-prefix-cache-producer")
class ApproxPrefixCacheProducer(PrefixCacheScorer):
    # A data producer: a prefix-cache-scorer reads it; a profile may not list it.
    is_producer: ClassVar[bool] = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        autoTune: bool = True
        blockSizeTokens: int = DEFAULT_BLOCK_TOKENS
        blockSize: int = 0  # deprecated: characters in GIE, taken as tokens by llm-d's producer
        maxPrefixBlocksToMatch: int = DEFAULT_MAX_BLOCKS
        maxPrefixTokensToMatch: int = DEFAULT_MAX_TOKENS
        lruCapacityPerServer: int = DEFAULT_CAPACITY

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        label = f"plugin {name!r} (type {self.type!r})"
        self.config_notes: list[str] = []
        for field in ("blockSizeTokens", "blockSize", "maxPrefixBlocksToMatch", "maxPrefixTokensToMatch"):
            if getattr(params, field) < 0:
                raise registry.ConfigError(
                    f"{label}: parameter {field} must be >= 0, got {getattr(params, field)}"
                )
        block = params.blockSizeTokens
        if params.blockSize > 0:
            self.config_notes.append(f"{label}: blockSize is deprecated; use blockSizeTokens")
            if block == DEFAULT_BLOCK_TOKENS:
                block = params.blockSize
        if not params.autoTune and block <= 0:
            raise registry.ConfigError(
                f"{label}: parameter blockSizeTokens must be > 0 when autoTune is false, got {block}"
            )
        if 0 < block < MIN_BLOCK_TOKENS:
            self.config_notes.append(
                f"{label}: blockSizeTokens {block} is below llm-d's minimum {MIN_BLOCK_TOKENS}, which is "
                "used instead (as llm-d does)"
            )
        self._configured_block = block
        self._max_tokens = params.maxPrefixTokensToMatch
        self._max_blocks_param = params.maxPrefixBlocksToMatch
        self._capacity = params.lruCapacityPerServer if params.lruCapacityPerServer > 0 else DEFAULT_CAPACITY
        self._auto_tune = params.autoTune
        self._block_tokens = max(block, MIN_BLOCK_TOKENS)
        self._block_chars = self._block_tokens * CHARS_PER_TOKEN
        self._max_blocks = self._resolve_max_blocks(self._block_tokens)
        self._start_index(handle)

    def _resolve_max_blocks(self, block: int) -> int:
        if self._max_tokens > 0:
            return self._max_tokens // block
        return self._max_blocks_param or UNLIMITED

    def effective_block_tokens(self, endpoints: Sequence[Endpoint]) -> int:
        """llm-d's GetBlockSize: the first candidate's reported block size with autoTune, else the
        configured one, never below 64."""
        block = self._configured_block
        if self._auto_tune and endpoints:
            reported = endpoints[0].metrics.block_size
            if reported > 0:
                block = reported
        return max(block, MIN_BLOCK_TOKENS)

    def block_hashes(self, request: InferenceRequest, endpoints: Sequence[Endpoint] = ()) -> list[int]:
        block = self.effective_block_tokens(endpoints)
        if block != self._block_tokens:
            self._block_tokens = block
            self._block_chars = block * CHARS_PER_TOKEN
            self._max_blocks = self._resolve_max_blocks(block)
        h = hash((request.target_model, request.cache_salt or ""))
        out: list[int] = []
        limit = self._max_blocks
        ids = request.token_ids
        if ids:
            for i in range(0, len(ids), block):
                if len(out) >= limit:
                    break
                h = hash((h, tuple(ids[i : i + block])))
                out.append(h)
            return out
        if not request.prompt_texts:
            return out
        size = self._block_chars
        prompt = _text_prefix(request.prompt_texts, size * min(limit, UNLIMITED // size))
        for i in range(0, len(prompt), size):
            if len(out) >= limit:
                break
            h = hash((h, prompt[i : i + size]))
            out.append(h)
        return out

    def _capacity_of(self, ep: Endpoint) -> int:
        if self._auto_tune and ep.metrics.num_gpu_blocks > 0:
            return ep.metrics.num_gpu_blocks
        return self._capacity
