"""llm-d's data layer in an EndpointPickerConfig: its plugin types and the `dataLayer` section,
decoded strictly and turned into what epp runs (`DataLayerSettings`, which serve applies).

```yaml
plugins:
- {type: metrics-data-source, parameters: {scheme: https, caCertPath: /etc/ca.pem}}
- {type: core-metrics-extractor, parameters: {defaultEngine: sglang}}
- {type: dcgm-data-source, name: dcgm, parameters: {port: 9400, interval: 1s}}
- {type: dcgm-extractor}
- {type: file-discovery, parameters: {path: /etc/epp/endpoints.yaml, watchFile: true}}
dataLayer:
  injectDefaults: true           # llm-d: add the default metrics source unless one is listed
  sources:
  - {pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}
  - {pluginRef: dcgm, extractors: [{pluginRef: dcgm-extractor}]}
  discovery: {pluginRef: file-discovery}
```

What each becomes:
- `metrics-data-source` + `core-metrics-extractor`: epp's metrics scrape (`MetricsScrape`, one
  per pool; two are refused), its scheme, path, port, TLS files and interval, and the engines'
  metric names (`epp.datastore.engines`). As in llm-d, without one listed (and unless
  `injectDefaults: false`) the plugins named `metrics-data-source` / `core-metrics-extractor`,
  else their defaults, are used. `injectDefaults: false` with no metrics source, or a metrics
  source without its extractor, is refused: llm-d would then read no metrics, and epp's routing
  and endpoint health rest on them.
- `models-data-source` + `models-data-extractor`: epp reads each server's `/v1/models` itself
  (for the context length); the path, scheme and interval are taken, TLS must be the scrape's.
- `dcgm-data-source` + `dcgm-extractor`: a DCGM exporter poll per endpoint (`DcgmSource`).
- `topology-extractor`: which pod labels give hostname, rack, zone and region
  (`TopologyLabels`), read by `topology-affinity-filter` / `-scorer`.
- `endpoint-notification-source`, `k8s-notification-source` (with `group`, `version`, `kind`):
  accepted, as epp's plugins follow the pool through the datastore; their extractors may be the
  producers that follow endpoints (`precise-prefix-cache-producer`, ...) or the topology
  extractor.
- `file-discovery` (`dataLayer.discovery`): the endpoints come from llm-d's endpoints file
  (`epp.datastore.file_discovery`), not from Kubernetes.
- `peerDiscovery`, `crossReplicaSyncerPluginRef`, `crossReplicaSyncInterval`: refused (no state
  is shared between epp replicas), as are the `multicluster-*` types elsewhere.

A source defined but not listed is not polled, in llm-d as here (a warning says so).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from epp.datastore import engines as engine_names
from epp.datastore.dcgm import DcgmSource
from epp.datastore.file_discovery import FileDiscoverySource
from epp.datastore.httpget import TLSFiles
from epp.scheduling import config_yaml, interfaces
from epp.scheduling.registry import ConfigError
from epp.units import parse_duration

Path = config_yaml.Path

# ---- parameters ------------------------------------------------------------------------------------


class _HttpSourceParams(msgspec.Struct, forbid_unknown_fields=True):
    scheme: Literal["http", "https"] = "http"
    path: str = ""
    port: int | None = None  # metrics-data-source only
    insecureSkipVerify: bool = True
    caCertPath: str = ""
    clientCertPath: str = ""
    clientKeyPath: str = ""
    interval: str = ""


class _ModelsParams(msgspec.Struct, forbid_unknown_fields=True):
    scheme: Literal["http", "https"] = "http"
    path: str = ""
    insecureSkipVerify: bool = True
    caCertPath: str = ""
    clientCertPath: str = ""
    clientKeyPath: str = ""
    interval: str = ""


class _CustomMetric(msgspec.Struct, forbid_unknown_fields=True):
    attributeKey: str = ""
    metricSpec: str = ""


class _EngineConfig(msgspec.Struct, forbid_unknown_fields=True):
    name: str = ""
    queuedRequestsSpec: str = ""
    runningRequestsSpec: str = ""
    kvUsageSpec: str = ""
    loraSpec: str = ""
    cacheInfoSpec: str = ""
    cacheBlockSizeLabelName: str = ""
    cacheNumBlocksLabelName: str = ""
    cacheBlockSizeSpec: str = ""
    cacheNumBlocksSpec: str = ""
    customMetrics: list[_CustomMetric] = []


class _ExtractorParams(msgspec.Struct, forbid_unknown_fields=True):
    engineLabelKey: str = ""
    defaultEngine: str = ""
    engineConfigs: list[_EngineConfig] = []


class _DcgmParams(msgspec.Struct, forbid_unknown_fields=True):
    scheme: Literal["http", "https"] = "http"
    path: str = "/metrics"
    port: int = 9400
    insecureSkipVerify: bool = True
    useNodeAddress: bool = False
    interval: str = ""


class _TopologyParams(msgspec.Struct, forbid_unknown_fields=True):
    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""


class _K8sParams(msgspec.Struct, forbid_unknown_fields=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class _FileDiscoveryParams(msgspec.Struct, forbid_unknown_fields=True):
    path: str = ""
    watchFile: bool = False


class _NoParams(msgspec.Struct, forbid_unknown_fields=True):
    pass


# type -> (kind, parameters). Sources poll or notify; extractors hang under a source.
TYPES: dict[str, tuple[str, type[msgspec.Struct]]] = {
    "metrics-data-source": ("metrics source", _HttpSourceParams),
    "core-metrics-extractor": ("metrics extractor", _ExtractorParams),
    "models-data-source": ("models source", _ModelsParams),
    "models-data-extractor": ("models extractor", _NoParams),
    "dcgm-data-source": ("DCGM source", _DcgmParams),
    "dcgm-extractor": ("DCGM extractor", _NoParams),
    "endpoint-notification-source": ("endpoint source", _NoParams),
    "k8s-notification-source": ("notification source", _K8sParams),
    "topology-extractor": ("topology extractor", _TopologyParams),
    "file-discovery": ("discovery", _FileDiscoveryParams),
}
# What a source's extractors may be, by the source's kind ("producer": a built plugin that follows
# endpoint changes in llm-d, a prefix or multimodal producer).
EXTRACTORS: dict[str, tuple[str, ...]] = {
    "metrics source": ("metrics extractor",),
    "models source": ("models extractor",),
    "DCGM source": ("DCGM extractor",),
    "endpoint source": ("topology extractor", "producer"),
    "notification source": ("topology extractor",),
}


# ---- what epp runs ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class MetricsScrape:
    """The metrics source epp scrapes each endpoint with: None fields were not given (the
    `--model-server-metrics-*` flags, or their defaults, apply); `engines` None: vLLM's names."""

    name: str = "metrics-data-source"
    scheme: str | None = None
    path: str | None = None
    port: int | None = None
    insecure_skip_verify: bool | None = None
    tls: TLSFiles | None = None
    interval: float | None = None
    engines: engine_names.Engines | None = None
    models_path: str | None = None
    models_interval: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TopologyLabels:
    """A topology-extractor's pod labels for each locality level."""

    hostname: str = "kubernetes.io/hostname"
    rack: str = "topology.kubernetes.io/rack"
    zone: str = "topology.kubernetes.io/zone"
    region: str = "topology.kubernetes.io/region"


@dataclasses.dataclass(frozen=True, slots=True)
class DataLayerSettings:
    metrics: MetricsScrape = MetricsScrape()
    dcgm: tuple[DcgmSource, ...] = ()
    discovery: FileDiscoverySource | None = None
    topology: Mapping[str, TopologyLabels] = dataclasses.field(default_factory=dict)


class _Ref(msgspec.Struct, forbid_unknown_fields=True):
    pluginRef: str = ""


class _Source(msgspec.Struct, forbid_unknown_fields=True):
    pluginRef: str = ""
    extractors: list[_Ref] = []


class Section(msgspec.Struct, forbid_unknown_fields=True):
    """The `dataLayer` section, as llm-d v0.10 defines it."""

    injectDefaults: bool | None = None
    sources: list[_Source] = []
    discovery: _Ref | None = None
    peerDiscovery: _Ref | None = None
    crossReplicaSyncerPluginRef: str = ""
    crossReplicaSyncInterval: str = ""


# ---- collecting the plugins and building ------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Plugin:
    path: Path
    type: str
    kind: str
    params: Any


ErrorAt = Callable[[Path, str], ConfigError]


class Collector:
    """The data-layer plugins of one configuration, gathered as `epp.scheduling.config` reads them."""

    def __init__(self, error_at: ErrorAt, validation_error_at: Callable[..., ConfigError]) -> None:
        self._error_at = error_at
        self._validation_error_at = validation_error_at
        self.plugins: dict[str, _Plugin] = {}
        self.warnings: list[str] = []

    def __contains__(self, name: object) -> bool:
        return name in self.plugins

    def kind(self, name: str) -> str | None:
        found = self.plugins.get(name)
        return found.kind if found is not None else None

    def add(self, path: Path, name: str, type_name: str, parameters: dict[str, Any] | None) -> None:
        kind, schema = TYPES[type_name]
        try:
            params = msgspec.convert(parameters or {}, schema)
        except msgspec.ValidationError as err:
            raise self._validation_error_at(
                err, prefix=(*path, "parameters"), known=schema.__struct_fields__
            ) from None
        self.plugins[name] = _Plugin(path, type_name, kind, params)
        self._check(path, name, type_name, params)

    def _check(self, path: Path, name: str, type_name: str, params: Any) -> None:
        label = f"plugin {name!r} (type {type_name!r})"
        at = (*path, "parameters")
        if isinstance(params, _HttpSourceParams | _ModelsParams | _DcgmParams) and params.interval:
            _interval(params.interval, (*at, "interval"), label, self._error_at)
        if (
            isinstance(params, _HttpSourceParams)
            and params.port is not None
            and not 1 <= params.port <= 65535
        ):
            raise self._error_at((*at, "port"), f"{label}: invalid port {params.port}: must be 1-65535")
        if isinstance(params, _DcgmParams) and not 1 <= params.port <= 65535:
            raise self._error_at((*at, "port"), f"{label}: invalid port {params.port}: must be 1-65535")
        if isinstance(params, _K8sParams) and not (params.version and params.kind):
            raise self._error_at(at, f"{label}: version and kind are required (as in llm-d)")
        if isinstance(params, _FileDiscoveryParams) and not params.path:
            raise self._error_at(at, f"{label}: parameter path is required")
        if isinstance(params, _ExtractorParams):
            engines(params, lambda where, message: self._error_at((*at, *where), f"{label}: {message}"))

    def build(
        self,
        section: Section | None,
        plugins: Mapping[str, interfaces.Plugin],
        is_producer: Callable[[interfaces.Plugin], bool],
    ) -> DataLayerSettings:
        """The settings; checks every reference of `section` (errors carry their lines)."""
        listed: set[str] = set()
        metrics: list[tuple[Path, str, str | None]] = []  # (where, source, extractor)
        models: tuple[str, str | None] | None = None
        dcgm: list[str] = []
        section = section or Section()
        for key in ("peerDiscovery", "crossReplicaSyncerPluginRef", "crossReplicaSyncInterval"):
            if getattr(section, key):
                raise self._error_at(
                    ("dataLayer", key),
                    "epp replicas share no state (each consumes the pool's metrics and KV events "
                    "itself): no peer discovery or cross-replica sync",
                )
        for i, source in enumerate(section.sources):
            where: Path = ("dataLayer", "sources", i)
            kind = self._ref((*where, "pluginRef"), source.pluginRef, tuple(EXTRACTORS), plugins, is_producer)
            listed.add(source.pluginRef)
            extractors: list[str] = []
            for j, ref in enumerate(source.extractors):
                self._ref(
                    (*where, "extractors", j, "pluginRef"),
                    ref.pluginRef,
                    EXTRACTORS[kind],
                    plugins,
                    is_producer,
                )
                listed.add(ref.pluginRef)
                extractors.append(ref.pluginRef)
            first = extractors[0] if extractors else None
            if kind == "metrics source":
                metrics.append((where, source.pluginRef, first))
            elif kind == "models source":
                models = (source.pluginRef, first)
            elif kind == "DCGM source":
                if first is None:
                    self.warnings.append(
                        f"data source {source.pluginRef!r} has no dcgm-extractor: its polls produce nothing "
                        "(as in llm-d), so it is not polled"
                    )
                else:
                    dcgm.append(source.pluginRef)
        if not metrics:
            if section.injectDefaults is False:
                raise self._error_at(
                    ("dataLayer", "injectDefaults"),
                    "no metrics-data-source is listed and injectDefaults is false: llm-d would read no "
                    "model-server metrics; epp's routing and endpoint health rest on them (list a "
                    "metrics-data-source with its core-metrics-extractor, or drop injectDefaults: false)",
                )
            # llm-d injects its default source and extractor, or the plugins of those names.
            listed.update(("metrics-data-source", "core-metrics-extractor"))
            metrics.append(((), "metrics-data-source", "core-metrics-extractor"))
        if len(metrics) > 1:
            raise self._error_at(
                metrics[1][0], "a second metrics source: epp scrapes each endpoint's metrics with one"
            )
        at, source_name, extractor = metrics[0]
        if extractor is None:
            raise self._error_at(
                at,
                f"metrics source {source_name!r} has no core-metrics-extractor: llm-d would read no metrics",
            )
        scrape = self._scrape(source_name, extractor, models)
        discovery = None
        if section.discovery is not None:
            path: Path = ("dataLayer", "discovery", "pluginRef")
            self._ref(path, section.discovery.pluginRef, ("discovery",), plugins, is_producer)
            listed.add(section.discovery.pluginRef)
            found = self.plugins[section.discovery.pluginRef].params
            discovery = FileDiscoverySource(found.path, found.watchFile, section.discovery.pluginRef)
        topology: dict[str, TopologyLabels] = {}
        for name, plugin in self.plugins.items():
            if plugin.kind == "topology extractor":
                p = plugin.params
                d = TopologyLabels()
                topology[name] = TopologyLabels(
                    p.hostname or d.hostname, p.rack or d.rack, p.zone or d.zone, p.region or d.region
                )
                listed.add(name)  # llm-d wires it to the endpoint and pod notifications itself
            elif name not in listed:
                self.warnings.append(
                    f"plugin {name!r} (type {plugin.type!r}) is not in dataLayer: not used (as in llm-d)"
                )
        return DataLayerSettings(
            metrics=scrape,
            dcgm=tuple(self._dcgm(name) for name in dcgm),
            discovery=discovery,
            topology=topology,
        )

    def _ref(
        self,
        path: Path,
        ref: str,
        kinds: Sequence[str],
        plugins: Mapping[str, interfaces.Plugin],
        is_producer: Callable[[interfaces.Plugin], bool],
    ) -> str:
        wanted = " or ".join(f"a {k}" for k in kinds)
        found = self.plugins.get(ref)
        if found is not None:
            if found.kind not in kinds:
                raise self._error_at(path, f"plugin {ref!r} (type {found.type!r}) is not {wanted}")
            return found.kind
        plugin = plugins.get(ref)
        if plugin is None:
            raise self._error_at(path, f"pluginRef {ref!r} is not a defined plugin")
        if "producer" in kinds and is_producer(plugin):
            return "producer"
        raise self._error_at(path, f"plugin {ref!r} (type {plugin.type!r}) is not {wanted}")

    def _scrape(self, source: str, extractor: str, models: tuple[str, str | None] | None) -> MetricsScrape:
        found = self.plugins.get(source)
        p = found.params if found is not None else _HttpSourceParams()
        given = found is not None and found.params != _HttpSourceParams()
        tls = TLSFiles(p.caCertPath, p.clientCertPath, p.clientKeyPath)
        ex = self.plugins.get(extractor)
        mapping = None
        if ex is not None:
            mapping = engines(ex.params, lambda where, message: ConfigError(message))
        models_path = models_interval = None
        if models is not None:
            m = self.plugins[models[0]]
            mp = m.params
            if mp.scheme != p.scheme or TLSFiles(mp.caCertPath, mp.clientCertPath, mp.clientKeyPath) != tls:
                raise self._error_at(
                    (*m.path, "parameters"),
                    f"plugin {models[0]!r} (type {m.type!r}): epp reads /v1/models with the metrics source's "
                    "scheme and TLS files; give the same ones",
                )
            models_path = mp.path or "/v1/models"
            models_interval = parse_duration(mp.interval) if mp.interval else None
        return MetricsScrape(
            name=source or "metrics-data-source",
            scheme=p.scheme if given else None,
            path=(p.path or "/metrics") if given else None,
            port=p.port,
            insecure_skip_verify=p.insecureSkipVerify if given else None,
            tls=tls if tls != TLSFiles() else None,
            interval=parse_duration(p.interval) if p.interval else None,
            engines=mapping,
            models_path=models_path,
            models_interval=models_interval,
        )

    def _dcgm(self, name: str) -> DcgmSource:
        p = self.plugins[name].params
        return DcgmSource(
            name=name,
            scheme=p.scheme,
            path=p.path or "/metrics",
            port=p.port,
            insecure_skip_verify=p.insecureSkipVerify,
            use_node_address=p.useNodeAddress,
            interval=parse_duration(p.interval) if p.interval else 0.0,
        )


def _interval(text: str, path: Path, label: str, error_at: ErrorAt) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as err:
        raise error_at(path, f"{label}: invalid interval: {err}") from None
    if seconds < 0:
        raise error_at(path, f"{label}: interval must be non-negative")
    return seconds


def engines(params: _ExtractorParams, error: Callable[[Path, str], Exception]) -> engine_names.Engines:
    """core-metrics-extractor's engines, as llm-d builds them: the configured engines, then every
    built-in one not configured; `defaultEngine` (vllm) for unlabelled endpoints."""
    by_name: dict[str, engine_names.EngineMapping] = {}
    for i, config in enumerate(params.engineConfigs):
        where: Path = ("engineConfigs", i)
        if not config.name:
            raise error((*where, "name"), "engine config name cannot be empty")
        if config.name == "default":
            raise error((*where, "name"), 'engine config name cannot be "default" (reserved)')
        if config.name in by_name:
            raise error((*where, "name"), f"mapping for engine type {config.name!r} already exists")
        by_name[config.name] = _mapping(config, functools.partial(_at, error, where))
    for name, mapping in engine_names.BUILTIN.items():
        by_name.setdefault(name, mapping)
    default = params.defaultEngine or engine_names.DEFAULT_ENGINE
    if default not in by_name:
        raise error(("defaultEngine",), f"defaultEngine {default!r} not found in engineConfigs")
    return engine_names.Engines(by_name[default], by_name, params.engineLabelKey or engine_names.ENGINE_LABEL)


def _at(error: Callable[[Path, str], Exception], where: Path, key: str, message: str) -> Exception:
    return error((*where, key), message)


def _mapping(config: _EngineConfig, error: Callable[[str, str], Exception]) -> engine_names.EngineMapping:
    def spec(key: str) -> engine_names.MetricSpec | None:
        try:
            return engine_names.parse_spec(getattr(config, key))
        except engine_names.MetricSpecError as err:
            raise error(key, str(err)) from None

    custom: list[tuple[str, engine_names.MetricSpec]] = []
    for i, metric in enumerate(config.customMetrics):
        where = f"customMetrics[{i}]"
        if not metric.attributeKey:
            raise error(where, "custom metric attributeKey cannot be empty")
        if any(metric.attributeKey == key for key, _ in custom):
            raise error(where, f"custom metric attributeKey {metric.attributeKey!r} is duplicated")
        try:
            parsed = engine_names.parse_spec(metric.metricSpec)
        except engine_names.MetricSpecError as err:
            raise error(where, f"custom metric {metric.attributeKey!r}: {err}") from None
        if parsed is None:
            raise error(where, f"custom metric {metric.attributeKey!r} spec cannot be empty")
        custom.append((metric.attributeKey, parsed))
    return engine_names.EngineMapping(
        config.name,
        queued=spec("queuedRequestsSpec"),
        running=spec("runningRequestsSpec"),
        kv_usage=spec("kvUsageSpec"),
        lora=spec("loraSpec"),
        cache_info=spec("cacheInfoSpec"),
        cache_block_size_label=config.cacheBlockSizeLabelName or "block_size",
        cache_num_blocks_label=config.cacheNumBlocksLabelName or "num_gpu_blocks",
        cache_block_size=spec("cacheBlockSizeSpec"),
        cache_num_blocks=spec("cacheNumBlocksSpec"),
        custom=tuple(custom),
    )
