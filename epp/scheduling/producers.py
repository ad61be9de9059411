"""llm-d v0.9+'s prefix producers, and which of a configuration's `prefix-cache-scorer`s read one.

Two shapes of `prefix-cache-scorer` exist:

- GIE v1.x's (and llm-d <= v0.8's): the scorer holds its own approximate index and takes its
  parameters (`blockSizeTokens`, `lruCapacityPerServer`, ...): `PrefixCacheScorer`;
- llm-d v0.9+'s: the index is a producer's (`approx-prefix-cache-producer`,
  `precise-prefix-cache-producer`), and the scorer reads the producer it names
  (`prefixMatchInfoProducerName`) with `matchLengthWeight` and `matchLengthScaleTokens`:
  `PrefixMatchScorer`.

A scorer is llm-d v0.9+'s when it has one of those three parameters, or none at all in an
`llm-d.ai/v1alpha1` document or next to a plugin named `approx-prefix-cache-producer` (the name
llm-d's scorers read by default). GIE's parameters and llm-d's together are an error. A scorer
reading the default producer when the configuration has none gets one with llm-d's defaults, as
llm-d instantiates its default producer.

`no-hit-lru-scorer` reads a producer the same way (`prefixMatchInfoProducerName`, default
`approx-prefix-cache-producer`): `wire_no_hit_lru` gives it its source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import yaml

from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import precise_llmd
from epp.scheduling.plugins.burst_prefix_producer import BurstPrefixCacheProducer
from epp.scheduling.plugins.precise_prefix_cache_scorer import PrecisePrefixCacheScorer
from epp.scheduling.plugins.precise_prefix_producer import PrecisePrefixCacheProducer
from epp.scheduling.plugins.prefix_cache_scorer import PrefixCacheScorer
from epp.scheduling.plugins.prefix_match_scorer import PrefixMatchScorer, PrefixProducer

DEFAULT_PRODUCER = "approx-prefix-cache-producer"  # llm-d's default producer of PrefixCacheMatchInfo
LLMD_DOCUMENT = "llm-d.ai/v1alpha1"
LLMD_SCORER_KEYS = ("prefixMatchInfoProducerName", "matchLengthWeight", "matchLengthScaleTokens")
GIE_SCORER_KEYS = tuple(PrefixCacheScorer.Params.__struct_fields__)


class ScorerParams(msgspec.Struct, forbid_unknown_fields=True):
    prefixMatchInfoProducerName: str = ""
    matchLengthWeight: float = 0.0
    matchLengthScaleTokens: int = 8192


def is_producer(plugin: object) -> bool:
    """A prefix producer: matched by a scorer, never listed in a profile itself."""
    return bool(getattr(plugin, "is_producer", False)) and hasattr(plugin, "match_info")


def reads_producer(
    name: str, parameters: Mapping[str, Any] | None, *, api_version: str, plugin_names: set[str]
) -> bool:
    """Whether the `prefix-cache-scorer` named `name` is llm-d v0.9+'s (reads a producer). Raises
    ConfigError for GIE's and llm-d's parameters together."""
    given = set(parameters or {})
    llmd = given & set(LLMD_SCORER_KEYS)
    gie = given & set(GIE_SCORER_KEYS)
    if llmd and gie:
        raise registry.ConfigError(
            f"plugin {name!r} (type 'prefix-cache-scorer'): parameters {', '.join(sorted(gie))} are GIE "
            f"v1.x's scorer's and {', '.join(sorted(llmd))} llm-d v0.9+'s, which reads a producer: in "
            "llm-d v0.9+ the index parameters belong on approx-prefix-cache-producer"
        )
    if llmd:
        return True
    if gie:
        return False
    return api_version == LLMD_DOCUMENT or DEFAULT_PRODUCER in plugin_names


def build_scorer(
    name: str,
    parameters: Mapping[str, Any] | None,
    producer: Callable[[str], PrefixProducer],
) -> PrefixMatchScorer:
    """llm-d v0.9+'s `prefix-cache-scorer` named `name`; `producer(name)` finds (or creates, for
    the default name) the producer it reads, raising ConfigError when there is none."""
    label = f"plugin {name!r} (type 'prefix-cache-scorer')"
    try:
        params = msgspec.convert(parameters or {}, ScorerParams)
    except msgspec.ValidationError as err:
        raise registry.ConfigError(f"{label}: invalid parameters: {err}") from None
    if not 0.0 <= params.matchLengthWeight <= 1.0:
        raise registry.ConfigError(
            f"{label}: parameter matchLengthWeight must be between 0.0 and 1.0, "
            f"got {params.matchLengthWeight}"
        )
    if params.matchLengthWeight > 0.0 and params.matchLengthScaleTokens <= 0:
        raise registry.ConfigError(
            f"{label}: parameter matchLengthScaleTokens must be > 0 when matchLengthWeight is > 0, got "
            f"{params.matchLengthScaleTokens}"
        )
    source = producer(params.prefixMatchInfoProducerName or DEFAULT_PRODUCER)
    return PrefixMatchScorer(
        name,
        source,
        match_length_weight=params.matchLengthWeight,
        match_length_scale_tokens=params.matchLengthScaleTokens,
    )


def find_producer(
    wanted: str,
    plugins: Mapping[str, interfaces.Plugin],
    handle: interfaces.Handle,
    created: dict[str, interfaces.Plugin],
) -> PrefixProducer:
    """The prefix producer named `wanted` among `plugins`; the default producer, with llm-d's
    defaults, when the configuration has no plugin of that name (added to `created`)."""
    plugin = plugins.get(wanted) or created.get(wanted)
    if plugin is None and wanted == DEFAULT_PRODUCER:
        plugin = created[wanted] = registry.default.build(DEFAULT_PRODUCER, DEFAULT_PRODUCER, None, handle)
    if plugin is None:
        raise registry.ConfigError(f"names producer {wanted!r}, which the configuration does not define")
    if not is_producer(plugin):
        raise registry.ConfigError(
            f"names producer {wanted!r} (type {plugin.type!r}), which is not a prefix producer "
            "(approx-prefix-cache-producer, precise-prefix-cache-producer, burst-prefix-cache-producer)"
        )
    assert isinstance(plugin, PrefixCacheScorer | PrecisePrefixCacheScorer | BurstPrefixCacheProducer)
    return plugin


def requested_kv_events(text: str | None) -> precise_llmd.KVEventsSettings | None:
    """How the configuration's precise prefix plugin (llm-d's `precise-prefix-cache-producer`, or
    the `precise-prefix-cache-scorer` with llm-d's parameters) says KV events are consumed, read
    before the KV index exists (serve creates it, then loads the configuration). None when none
    says (or the text is not a valid configuration: loading it reports why)."""
    if text is None:
        return None
    try:
        data = yaml.safe_load(text)
        for spec in data.get("plugins") or []:
            raw = spec.get("parameters") or {}
            if spec.get("type") == "precise-prefix-cache-producer":
                producer = PrecisePrefixCacheProducer
                params = producer.scorer_params(msgspec.convert(raw, producer.Params))
            elif spec.get("type") == "precise-prefix-cache-scorer":
                params = msgspec.convert(raw, PrecisePrefixCacheScorer.Params)
            else:
                continue
            settings = precise_llmd.apply("", params).kv_events
            if settings is not None:
                return settings
    except (yaml.YAMLError, AttributeError, TypeError, msgspec.ValidationError, registry.ConfigError):
        return None
    return None
