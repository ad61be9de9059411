"""llm-d's parameters of `precise-prefix-cache-scorer`, mapped onto epp's.

llm-d configures its scorer with llm-d-kv-cache's structs: `tokenProcessorConfig`,
`indexerConfig`, `kvEventsConfig`, `speculativeIndexing` and `speculativeTTL`. epp's scorer does
the same job with its own parameters and flags, so each field is mapped, accepted as meaningless
here (with the reason in docs/configs.md), or refused with a `ConfigError` naming it:

- `tokenProcessorConfig.blockSize` / `.blockSizeTokens` -> `blockSize` (tokens per block; both
  given must agree). `.hashSeed` is accepted and has no effect: epp keys blocks by the token ids
  vLLM's events carry, not by vLLM's block hashes, so no PYTHONHASHSEED needs matching.
- `indexerConfig.kvCacheBackendConfigs` `[{name, weight}]` -> `gpuWeight` (`gpu`) and
  `offloadWeight` (`cpu`, and any other lower tier: epp has one offload weight, so they must agree).
- `indexerConfig.kvBlockIndexConfig.inMemoryConfig` and `enableMetrics` /
  `metricsLoggingInterval` are accepted: epp's index is in memory, bounded by
  `--kv-index-max-entries`, and always exports its metrics. `redisConfig`, `valkeyConfig` and
  `costAwareMemoryConfig` are refused: epp has no shared or cost-aware index.
- `indexerConfig.tokenizersPoolConfig` (deprecated in llm-d): its `modelName` is a model epp must
  have a tokenizer for (`Mapped.tokenizer_model`); the pool itself (workers, UDS socket) is not
  used, epp tokenizes in-process.
- `kvEventsConfig` -> `Mapped.kv_events`, how epp must consume KV events (serve applies it):
  `zmqEndpoint` is epp's bind mode at that address; otherwise `discoverPods` (llm-d's default)
  is connect mode on `podDiscoveryConfig.socketPort` (5557). `topicFilter` must be llm-d's `kv@`
  (epp reads the `kv@<ip>:<port>@<model>` topics vLLM publishes), `engineType` must be `vllm`;
  `concurrency`, `podLabelSelector` and `podNamespace` are accepted (epp subscribes to the pool's
  own endpoints, one reader per endpoint). Any llm-d key without `kvEventsConfig` means llm-d's
  defaults: connect mode on port 5557.
- `speculativeIndexing` / `speculativeTTL` (a Go duration) -> `speculativeTTLSeconds`
  (`speculativeIndexing: false` turns speculation off; absent, epp's default stays on).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

import msgspec

from epp.scheduling import registry
from epp.units import parse_duration

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class TokenProcessorConfig(msgspec.Struct, forbid_unknown_fields=True):
    blockSize: _NonNegative = 0  # llm-d: deprecated name of blockSizeTokens
    blockSizeTokens: _NonNegative = 0
    hashSeed: str = ""


class InMemoryConfig(msgspec.Struct, forbid_unknown_fields=True):
    size: _NonNegative = 0
    podCacheSize: _NonNegative = 0


class KVBlockIndexConfig(msgspec.Struct, forbid_unknown_fields=True):
    inMemoryConfig: InMemoryConfig | None = None
    redisConfig: dict[str, Any] | None = None
    valkeyConfig: dict[str, Any] | None = None
    costAwareMemoryConfig: dict[str, Any] | None = None
    enableMetrics: bool = False
    metricsLoggingInterval: _NonNegative | str = 0  # Go's time.Duration: nanoseconds


class BackendConfig(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    weight: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class UdsConfig(msgspec.Struct, forbid_unknown_fields=True):
    socketFile: str = ""
    useTCP: bool = False
    modelTokenizerMap: dict[str, str] | None = None


class TokenizersPoolConfig(msgspec.Struct, forbid_unknown_fields=True):
    modelName: str = ""
    workersCount: _NonNegative = 0
    uds: UdsConfig | None = None
    local: dict[str, Any] | None = None
    hf: dict[str, Any] | None = None


class IndexerConfig(msgspec.Struct, forbid_unknown_fields=True):
    kvBlockIndexConfig: KVBlockIndexConfig | None = None
    kvCacheBackendConfigs: list[BackendConfig] | None = None
    tokenizersPoolConfig: TokenizersPoolConfig | None = None


class PodDiscoveryConfig(msgspec.Struct, forbid_unknown_fields=True):
    podLabelSelector: str = ""
    podNamespace: str = ""
    socketPort: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 5557


class KVEventsConfig(msgspec.Struct, forbid_unknown_fields=True):
    zmqEndpoint: str = ""
    topicFilter: str = "kv@"
    concurrency: _NonNegative = 0
    engineType: str = "vllm"
    discoverPods: bool | None = None  # None: llm-d's default (true) unless zmqEndpoint is given
    podDiscoveryConfig: PodDiscoveryConfig | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class KVEventsSettings:
    """How epp must consume KV events for this configuration (serve's `--kv-events` family)."""

    mode: Literal["connect", "bind"]
    bind: str = ""  # bind mode: the address to listen on (`--kv-events-bind`)
    port: int = 5557  # connect mode: each endpoint's publisher port (`--kv-events-port`)


@dataclasses.dataclass(frozen=True, slots=True)
class Mapped:
    kv_events: KVEventsSettings | None = None  # None: the configuration leaves it to the flags
    tokenizer_model: str = ""  # a model llm-d's tokenizer pool was configured for
    notes: tuple[str, ...] = ()  # accepted settings that change nothing, for the log


_LLMD_KEYS = (
    "tokenProcessorConfig",
    "indexerConfig",
    "kvEventsConfig",
    "speculativeIndexing",
    "speculativeTTL",
)


def apply(label: str, params: Any) -> Mapped:
    """Map llm-d's fields of `params` (the scorer's Params) onto epp's, in place."""
    if not any(getattr(params, key) is not None for key in _LLMD_KEYS):
        return Mapped()
    notes: list[str] = []
    _block_size(label, params)
    tokenizer_model = _indexer(label, params, notes)
    if params.speculativeTTL is not None:
        try:
            ttl = parse_duration(params.speculativeTTL)
        except ValueError as err:
            raise registry.ConfigError(f"{label}: parameter speculativeTTL: {err}") from None
        if not 0 < ttl <= 60:
            raise registry.ConfigError(f"{label}: parameter speculativeTTL must be in (0s, 60s]")
        params.speculativeTTLSeconds = ttl
    if params.speculativeIndexing is False:
        params.speculativeTTLSeconds = 0.0
    return Mapped(_kv_events(label, params.kvEventsConfig), tokenizer_model, tuple(notes))


def _block_size(label: str, params: Any) -> None:
    tp: TokenProcessorConfig | None = params.tokenProcessorConfig
    if tp is None:
        return
    sizes = {s for s in (tp.blockSize, tp.blockSizeTokens) if s}
    if params.blockSize:
        sizes.add(params.blockSize)
    if len(sizes) > 1:
        raise registry.ConfigError(
            f"{label}: block sizes disagree ({', '.join(map(str, sorted(sizes)))}): blockSize and "
            "tokenProcessorConfig.blockSize/blockSizeTokens must name one size"
        )
    if sizes:
        params.blockSize = sizes.pop()


def _indexer(label: str, params: Any, notes: list[str]) -> str:
    ic: IndexerConfig | None = params.indexerConfig
    if ic is None:
        return ""
    index = ic.kvBlockIndexConfig
    if index is not None:
        for key in ("redisConfig", "valkeyConfig", "costAwareMemoryConfig"):
            if getattr(index, key) is not None:
                raise registry.ConfigError(
                    f"{label}: parameter indexerConfig.kvBlockIndexConfig.{key}: epp's KV index is in "
                    "process memory only (each replica consumes the events itself); no shared or "
                    "cost-aware index"
                )
        if index.inMemoryConfig is not None:
            notes.append(
                f"{label}: indexerConfig.kvBlockIndexConfig.inMemoryConfig is not used: epp's index "
                "is bounded by --kv-index-max-entries"
            )
    if ic.kvCacheBackendConfigs is not None:
        _backends(label, params, ic.kvCacheBackendConfigs)
    pool = ic.tokenizersPoolConfig
    if pool is None:
        return ""
    notes.append(f"{label}: indexerConfig.tokenizersPoolConfig is not used: epp tokenizes in-process")
    return pool.modelName.strip()


def _backends(label: str, params: Any, backends: list[BackendConfig]) -> None:
    where = f"{label}: parameter indexerConfig.kvCacheBackendConfigs"
    gpu = [b.weight for b in backends if b.name == "gpu"]
    lower = {b.weight for b in backends if b.name != "gpu"}
    if len(gpu) > 1:
        raise registry.ConfigError(f"{where}: tier 'gpu' is listed twice")
    if len(lower) > 1:
        raise registry.ConfigError(
            f"{where}: epp weighs every tier below GPU alike (offloadWeight); the weights "
            f"{sorted(lower)} of {', '.join(b.name for b in backends if b.name != 'gpu')} differ"
        )
    if gpu:
        params.gpuWeight = gpu[0]
    if lower:
        params.offloadWeight = lower.pop()


def _kv_events(label: str, ev: KVEventsConfig | None) -> KVEventsSettings:
    if ev is None:
        return KVEventsSettings("connect")  # llm-d's defaults: discover pods, port 5557
    where = f"{label}: parameter kvEventsConfig"
    if ev.engineType != "vllm":
        raise registry.ConfigError(f"{where}.engineType {ev.engineType!r}: epp reads vLLM's KV events only")
    if ev.topicFilter not in ("kv@", ""):
        raise registry.ConfigError(
            f"{where}.topicFilter {ev.topicFilter!r}: epp reads vLLM's topics kv@<ip>:<port>@<model>; "
            "only llm-d's 'kv@' is supported"
        )
    port = ev.podDiscoveryConfig.socketPort if ev.podDiscoveryConfig is not None else 5557
    if ev.zmqEndpoint:
        if ev.discoverPods:
            raise registry.ConfigError(
                f"{where}: zmqEndpoint (epp binds, vLLM connects) and discoverPods: true (epp connects "
                "to each pod) together: epp consumes KV events one way; set discoverPods: false or "
                "drop zmqEndpoint"
            )
        if not ev.zmqEndpoint.startswith("tcp://"):
            raise registry.ConfigError(f"{where}.zmqEndpoint {ev.zmqEndpoint!r}: expected tcp://host:port")
        return KVEventsSettings("bind", bind=ev.zmqEndpoint)
    if ev.discoverPods is False:
        raise registry.ConfigError(
            f"{where}: discoverPods: false without zmqEndpoint leaves no source of KV events"
        )
    return KVEventsSettings("connect", port=port)
