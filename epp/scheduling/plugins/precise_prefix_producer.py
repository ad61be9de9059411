"""`precise-prefix-cache-producer`: llm-d v0.9+'s precise prefix producer (vLLM's KV-cache events),
which a `prefix-cache-scorer` reads (`epp.scheduling.plugins.prefix_match_scorer`).

It is epp's `precise-prefix-cache-scorer` (`precise_prefix_cache_scorer.PrecisePrefixCacheScorer`)
given llm-d's parameters only, with llm-d's defaults (`precise_llmd` maps each field):

- `tokenProcessorConfig`, `indexerConfig`, `kvEventsConfig`, `speculativeIndexing`,
  `speculativeTTL`; epp's own parameters (`gpuWeight`, `homeScore`, ...) are not among them, as
  llm-d's strict decoder would refuse them;
- KV events: llm-d's defaults when `kvEventsConfig` is absent, even with no parameters at all
  (each pod's publisher, port 5557);
- speculative indexing: off unless `speculativeIndexing: true` (llm-d's default; epp's own scorer
  defaults it on);
- `indexerConfig.tokenizersPoolConfig` is refused, as llm-d v0.10 refuses it (configure a
  `token-producer` instead).
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import precise_llmd
from epp.scheduling.plugins.precise_prefix_cache_scorer import PrecisePrefixCacheScorer


@registry.register("precise-prefix-cache-producer")
class PrecisePrefixCacheProducer(PrecisePrefixCacheScorer):
    # A data producer: a prefix-cache-scorer reads it; a profile may not list it.
    is_producer: ClassVar[bool] = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        tokenProcessorConfig: precise_llmd.TokenProcessorConfig | None = None
        indexerConfig: precise_llmd.IndexerConfig | None = None
        kvEventsConfig: precise_llmd.KVEventsConfig | None = None
        speculativeIndexing: bool = False
        speculativeTTL: str | None = None

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        if params.indexerConfig is not None and params.indexerConfig.tokenizersPoolConfig is not None:
            raise registry.ConfigError(
                f"plugin {name!r} (type {self.type!r}): parameter indexerConfig.tokenizersPoolConfig is "
                "not supported (llm-d refuses it too): configure a token-producer plugin instead"
            )
        super().__init__(name, self.scorer_params(params), handle)

    @staticmethod
    def scorer_params(params: Params) -> PrecisePrefixCacheScorer.Params:
        """The producer's parameters as epp's precise scorer's, with llm-d's defaults."""
        scorer = PrecisePrefixCacheScorer.Params(
            tokenProcessorConfig=params.tokenProcessorConfig,
            indexerConfig=params.indexerConfig,
            # llm-d's defaults apply whatever is given: per-pod publishers on port 5557.
            kvEventsConfig=params.kvEventsConfig or precise_llmd.KVEventsConfig(),
            speculativeIndexing=params.speculativeIndexing,
            speculativeTTL=params.speculativeTTL,
        )
        if not params.speculativeIndexing:
            scorer.speculativeTTLSeconds = 0.0
        elif params.speculativeTTL is None:
            scorer.speculativeTTL = "2s"  # llm-d's defaultSpeculativeTTL
        return scorer
