"""Loads GIE's `EndpointPickerConfig` YAML into a ready `framework.Scheduler`.

The format is GIE's (`apiVersion: inference.networking.x-k8s.io/v1alpha1`, or llm-d's
`llm-d.ai/v1alpha1`, the same schema; `kind: EndpointPickerConfig`):
`plugins[]{name (defaults to type), type, parameters}` and
`schedulingProfiles[]{name, plugins[]{pluginRef, weight}}`. GIE's rules for what is left out
apply: a profile without a picker gets `max-score-picker`, a scorer without a weight gets 1.0, an empty
`schedulingProfiles` becomes one profile `default` made of every filter, scorer and picker with
weight 1, and one profile without a handler gets `single-profile-handler`.

Strictness is the design goal: a configuration epp would run differently from what it says is a
`ConfigError` at start-up, with the location (`schedulingProfiles[0].plugins[2] (line 14)`) and
the name of the culprit. That covers unknown keys, unknown plugin types and parameters (see
`registry`), undefined or duplicate names, weights on non-scorers, two pickers in a profile and
more than one profile without a disaggregation handler (`disagg-profile-handler`: then
`disagg.handler` builds a `DisaggScheduler` over the profiles).

`saturationDetector: {pluginRef}` names the plugin admission asks how saturated the pool is
(`utilization-detector` or `concurrency-detector`); without the section, a `utilization-detector`
with GIE's defaults is used, as in GIE. A detector is a filter only where a profile lists it: the
implicit `default` profile leaves detectors out.

GIE v1.0-1.3's inline form, `saturationDetector: {queueDepthThreshold, kvCacheUtilThreshold,
metricsStalenessThreshold}`, configures that default detector.

Tokenizers per model, in llm-d's form: a plugin of type `token-producer` (or its older name
`tokenizer`) per model, read by `token_producer` into `SchedulerConfig.tokenizers` (epp's `path`:
a local tokenizer), `render` (llm-d's `vllm` backend: the model servers' /render routes) and
`stand_in` (llm-d's `estimate`). It is not a scheduling plugin (epp tokenizes before scheduling
when a plugin consumes token ids), and a profile may list it (llm-d does) to no effect. Several
need distinct `name`s, as any plugins.

llm-d's `requestHandler.parsers` (and the deprecated top-level `parser`) choose which parser reads a
request by its path; its parser plugin types are read by `request_handler` into
`SchedulerConfig.parsers`.

GIE keys that configure parts epp does not have or does its own way (`featureGates`, `dataLayer`,
`flowControl`) are accepted so that GIE and llm-d configurations load, and each is
reported in `SchedulerConfig.warnings` for the caller to log. So are the plugin types those
sections refer to (`config_compat.GIE_ONLY`), which are ignored rather than built. These sections
are decoded as strictly as plugin parameters: an unknown key or gate, a wrong type, a `pluginRef`
to an undefined plugin or to a plugin of the wrong kind is an error with its line. Plugin types of
features epp lacks (gRPC parsers, admitters, ...) are refused with the reason
(`config_compat.REFUSED`). docs/configs.md lists every type and parameter and what epp does.

llm-d's `precise-prefix-cache-scorer` parameters may say how KV events are consumed
(`kvEventsConfig`): that is `SchedulerConfig.kv_events`, which the caller applies
(`requested_kv_events` reads it before the KV index exists).

This module holds the rules and the loaders; the document's schema and `SchedulerConfig` are
`config_schema`, the building is `config_builder`.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

import msgspec

from epp.scheduling import config_yaml, interfaces, producers, registry
from epp.scheduling.config_builder import Builder
from epp.scheduling.config_schema import (
    API_VERSION,
    API_VERSIONS,
    DEFAULT_DETECTOR,
    DEFAULT_PICKER,
    KIND,
    Document,
    FlowControlSection,
    SchedulerConfig,
)

__all__ = [
    "API_VERSION",
    "API_VERSIONS",
    "DEFAULT_DETECTOR",
    "DEFAULT_PICKER",
    "KIND",
    "ConfigError",
    "FlowControlSection",
    "SchedulerConfig",
    "default_config_text",
    "load_config",
    "load_config_file",
    "requested_kv_events",
]

ConfigError = registry.ConfigError


def default_config_text(*, precise: bool = False) -> str:
    """The YAML used when no configuration is given: `epp/scheduling/default-config.yaml`, or
    `default-precise-config.yaml` when KV events feed an index (`precise`)."""
    name = "default-precise-config.yaml" if precise else "default-config.yaml"
    return importlib.resources.files(__package__).joinpath(name).read_text("utf-8")


requested_kv_events = producers.requested_kv_events


def load_config_file(
    path: str | os.PathLike[str], handle: interfaces.Handle, *, allow_experimental: bool = False
) -> SchedulerConfig:
    """`load_config` on a file's contents; errors are prefixed with the file name."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise ConfigError(f"{os.fspath(path)}: cannot read: {err.strerror}") from None
    try:
        return load_config(text, handle, base_dir=Path(path).parent, allow_experimental=allow_experimental)
    except ConfigError as err:
        raise ConfigError(f"{os.fspath(path)}: {err}") from None


def load_config(
    text: str | None,
    handle: interfaces.Handle,
    *,
    base_dir: Path | None = None,
    allow_experimental: bool = False,
) -> SchedulerConfig:
    """Build the scheduler from EndpointPickerConfig YAML; `None` means the default configuration
    (the precise one when `handle` has a KV index). Relative tokenizer paths are taken from
    `base_dir` (default: the working directory). llm-d's Alpha plugin types are refused unless
    `allow_experimental` (`--allow-experimental-plugins`), as llm-d refuses them."""
    if text is None:
        text = default_config_text(precise=handle.kv_index is not None)
    root, data = config_yaml.parse(text)
    where = config_yaml.Locator(root, KIND, Document.__struct_fields__)
    if not isinstance(data, dict):
        raise ConfigError(f"the configuration must be a YAML mapping (an {KIND}), got {type(data).__name__}")
    try:
        doc = msgspec.convert(data, Document)
    except msgspec.ValidationError as err:
        raise where.validation_error(err) from None
    for key, value, expected in (("apiVersion", doc.apiVersion, API_VERSIONS), ("kind", doc.kind, (KIND,))):
        if key not in data:
            raise ConfigError(f"{key} is missing; expected {key}: {' or '.join(expected)}")
        if value not in expected:
            raise where.error((key,), f"expected {' or '.join(map(repr, expected))}, got {value!r}")
    return Builder(doc, where, handle, base_dir or Path(), allow_experimental).build()
