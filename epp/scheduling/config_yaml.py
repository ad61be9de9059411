"""The EndpointPickerConfig document as YAML: parsed with its line numbers kept, and every error
located in it (`plugins[2].parameters.blockSize (line 9): ...`).

`parse` returns the node tree and the plain data; `Locator` turns a path into the document
(`("plugins", 2, "type")`) into the line it starts on, and a msgspec validation error into a
`ConfigError` at the offending key. Duplicate keys are refused: PyYAML would keep the last one
silently, and a repeated `plugins:` would drop the first list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import yaml

from epp.scheduling.registry import ConfigError

Path = tuple[str | int, ...]
"""A place in the document: mapping keys and sequence indexes, outermost first."""

_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<at>.*)`)?$", re.DOTALL)
STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
"""One step of msgspec's `$.a[0].b` location syntax."""
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>.*)`$")


def parse(text: str) -> tuple[yaml.Node, Any]:
    """(node tree, plain data). The node tree keeps line numbers for later error messages."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise ConfigError("the configuration is empty")
        _reject_duplicate_keys(root)
        return root, loader.construct_document(root)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"invalid YAML{at}: {problem}") from None
    finally:
        loader.dispose()


def _reject_duplicate_keys(node: yaml.Node) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise ConfigError(f"duplicate key {key.value!r} at line {key.start_mark.line + 1}")
                seen.add(key.value)
            _reject_duplicate_keys(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _reject_duplicate_keys(item)


def steps(location: str) -> list[str | int]:
    """msgspec's `$.a[0].b` (without the `$`) as path steps."""
    return [key or int(index) for key, index in STEP.findall(location)]


class Locator:
    """Turns a path in the document into `plugins[2].type (line 9)` for error messages.

    `kind` names the document in messages ("an EndpointPickerConfig has: ..."), `top_keys` are
    the keys its top level may have."""

    def __init__(self, root: yaml.Node, kind: str, top_keys: Sequence[str]) -> None:
        self._root = root
        self._kind = kind
        self._top_keys = tuple(top_keys)

    def line(self, path: Path) -> int:
        """Line of the deepest node along `path` (a mapping entry's line is its key's)."""
        node: yaml.Node = self._root
        line = node.start_mark.line
        for step in path:
            if isinstance(node, yaml.MappingNode) and isinstance(step, str):
                entry = next((kv for kv in node.value if kv[0].value == step), None)
                if entry is None:
                    break
                line, node = entry[0].start_mark.line, entry[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
                node = node.value[step]
                line = node.start_mark.line
            else:
                break
        return line + 1

    @staticmethod
    def dotted(path: Path) -> str:
        return "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path).lstrip(".")

    def error(self, path: Path, message: str) -> ConfigError:
        return ConfigError(f"{self.dotted(path)} (line {self.line(path)}): {message}")

    def validation_error(
        self, err: msgspec.ValidationError, *, prefix: Path = (), known: Sequence[str] = ()
    ) -> ConfigError:
        """`err` located in the document; `prefix` is where the decoded part sits (the whole
        document by default), `known` its keys, named when an unknown key is found."""
        match = _AT.match(str(err))
        assert match is not None  # the pattern matches any string
        problem, at = match["problem"], match["at"] or ""
        path: list[str | int] = [*prefix, *steps(at)]
        unknown = _UNKNOWN.match(problem)
        if unknown is not None:
            path.append(unknown["key"])
            problem = f"unknown key {unknown['key']!r}"
            if len(path) == 1:
                problem += f"; an {self._kind} has: {', '.join(self._top_keys)}"
            elif known:
                problem += f"; known keys: {', '.join(known)}"
        if not path:
            return ConfigError(f"invalid {self._kind}: {problem}")
        return self.error(tuple(path), problem)


def culprit(path: Path, parameters: Mapping[str, Any] | None, message: str) -> Path:
    """Where in a plugin an error message points (msgspec's `at `$.a[0].b``, an unknown field, or
    `parameter a.b`), so that its line is the one reported; else the plugin at `path`."""
    if not parameters:
        return path
    found: list[str | int] = []
    at = re.search(r"at `\$(?P<at>[^`]*)`", message)
    if at is not None:
        found = steps(at["at"])
    unknown = re.search(r"unknown field `([^`]+)`", message)
    if unknown is not None:
        found.append(unknown[1])
    if not found:
        named = re.search(r"parameters?[. ]([A-Za-z][\w.]*)", message)
        if named is None:
            return path
        found = list(named[1].split("."))
    return (*path, "parameters", *found)
