"""llm-d Router's flag for the EndpointPickerConfig's plugins: `--allow-experimental-plugins`.

llm-d registers each plugin type with a stability level and refuses to start with an Alpha one
unless this flag is given (`ValidatePluginStability`); epp keeps the same list of llm-d's Alpha
types (`epp.scheduling.catalog`) and refuses them alike, naming the plugin and its line.
"""

from __future__ import annotations

import argparse

from epp.flags.types import go_bool


def add_plugin_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plugins")
    go_bool(
        g,
        "allow-experimental-plugins",
        default=False,
        help="allow llm-d's Alpha plugin types in the config (default false: they are a startup "
        "error, as in llm-d; docs/configs.md lists them)",
    )
