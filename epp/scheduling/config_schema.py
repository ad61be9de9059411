"""The `EndpointPickerConfig` document as epp decodes it (strictly: an unknown key anywhere epp
acts on is an error), and `SchedulerConfig`, what loading it gives the caller. The rules and the
loaders: `epp.scheduling.config`; the building: `epp.scheduling.config_builder`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import msgspec

from epp.api.routes import Parsers
from epp.scheduling import config_compat, datalayer, framework, interfaces, request_handler
from epp.scheduling.plugins import precise_llmd
from epp.tokenize.render import RenderSpec

API_VERSION = "inference.networking.x-k8s.io/v1alpha1"
API_VERSIONS = (API_VERSION, "llm-d.ai/v1alpha1")  # GIE's, llm-d's: one schema
KIND = "EndpointPickerConfig"
DEFAULT_PICKER = "max-score-picker"  # GIE's default when a profile names no picker
DEFAULT_DETECTOR = "utilization-detector"  # GIE's default when the config names no detector


@dataclasses.dataclass(slots=True)
class SchedulerConfig:
    scheduler: framework.Scheduler
    plugins: dict[str, interfaces.Plugin]  # every plugin built, by name (GIE-only types excluded)
    # The configured plugins implementing the director's hooks, in configuration order.
    pre_request: list[interfaces.PreRequest]
    response_complete: list[interfaces.ResponseComplete]
    # What admission asks how saturated the pool is (the configured one, else GIE's default).
    saturation_detector: interfaces.SaturationDetector
    warnings: list[str]  # accepted but ignored parts of the configuration, for the caller to log
    # token-producer plugins (epp.scheduling.token_producer): model -> local tokenizer path (loaded
    # by the caller: epp.tokenize), model ("": every model) -> where the pods' /render is asked,
    # and whether llm-d's estimate backend (epp's stand-in tokenizer) is asked for.
    tokenizers: dict[str, Path] = dataclasses.field(default_factory=dict)
    render: dict[str, RenderSpec] = dataclasses.field(default_factory=dict)
    stand_in: bool = False
    # How llm-d's precise-prefix-cache-scorer parameters say KV events are consumed (None: flags).
    kv_events: precise_llmd.KVEventsSettings | None = None
    # The flowControl section and flow-control plugins, for epp.flowcontrol.config.build.
    flow_control: FlowControlSection | None = None
    # Which parser reads a request, by path (requestHandler.parsers: epp.scheduling.request_handler).
    parsers: Parsers = dataclasses.field(default_factory=Parsers.default)
    # llm-d's request control around scheduling, in configuration order: header processors
    # (agent identity, session ids), admitters, plugins adding response headers.
    header_processors: list[interfaces.RequestHeaderProcessor] = dataclasses.field(default_factory=list)
    producers: list[interfaces.RequestProducer] = dataclasses.field(default_factory=list)
    admitters: list[interfaces.Admitter] = dataclasses.field(default_factory=list)
    response_headers: list[interfaces.ResponseHeaders] = dataclasses.field(default_factory=list)
    # llm-d's data layer: the metrics scrape, DCGM polls, file discovery, topology labels.
    data_layer: datalayer.DataLayerSettings = dataclasses.field(default_factory=datalayer.DataLayerSettings)


@dataclasses.dataclass(frozen=True, slots=True)
class FlowControlSection:
    """What of the configuration is flow control's, undecoded: epp.flowcontrol.config (above this
    package) decodes it, reporting errors through `where` with their lines."""

    enabled: bool  # featureGates names flowControl
    section: dict[str, Any] | None  # the flowControl mapping as written
    plugins: list[
        tuple[tuple[str | int, ...], str, str, dict[str, Any] | None]
    ]  # (where, name, type, parameters)
    top_level_detector: str  # the deprecated top-level saturationDetector.pluginRef ("" if none)
    where: Any  # the document's locator: error(path, message), validation_error(err, prefix=, known=)


class PluginSpec(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    name: str = ""
    parameters: dict[str, Any] | None = None


class ProfileEntry(msgspec.Struct, forbid_unknown_fields=True):
    pluginRef: str
    weight: Annotated[float, msgspec.Meta(ge=0)] | None = None


class ProfileSpec(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    plugins: list[ProfileEntry] = []


class Document(msgspec.Struct, forbid_unknown_fields=True):
    apiVersion: str = ""
    kind: str = ""
    plugins: list[PluginSpec] = []
    schedulingProfiles: list[ProfileSpec] = []
    featureGates: list[str] = []
    saturationDetector: config_compat.SaturationDetectorSection | None = None
    dataLayer: datalayer.Section | None = None
    flowControl: dict[str, Any] | None = None
    parser: request_handler.Ref | None = None
    requestHandler: request_handler.Section | None = None
