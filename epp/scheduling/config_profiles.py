"""The `schedulingProfiles` of an EndpointPickerConfig built into `framework.Profile`s, with GIE's
defaults: no profiles means one `default` profile of every filter, scorer and picker in plugin
order (weight 1, saturation detectors left out); a profile without a picker gets the default
picker; a scorer without a weight gets 1. Every mistake is a `ConfigError` at its line: an
undefined reference, a plugin listed twice, a weight on a non-scorer or not finite, two pickers,
and plugins that are not scheduling plugins (producers, data-layer, flow-control and accepted
GIE-only plugins: the caller says why each may not be listed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from epp.scheduling import config_yaml, framework, interfaces, producers

# One profile as the document gives it: (name, [(pluginRef, weight or None)]).
ProfileSpec = tuple[str, Sequence[tuple[str, float | None]]]
_Entry = tuple[config_yaml.Path, str, float | None]


def is_scheduling(plugin: interfaces.Plugin) -> bool:
    """A filter, scorer or picker (a producer is scorer-shaped, and is not one)."""
    return not producers.is_producer(plugin) and isinstance(
        plugin, interfaces.Filter | interfaces.Scorer | interfaces.Picker
    )


def build(
    specs: Sequence[ProfileSpec],
    plugin_names: Sequence[str],
    plugins: Mapping[str, interfaces.Plugin],
    elsewhere: Callable[[str], str | None],
    where: config_yaml.Locator,
    default_picker: Callable[[], interfaces.Picker],
) -> tuple[list[framework.Profile], set[str]]:
    """(profiles, names of the plugins they use). `elsewhere(ref)` says why a plugin that is not
    built as a scheduling plugin may not be in a profile ("": skip it; None: not such a plugin)."""
    used: set[str] = set()
    if not specs:
        entries: list[_Entry] = [
            (("plugins", i), name, None)
            for i, name in enumerate(plugin_names)
            if name in plugins
            and is_scheduling(plugins[name])
            and not isinstance(plugins[name], interfaces.SaturationDetector)
        ]
        return [_profile("default", entries, plugins, elsewhere, where, default_picker, used)], used
    profiles: list[framework.Profile] = []
    for i, (name, refs) in enumerate(specs):
        path: config_yaml.Path = ("schedulingProfiles", i)
        if not name:
            raise where.error(path, "profile name is empty")
        if any(p.name == name for p in profiles):
            raise where.error(path, f"duplicate profile name {name!r}")
        entries = [((*path, "plugins", j), ref, weight) for j, (ref, weight) in enumerate(refs)]
        profiles.append(_profile(name, entries, plugins, elsewhere, where, default_picker, used))
    return profiles, used


def _profile(
    name: str,
    entries: Sequence[_Entry],
    plugins: Mapping[str, interfaces.Plugin],
    elsewhere: Callable[[str], str | None],
    where: config_yaml.Locator,
    default_picker: Callable[[], interfaces.Picker],
    used: set[str],
) -> framework.Profile:
    filters: list[interfaces.Filter] = []
    scorers: list[tuple[interfaces.Scorer, float]] = []
    picker: interfaces.Picker | None = None
    seen: set[str] = set()
    for path, ref, weight in entries:
        plugin = plugins.get(ref)
        if plugin is None:
            why = elsewhere(ref)
            if why == "":
                continue
            raise where.error(path, why if why is not None else f"pluginRef {ref!r} is not a defined plugin")
        label = f"plugin {ref!r} (type {plugin.type!r})"
        if ref in seen:
            raise where.error(path, f"{label} is listed twice in profile {name!r}")
        seen.add(ref)
        if producers.is_producer(plugin):
            raise where.error(
                path,
                f"{label} is a data producer, not a filter, scorer or picker: list a "
                f"prefix-cache-scorer with prefixMatchInfoProducerName: {ref} instead",
            )
        if not is_scheduling(plugin):
            raise where.error(path, f"{label} is not a filter, scorer or picker")
        if weight is not None and not isinstance(plugin, interfaces.Scorer):
            raise where.error(path, f"{label} has a weight but is not a scorer")
        if weight is not None and not math.isfinite(weight):
            raise where.error(path, f"{label} has weight {weight}; a weight must be finite")
        if isinstance(plugin, interfaces.Filter):
            filters.append(plugin)
        if isinstance(plugin, interfaces.Scorer):
            scorers.append((plugin, 1.0 if weight is None else weight))
        if isinstance(plugin, interfaces.Picker):
            if picker is not None:
                raise where.error(
                    path, f"{label}: profile {name!r} already has picker {picker.name!r}, one is allowed"
                )
            picker = plugin
        used.add(ref)
    return framework.Profile(name, filters, scorers, picker or default_picker())
