"""Builds a `SchedulerConfig` from a decoded `EndpointPickerConfig` (`config_schema.Document`):
the plugins, the profiles and their handler, the saturation detector, the tokenizers, parsers,
data layer and flow-control sections, with every error located in the document (the rules:
`epp.scheduling.config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from epp.api.routes import Parsers
from epp.scheduling import (
    catalog,
    config_compat,
    config_profiles,
    config_yaml,
    datalayer,
    disagg,
    framework,
    interfaces,
    producers,
    registry,
    request_handler,
    token_producer,
)
from epp.scheduling.config_compat import GIE_ONLY as _GIE_ONLY
from epp.scheduling.config_compat import WHY as _WHY
from epp.scheduling.config_schema import (
    DEFAULT_DETECTOR,
    DEFAULT_PICKER,
    Document,
    FlowControlSection,
    SchedulerConfig,
)
from epp.scheduling.plugins import (
    header_profile_handler,
    no_hit_lru_scorer,
    precise_llmd,
    precise_prefix_cache_scorer,
    single_profile_handler,
    topology_affinity,
)
from epp.scheduling.plugins.prefix_match_scorer import PrefixProducer

ConfigError = registry.ConfigError


class Builder:
    def __init__(
        self,
        doc: Document,
        where: config_yaml.Locator,
        handle: interfaces.Handle,
        base_dir: Path,
        allow_experimental: bool,
    ) -> None:
        self.doc = doc
        self.allow_experimental = allow_experimental
        self.where = where
        self.handle = handle
        self.base_dir = base_dir
        self.plugins: dict[str, interfaces.Plugin] = {}
        self.ignored: dict[str, str] = {}  # GIE-only plugins: name -> type
        self.token_producers = token_producer.Collector(
            base_dir, where.error, lambda err, at, known: where.validation_error(err, prefix=at, known=known)
        )
        self.kv_events: tuple[_Path, precise_llmd.KVEventsSettings] | None = None
        self.parser_plugins = request_handler.Collector(where.error)
        self.parsers = Parsers.default()
        self.used: set[str] = set()
        self.warnings: list[str] = []
        self._default_picker: interfaces.Picker | None = None
        self.flow_enabled = False
        self.flow_plugins: list[tuple[_Path, str, str, dict[str, Any] | None]] = []
        # llm-d v0.9+'s prefix-cache-scorers (built once their producers are), and producers
        # made with llm-d's defaults because a scorer reads the default one and none is defined.
        self.deferred: dict[str, tuple[_Path, dict[str, Any] | None]] = {}
        self.created: dict[str, interfaces.Plugin] = {}
        self.data = datalayer.Collector(where.error, where.validation_error)
        self.data_layer = datalayer.DataLayerSettings()

    def build(self) -> SchedulerConfig:
        self._build_plugins()
        self.warnings.extend(self.token_producers.notes)
        self._check_sections()
        profiles = self._build_profiles()
        plugins = list(self.plugins.values())
        handlers = [p for p in plugins if isinstance(p, _HANDLERS)]
        if len(handlers) > 1:
            raise ConfigError(f"more than one profile handler: {', '.join(h.name for h in handlers)}")
        scheduler: framework.Scheduler
        split = (
            handlers[0] if handlers and isinstance(handlers[0], disagg.handler.DisaggProfileHandler) else None
        )
        if split is not None:
            try:
                scheduler, notes = split.scheduler({p.name: p for p in profiles}, self.plugins)
            except ConfigError as err:
                raise self.where.error(
                    ("plugins", self._plugin_names().index(split.name)), str(err)
                ) from None
            self.warnings.extend(notes)
            self.used.update(
                d.name for d in (scheduler.prefill_decider, scheduler.encode_decider) if d is not None
            )
        elif handlers and isinstance(handlers[0], header_profile_handler.HeaderProfileHandler):
            scheduler, notes = handlers[0].scheduler(profiles)
            self.warnings.extend(notes)
        elif len(profiles) > 1:
            raise self.where.error(
                ("schedulingProfiles",),
                f"{len(profiles)} profiles ({', '.join(p.name for p in profiles)}) need a multi-profile "
                "handler (disagg-profile-handler, header-profile-handler)",
            )
        else:
            scheduler = framework.Scheduler(profiles, profiles[0].name)
        for name, plugin in self.plugins.items():
            if isinstance(plugin, disagg.handler.DisaggHeadersHandler) and split is None:
                raise self.where.error(
                    ("plugins", self._plugin_names().index(name)),
                    f"plugin {name!r} (type {plugin.type!r}) writes the P/D headers of a disaggregation "
                    "handler; the configuration has none (add disagg-profile-handler)",
                )
            if isinstance(plugin, disagg.deciders.Decider) and name not in self.used:
                self.warnings.append(f"decider {name!r} (type {plugin.type!r}) is not used by any handler")
        detector = self.doc.saturationDetector
        if detector is not None:
            self.used.add(detector.pluginRef)
        flow_detector = (self.doc.flowControl or {}).get("saturationDetector")
        if isinstance(flow_detector, dict) and isinstance(flow_detector.get("pluginRef"), str):
            self.used.add(flow_detector["pluginRef"])  # checked by epp.flowcontrol.config
        for name, plugin in self.plugins.items():
            if _is_scheduling(plugin) and name not in self.used:
                self.warnings.append(f"plugin {name!r} (type {plugin.type!r}) is not used by any profile")
        # A producer records the picks for the scorers reading it (its pre_request); one nothing
        # in a profile reads would record for nobody.
        read = {id(getattr(p, "source", None)) for n, p in self.plugins.items() if n in self.used}
        unread = {id(p) for p in plugins if producers.is_producer(p) and id(p) not in read}
        for plugin in plugins:
            if id(plugin) in unread:
                self.warnings.append(
                    f"producer {plugin.name!r} (type {plugin.type!r}) is read by no scorer in a profile"
                )
        return SchedulerConfig(
            scheduler=scheduler,
            plugins=self.plugins,
            pre_request=[p for p in plugins if isinstance(p, interfaces.PreRequest) and id(p) not in unread],
            response_complete=[p for p in plugins if isinstance(p, interfaces.ResponseComplete)],
            header_processors=[p for p in plugins if isinstance(p, interfaces.RequestHeaderProcessor)],
            producers=[
                p for p in plugins if isinstance(p, interfaces.RequestProducer) and id(p) not in unread
            ],
            admitters=[p for p in plugins if isinstance(p, interfaces.Admitter)],
            response_headers=[p for p in plugins if isinstance(p, interfaces.ResponseHeaders)],
            saturation_detector=self._saturation_detector(),
            warnings=self.warnings,
            tokenizers=self.token_producers.sources.paths,
            render=self.token_producers.sources.render,
            stand_in=self.token_producers.sources.stand_in,
            kv_events=self.kv_events[1] if self.kv_events is not None else None,
            data_layer=self.data_layer,
            flow_control=FlowControlSection(
                self.flow_enabled,
                self.doc.flowControl,
                self.flow_plugins,
                detector.pluginRef if detector is not None else "",
                self.where,
            ),
            parsers=self.parsers,
        )

    def _build_plugins(self) -> None:
        names = set(self._plugin_names())
        for i, spec in enumerate(self.doc.plugins):
            path = ("plugins", i)
            if not spec.type:
                raise self.where.error(path, "plugin type is empty")
            name = spec.name or spec.type
            if (
                name in self.plugins
                or name in self.ignored
                or name in self.token_producers
                or name in self.parser_plugins
                or name in self.deferred
                or name in self.data
                or any(name == flow[1] for flow in self.flow_plugins)
            ):
                raise self.where.error(path, f"duplicate plugin name {name!r}")
            if request_handler.is_parser_type(spec.type):
                self.parser_plugins.add(path, name, spec.type, spec.parameters)
                continue
            if spec.type in token_producer.TYPES:
                self.token_producers.add(path, name, spec.type, spec.parameters)
                continue
            if spec.type in config_compat.FLOW_CONTROL:  # built by epp.flowcontrol.config
                self.flow_plugins.append((path, name, spec.type, spec.parameters))
                continue
            if spec.type in datalayer.TYPES:  # what serve runs: DataLayerSettings
                self.data.add(path, name, spec.type, spec.parameters)
                continue
            refused = config_compat.REFUSED.get(spec.type)
            schema = config_compat.REFUSED_PARAMS.get(spec.type)
            if refused is not None and schema is not None:
                try:
                    msgspec.convert(spec.parameters or {}, schema)
                except msgspec.ValidationError as err:
                    raise self.where.validation_error(
                        err, prefix=(*path, "parameters"), known=schema.__struct_fields__
                    ) from None
            if refused is not None:
                raise self.where.error(
                    path, f"plugin {name!r} (type {spec.type!r}) is not supported: {refused}"
                )
            kind = _GIE_ONLY.get(spec.type)
            try:
                if spec.type == "prefix-cache-scorer" and producers.reads_producer(
                    name, spec.parameters, api_version=self.doc.apiVersion, plugin_names=names
                ):
                    self.deferred[name] = (path, spec.parameters)  # once its producer is built
                    continue
                if kind is not None:
                    config_compat.check_gie_only(name, spec.type, spec.parameters)
                    self.ignored[name] = spec.type
                    self.warnings.append(f"plugin {name!r} (type {spec.type!r}) is ignored: {_WHY[kind]}")
                    continue
                plugin = registry.default.build(spec.type, name, spec.parameters, self.handle)
            except ConfigError as err:
                raise self._plugin_error(path, spec.type, spec.parameters, err) from None
            self._add(path, name, plugin)
        for name, (where, parameters) in self.deferred.items():
            try:
                scorer = producers.build_scorer(name, parameters, self._producer)
            except ConfigError as err:
                at: _Path = where
                if "prefixMatchInfoProducerName" in (parameters or {}):
                    at = (*where, "parameters", "prefixMatchInfoProducerName")
                label = f"plugin {name!r} (type 'prefix-cache-scorer')"
                message = str(err) if str(err).startswith(label) else f"{label} {err}"
                raise self.where.error(at, message) from None
            self.plugins[name] = scorer
        for plugin in self.plugins.values():
            if isinstance(plugin, no_hit_lru_scorer.NoHitLRUScorer):
                i = self._plugin_names().index(plugin.name)
                try:
                    plugin.source = self._producer(plugin.producer_name or producers.DEFAULT_PRODUCER)
                except ConfigError as err:
                    raise self.where.error(
                        ("plugins", i, "parameters", "prefixMatchInfoProducerName"),
                        f"plugin {plugin.name!r} (type {plugin.type!r}) {err}",
                    ) from None
        self.plugins.update(self.created)
        for i, spec in enumerate(self.doc.plugins):
            if catalog.is_experimental(spec.type) and not self.allow_experimental:
                raise self.where.error(
                    ("plugins", i), catalog.experimental_refusal(spec.name or spec.type, spec.type)
                )

    def _add(self, path: _Path, name: str, plugin: interfaces.Plugin) -> None:
        self.plugins[name] = plugin
        if isinstance(plugin, precise_prefix_cache_scorer.PrecisePrefixCacheScorer):
            self._take_llmd(path, plugin.llmd)
        notes = getattr(plugin, "config_notes", ())
        self.warnings.extend(notes)

    def _producer(self, wanted: str) -> PrefixProducer:
        return producers.find_producer(wanted, self.plugins, self.handle, self.created)

    def _plugin_error(
        self, path: _Path, type_name: str, parameters: dict[str, Any] | None, err: ConfigError
    ) -> ConfigError:
        culprit = config_yaml.culprit(path, parameters, str(err))
        stale = config_compat.STALE.get((type_name, self.where.dotted(culprit[3:])))
        message = f"{err}; {stale}" if stale is not None else str(err)
        return self.where.error(culprit, message)

    def _take_llmd(self, path: _Path, mapped: precise_llmd.Mapped) -> None:
        self.warnings.extend(mapped.notes)
        self.token_producers.render_model(mapped.tokenizer_model or "")
        if mapped.kv_events is None:
            return
        if self.kv_events is not None and self.kv_events[1] != mapped.kv_events:
            raise self.where.error(
                (*path, "parameters"),
                f"its KV-event settings {mapped.kv_events} differ from those of "
                f"{self.where.dotted(self.kv_events[0])} ({self.kv_events[1]}); "
                "epp consumes KV events one way",
            )
        self.kv_events = (path, mapped.kv_events)

    def _check_sections(self) -> None:
        doc = self.doc
        self.flow_enabled, notes = config_compat.feature_gates(doc.featureGates, self.where.error)
        self.warnings.extend(notes)
        self.data_layer = self.data.build(doc.dataLayer, self.plugins, _follows_endpoints)
        self.warnings.extend(self.data.warnings)
        for plugin in self.plugins.values():
            if isinstance(
                plugin, topology_affinity.TopologyAffinityFilter | topology_affinity.TopologyAffinityScorer
            ):
                plugin.labels = self.data_layer.topology.get(plugin.producer)
                if plugin.labels is None:
                    self.warnings.append(
                        f"plugin {plugin.name!r} (type {plugin.type!r}): no topology-extractor named "
                        f"{plugin.producer!r}, so it never finds a peer's locality (as in llm-d: it "
                        "keeps every candidate, or scores 0)"
                    )
        self.parsers = self.parser_plugins.build(doc.requestHandler, doc.parser)
        self.warnings.extend(self.parser_plugins.warnings)

    def _saturation_detector(self) -> interfaces.SaturationDetector:
        section = self.doc.saturationDetector
        if section is None or not section.pluginRef:
            inline = section.inline() if section is not None else {}
            try:
                detector = registry.default.build(DEFAULT_DETECTOR, DEFAULT_DETECTOR, inline, self.handle)
            except ConfigError as err:
                raise self.where.error(("saturationDetector",), str(err)) from None
            assert isinstance(detector, interfaces.SaturationDetector)
            return detector
        path: _Path = ("saturationDetector", "pluginRef")
        if section.inline():
            raise self.where.error(
                ("saturationDetector", next(iter(section.inline()))),
                "give pluginRef or the inline thresholds (GIE v1.0-1.3), not both: configure the "
                "referenced plugin's parameters instead",
            )
        plugin = self.plugins.get(section.pluginRef)
        if isinstance(plugin, interfaces.SaturationDetector):
            return plugin
        if plugin is None and section.pluginRef in self.data:
            raise self.where.error(
                path,
                f"plugin {section.pluginRef!r} (type {self.data.plugins[section.pluginRef].type!r}) is not "
                "a saturation detector",
            )
        if plugin is None and section.pluginRef not in self.ignored:
            raise self.where.error(path, f"pluginRef {section.pluginRef!r} is not a defined plugin")
        type_name = plugin.type if plugin is not None else self.ignored[section.pluginRef]
        raise self.where.error(
            path, f"plugin {section.pluginRef!r} (type {type_name!r}) is not a saturation detector"
        )

    def _check_ref(self, path: _Path, ref: str, kinds: tuple[str, ...]) -> str:
        """Check that `ref` names a plugin of one of `kinds` (GIE-only kinds, or "scorer" for a
        built scorer); return its kind."""
        wanted = " or ".join(f"a {k}" for k in kinds)
        type_name = self.ignored.get(ref)
        if type_name is None:
            plugin = self.plugins.get(ref)
            if plugin is None:
                raise self.where.error(path, f"pluginRef {ref!r} is not a defined plugin")
            if "scorer" in kinds and isinstance(plugin, interfaces.Scorer):
                return "scorer"
            raise self.where.error(path, f"plugin {ref!r} (type {plugin.type!r}) is not {wanted}")
        kind = _GIE_ONLY[type_name]
        if kind not in kinds:
            raise self.where.error(path, f"plugin {ref!r} (type {type_name!r}) is not {wanted}")
        return kind

    def _build_profiles(self) -> list[framework.Profile]:
        specs = [
            (spec.name, [(e.pluginRef, e.weight) for e in spec.plugins])
            for spec in self.doc.schedulingProfiles
        ]
        profiles, used = config_profiles.build(
            specs, self._plugin_names(), self.plugins, self._elsewhere, self.where, self._default
        )
        self.used |= used
        return profiles

    def _plugin_names(self) -> list[str]:
        return [spec.name or spec.type for spec in self.doc.plugins]

    def _elsewhere(self, ref: str) -> str | None:
        """Why `ref`, a plugin but not a scheduling one, may not be in a profile ("": it may, and
        is skipped); None when `ref` is none of these."""
        if any(ref == flow[1] for flow in self.flow_plugins):
            return f"plugin {ref!r} is a flow-control policy, not a filter, scorer or picker"
        if ref in self.token_producers:
            return ""  # llm-d lists its tokenizer in profiles; epp tokenizes before scheduling
        if ref in self.parser_plugins:
            return (
                f"plugin {ref!r} (type {self.parser_plugins.types[ref]!r}) is a parser, not a filter, "
                "scorer or picker: list it in requestHandler.parsers"
            )
        if ref in self.data:
            return f"plugin {ref!r} is a data-layer {self.data.kind(ref)}, not a filter, scorer or picker"
        if ref in self.ignored:
            kind = _GIE_ONLY[self.ignored[ref]]
            return (
                f"plugin {ref!r} (type {self.ignored[ref]!r}) cannot be used here: epp does not implement "
                f"this {kind} ({_WHY[kind]})"
            )
        return None

    def _default(self) -> interfaces.Picker:
        if self._default_picker is None:
            picker = registry.default.build(DEFAULT_PICKER, DEFAULT_PICKER, None, self.handle)
            assert isinstance(picker, interfaces.Picker)
            self._default_picker = picker
        return self._default_picker


_HANDLERS = (
    single_profile_handler.SingleProfileHandler,
    disagg.handler.DisaggProfileHandler,
    header_profile_handler.HeaderProfileHandler,
)


def _follows_endpoints(plugin: interfaces.Plugin) -> bool:
    """A plugin llm-d lets `endpoint-notification-source` tell of endpoint changes (a producer, or
    the precise scorer that carries one): epp's follow the datastore themselves."""
    return producers.is_producer(plugin) or isinstance(
        plugin, precise_prefix_cache_scorer.PrecisePrefixCacheScorer
    )


_is_scheduling = config_profiles.is_scheduling

_Path = config_yaml.Path
