"""The `flowControl` section of an EndpointPickerConfig and its plugin types, decoded strictly.

llm-d's schema (`FlowControlConfig`), with its defaults:

    featureGates: [flowControl]          # flow control is off without it
    flowControl:
      maxBytes: 0                         # global cap on queued bytes, Kubernetes quantity (0: none)
      maxRequests: 0                      # global cap on queued requests (0: none)
      defaultRequestTTL: 60s              # queue-wait budget while the pool has endpoints (0s: none)
      noEndpointRequestTTL: <defaultRequestTTL>   # ... while it has none (scale from zero)
      defaultPriorityBand:                # template for a priority not listed in priorityBands
        maxBytes: 1G                      # per band; 0 or unset: 1,000,000,000
        maxRequests: 5000                 # per band; 0 or unset: 5,000
        fairnessPolicyRef: global-strict-fairness-policy
        orderingPolicyRef: fcfs-ordering-policy
      defaultNegativePriorityBand: {...}  # template for priorities < 0 (else defaultPriorityBand)
      priorityBands: [{priority: 10, ...}]
      usageLimitPolicyPluginRef: static-usage-limit-policy
      saturationDetector: {pluginRef: utilization-detector}
      enableEviction: false               # cut in-flight sheddable requests for higher priorities

The policies are plugins of the `plugins:` list; the three defaults (`fcfs-ordering-policy`,
`global-strict-fairness-policy`, `static-usage-limit-policy`) exist without being listed, as in
llm-d. Everything else is refused with its line, where llm-d would load and then ignore it: a
`flowControl` section other than `saturationDetector` without the feature gate, a `priority` in
a band template, a plugin of the wrong kind behind a ref, an eviction policy without
`enableEviction`. A listed flow-control plugin nothing refers to is reported as a warning, as an
unused scheduling plugin is.

`epp.scheduling.config` hands the section over undecoded (`FlowControlSection`), since it sits
below this package; `build` is the one way to turn it into a `FlowControlConfig`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from epp.flowcontrol import fairness, ordering, usage_limits
from epp.flowcontrol.fair_share import FairShare
from epp.flowcontrol.program_aware import Params as ProgramAwareParams
from epp.flowcontrol.program_aware import ProgramAware
from epp.scheduling import config as sched_config
from epp.scheduling import interfaces
from epp.units import parse_duration

ConfigError = sched_config.ConfigError
Path = tuple[str | int, ...]

DEFAULT_TTL = 60.0
DEFAULT_BAND_BYTES = 1_000_000_000  # llm-d's 1G (not 1 GiB)
DEFAULT_BAND_REQUESTS = 5000
DEFAULT_ORDERING = ordering.Fcfs.type
DEFAULT_FAIRNESS = fairness.GlobalStrict.type
DEFAULT_USAGE_LIMIT = usage_limits.Static.type
_INJECTED = (DEFAULT_ORDERING, DEFAULT_FAIRNESS, DEFAULT_USAGE_LIMIT)  # exist without being listed
EVICTION_TYPES = {
    "eviction-sheddable-filter": "eviction filter",
    "sheddable-eviction-filter": "eviction filter",
    "eviction-priority-then-time-ordering": "eviction ordering",
    "priority-then-time-eviction-order-policy": "eviction ordering",
}


@dataclasses.dataclass(frozen=True, slots=True)
class BandSpec:
    max_bytes: int
    max_requests: int
    fairness: fairness.FairnessPolicy
    ordering: ordering.OrderingPolicy


@dataclasses.dataclass(slots=True)
class FlowControlConfig:
    default_band: BandSpec
    usage_limit: usage_limits.UsageLimitPolicy
    default_negative_band: BandSpec | None = None
    bands: dict[int, BandSpec] = dataclasses.field(default_factory=dict)
    default_request_ttl: float = DEFAULT_TTL
    no_endpoint_request_ttl: float = DEFAULT_TTL
    max_bytes: int = 0
    max_requests: int = 0
    enable_eviction: bool = False
    # program-aware-fairness instances in use: the Director reports completions to them.
    programs: list[ProgramAware] = dataclasses.field(default_factory=list)

    def template(self, priority: int) -> BandSpec:
        """The band a priority not listed in `bands` gets."""
        if priority < 0 and self.default_negative_band is not None:
            return self.default_negative_band
        return self.default_band

    @classmethod
    def defaults(cls) -> FlowControlConfig:
        """llm-d's defaults (the gate on, no `flowControl` section)."""
        band = BandSpec(
            DEFAULT_BAND_BYTES,
            DEFAULT_BAND_REQUESTS,
            fairness.GlobalStrict(DEFAULT_FAIRNESS),
            ordering.Fcfs(DEFAULT_ORDERING),
        )
        return cls(default_band=band, usage_limit=usage_limits.Static(DEFAULT_USAGE_LIMIT))


@dataclasses.dataclass(slots=True)
class FlowControlSetup:
    detector: interfaces.SaturationDetector  # what admission (legacy or flow control) asks
    config: FlowControlConfig | None  # None: the feature gate is off (GIE's legacy admission)
    warnings: list[str]


# ---- the section, as written -----------------------------------------------------------------

Quantity = int | float | str


class _Band(msgspec.Struct, forbid_unknown_fields=True):
    priority: int | None = None
    maxBytes: Quantity | None = None
    maxRequests: Quantity | None = None
    fairnessPolicyRef: str = ""
    orderingPolicyRef: str = ""


class _Ref(msgspec.Struct, forbid_unknown_fields=True):
    pluginRef: str = ""


class _Section(msgspec.Struct, forbid_unknown_fields=True):
    maxBytes: Quantity | None = None
    maxRequests: Quantity | None = None
    defaultRequestTTL: str | None = None
    noEndpointRequestTTL: str | None = None
    defaultPriorityBand: _Band | None = None
    defaultNegativePriorityBand: _Band | None = None
    priorityBands: list[_Band] = []
    usageLimitPolicyPluginRef: str = ""
    saturationDetector: _Ref | None = None
    enableEviction: bool = False


class _StaticParams(msgspec.Struct, forbid_unknown_fields=True):
    threshold: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1.0


class _HoldbackParams(msgspec.Struct, forbid_unknown_fields=True):
    minCeiling: Annotated[float, msgspec.Meta(ge=0, lt=1)] | None = None
    maxCeiling: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1.0
    shape: str = "linear"
    domain: str = "rank"


class _NoParams(msgspec.Struct, forbid_unknown_fields=True):
    pass


class _FairShareParams(msgspec.Struct, forbid_unknown_fields=True):
    overShareCeiling: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.4
    overShareFactor: Annotated[float, msgspec.Meta(ge=1)] = 1.5


# type -> (kind, parameters)
PLUGIN_TYPES: dict[str, tuple[str, type[msgspec.Struct]]] = {
    ordering.Fcfs.type: ("ordering policy", _NoParams),
    ordering.Edf.type: ("ordering policy", _NoParams),
    ordering.SloDeadline.type: ("ordering policy", _NoParams),
    fairness.GlobalStrict.type: ("fairness policy", _NoParams),
    fairness.RoundRobin.type: ("fairness policy", _NoParams),
    FairShare.type: ("fairness policy", _FairShareParams),
    ProgramAware.type: ("fairness policy", ProgramAwareParams),
    usage_limits.Static.type: ("usage-limit policy", _StaticParams),
    usage_limits.SoftReflectiveCeiling.type: ("usage-limit policy", _NoParams),
    usage_limits.PriorityHoldback.type: ("usage-limit policy", _HoldbackParams),
    **{name: (kind, _NoParams) for name, kind in EVICTION_TYPES.items()},
}


def build(
    section: sched_config.FlowControlSection,
    plugins: Mapping[str, interfaces.Plugin],
    detector: interfaces.SaturationDetector,
) -> FlowControlSetup:
    """Decode the flow-control part of a loaded configuration. `plugins` are the scheduling
    plugins built (for `saturationDetector.pluginRef`); `detector` is the configuration's
    top-level (or default) saturation detector. Raises ConfigError with the line."""
    return _Builder(section, plugins, detector).build()


class _Builder:
    def __init__(
        self,
        section: sched_config.FlowControlSection,
        plugins: Mapping[str, interfaces.Plugin],
        detector: interfaces.SaturationDetector,
    ) -> None:
        self.raw = section
        self.where = section.where
        self.scheduling = plugins
        self.detector = detector
        self.built: dict[str, Any] = {}  # flow-control plugins by name
        self.defaults: dict[str, Any] = {}  # the three built in, when not listed
        self.paths: dict[str, Path] = {}
        self.used: set[str] = set()
        self.warnings: list[str] = []

    def build(self) -> FlowControlSetup:
        path: Path = ("flowControl",)
        try:
            doc = msgspec.convert(self.raw.section or {}, _Section)
        except msgspec.ValidationError as err:
            raise self.where.validation_error(err, prefix=path, known=_Section.__struct_fields__) from None
        self._build_plugins()
        detector = self._detector(doc)
        if not self.raw.enabled:
            given = [
                k
                for k in _Section.__struct_fields__
                if k != "saturationDetector" and k in (self.raw.section or {})
            ]
            if given:
                raise self.where.error(
                    (*path, given[0]),
                    "flowControl is configured but the flowControl feature gate is off: add "
                    "`featureGates: [flowControl]`, or remove the section (only saturationDetector "
                    "applies without the gate, to the legacy admission)",
                )
            if self.built:
                name = next(iter(self.built))
                raise self.where.error(
                    self.paths[name],
                    f"plugin {name!r} (type {self.built[name].type!r}) is a flow-control plugin, but the "
                    "flowControl feature gate is off: add `featureGates: [flowControl]` or remove it",
                )
            return FlowControlSetup(detector, None, self.warnings)
        config = self._config(doc, path)
        for name, plugin in self.built.items():
            if name not in self.used:
                self.warnings.append(f"flow-control plugin {name!r} (type {plugin.type!r}) is not used")
        return FlowControlSetup(detector, config, self.warnings)

    def _build_plugins(self) -> None:
        for path, name, type_name, parameters in self.raw.plugins:
            schema = PLUGIN_TYPES[type_name][1]
            try:
                params = msgspec.convert(parameters or {}, schema)
            except msgspec.ValidationError as err:
                raise self.where.validation_error(
                    err, prefix=(*path, "parameters"), known=schema.__struct_fields__
                ) from None
            self.built[name] = self._make(path, name, type_name, params)
            self.paths[name] = path

    def _make(self, path: Path, name: str, type_name: str, params: Any) -> Any:
        if type_name == ordering.Fcfs.type:
            return ordering.Fcfs(name)
        if type_name == ordering.Edf.type:
            return ordering.Edf(name)
        if type_name == ordering.SloDeadline.type:
            return ordering.SloDeadline(name)
        if type_name == fairness.GlobalStrict.type:
            return fairness.GlobalStrict(name)
        if type_name == fairness.RoundRobin.type:
            return fairness.RoundRobin(name)
        if type_name == FairShare.type:
            return FairShare(name, params.overShareCeiling, params.overShareFactor)
        if type_name == ProgramAware.type:
            return ProgramAware(name, params)
        if type_name == usage_limits.Static.type:
            return usage_limits.Static(name, params.threshold)
        if type_name == usage_limits.SoftReflectiveCeiling.type:
            return usage_limits.SoftReflectiveCeiling(name)
        if type_name == usage_limits.PriorityHoldback.type:
            where = (*path, "parameters")
            if params.minCeiling is None:
                raise self.where.error(where, f"plugin {name!r} (type {type_name!r}): minCeiling is required")
            if params.shape != "linear":
                raise self.where.error(
                    (*where, "shape"), f"unsupported shape {params.shape!r}, must be 'linear'"
                )
            if params.domain not in ("rank", "value"):
                raise self.where.error(
                    (*where, "domain"), f"unsupported domain {params.domain!r}, must be 'rank' or 'value'"
                )
            if params.minCeiling >= params.maxCeiling:
                raise self.where.error(
                    where,
                    f"minCeiling ({params.minCeiling}) must be less than maxCeiling ({params.maxCeiling})",
                )
            return usage_limits.PriorityHoldback(
                name,
                min_ceiling=params.minCeiling,
                max_ceiling=params.maxCeiling,
                by_value=params.domain == "value",
            )
        return _EvictionPolicy(name, type_name)

    def _ref(self, path: Path, ref: str, kind: str, default: str) -> Any:
        """The plugin `ref` names (the default when empty), which must be a `kind`."""
        name = ref or default
        plugin = self.built.get(name) or self.defaults.get(name)
        if plugin is None and name in _INJECTED and name not in self.scheduling:
            plugin = self.defaults[name] = self._make(path, name, name, PLUGIN_TYPES[name][1]())
        if plugin is None:
            if name in self.scheduling:
                found = self.scheduling[name]
                raise self.where.error(path, f"plugin {name!r} (type {found.type!r}) is not a {kind}")
            raise self.where.error(path, f"pluginRef {name!r} is not a defined plugin")
        if PLUGIN_TYPES[plugin.type][0] != kind:
            raise self.where.error(path, f"plugin {name!r} (type {plugin.type!r}) is not a {kind}")
        self.used.add(name)
        return plugin

    def _detector(self, doc: _Section) -> interfaces.SaturationDetector:
        ref = doc.saturationDetector
        if ref is None or not ref.pluginRef:
            return self.detector
        path: Path = ("flowControl", "saturationDetector", "pluginRef")
        if self.raw.top_level_detector and self.raw.top_level_detector != ref.pluginRef:
            raise self.where.error(
                path,
                f"saturationDetector.pluginRef {self.raw.top_level_detector!r} (deprecated) and "
                f"flowControl.saturationDetector.pluginRef {ref.pluginRef!r} differ: keep one",
            )
        plugin = self.scheduling.get(ref.pluginRef)
        if isinstance(plugin, interfaces.SaturationDetector):
            return plugin
        if plugin is None and ref.pluginRef not in self.built:
            raise self.where.error(path, f"pluginRef {ref.pluginRef!r} is not a defined plugin")
        type_name = plugin.type if plugin is not None else self.built[ref.pluginRef].type
        raise self.where.error(
            path, f"plugin {ref.pluginRef!r} (type {type_name!r}) is not a saturation detector"
        )

    def _config(self, doc: _Section, path: Path) -> FlowControlConfig:
        default_ttl = self._duration((*path, "defaultRequestTTL"), doc.defaultRequestTTL, DEFAULT_TTL)
        no_endpoint_ttl = self._duration(
            (*path, "noEndpointRequestTTL"), doc.noEndpointRequestTTL, default_ttl
        )
        default_band = self._band((*path, "defaultPriorityBand"), doc.defaultPriorityBand, template=True)
        negative = None
        if doc.defaultNegativePriorityBand is not None:
            negative = self._band(
                (*path, "defaultNegativePriorityBand"), doc.defaultNegativePriorityBand, template=True
            )
        bands: dict[int, BandSpec] = {}
        for i, band in enumerate(doc.priorityBands):
            where = (*path, "priorityBands", i)
            if band.priority is None:
                raise self.where.error(where, "priority is required")
            if band.priority in bands:
                raise self.where.error((*where, "priority"), f"duplicate priority band {band.priority}")
            bands[band.priority] = self._band(where, band, template=False)
        usage = self._ref(
            (*path, "usageLimitPolicyPluginRef"),
            doc.usageLimitPolicyPluginRef,
            "usage-limit policy",
            DEFAULT_USAGE_LIMIT,
        )
        evictions = [n for n, p in self.built.items() if isinstance(p, _EvictionPolicy)]
        if evictions and not doc.enableEviction:
            name = evictions[0]
            raise self.where.error(
                self.paths[name],
                f"plugin {name!r} (type {self.built[name].type!r}) has an effect only with "
                "flowControl.enableEviction: true",
            )
        self.used.update(evictions)
        programs = [p for n, p in self.built.items() if isinstance(p, ProgramAware) and n in self.used]
        return FlowControlConfig(
            default_band=default_band,
            usage_limit=usage,
            default_negative_band=negative,
            bands=bands,
            default_request_ttl=default_ttl,
            no_endpoint_request_ttl=no_endpoint_ttl,
            max_bytes=self._quantity((*path, "maxBytes"), doc.maxBytes),
            max_requests=self._quantity((*path, "maxRequests"), doc.maxRequests),
            enable_eviction=doc.enableEviction,
            programs=programs,
        )

    def _band(self, path: Path, band: _Band | None, *, template: bool) -> BandSpec:
        band = band or _Band()
        if template and band.priority is not None:
            raise self.where.error(
                (*path, "priority"), "a band template takes no priority (each band it makes has its own)"
            )
        return BandSpec(
            max_bytes=self._quantity((*path, "maxBytes"), band.maxBytes) or DEFAULT_BAND_BYTES,
            max_requests=self._quantity((*path, "maxRequests"), band.maxRequests) or DEFAULT_BAND_REQUESTS,
            fairness=self._ref(
                (*path, "fairnessPolicyRef"), band.fairnessPolicyRef, "fairness policy", DEFAULT_FAIRNESS
            ),
            ordering=self._ref(
                (*path, "orderingPolicyRef"), band.orderingPolicyRef, "ordering policy", DEFAULT_ORDERING
            ),
        )

    def _duration(self, path: Path, text: str | None, default: float) -> float:
        if text is None:
            return default
        try:
            seconds = parse_duration(text)
        except ValueError as err:
            raise self.where.error(path, str(err)) from None
        return seconds

    def _quantity(self, path: Path, value: Quantity | None) -> int:
        if value is None:
            return 0
        try:
            return parse_quantity(value)
        except ValueError as err:
            raise self.where.error(path, str(err)) from None


class _EvictionPolicy:
    """`eviction-sheddable-filter` / `eviction-priority-then-time-ordering`: the only in-flight
    eviction policies, which `enableEviction` always uses; listing them changes nothing."""

    def __init__(self, name: str, type_name: str) -> None:
        self.name = name
        self.type = type_name


_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
}  # fmt: skip


def parse_quantity(value: Quantity) -> int:
    """A Kubernetes resource quantity (`1Gi`, `500M`, `5k`, `100`) as an integer, rounded up as
    `Quantity.Value()` rounds; ValueError when it is not one or is negative."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        number, suffix = float(value), None
    else:
        match = _QUANTITY.match(value.strip())
        if match is None:
            raise ValueError(f"not a quantity: {value!r} (use e.g. 1Gi, 500M, 5k, 100)")
        number, suffix = float(match[1]), match[2]
    amount = number * _SUFFIX[suffix]
    if amount < 0:
        raise ValueError(f"must be non-negative, got {value!r}")
    whole = int(amount)
    return whole + 1 if amount > whole else whole
