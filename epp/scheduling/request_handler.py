"""llm-d's `requestHandler.parsers` section and its parser plugin types, read as llm-d Router v0.10
reads them (its config loader's ensureParsers / buildParserRegistry), into an
`epp.api.routes.Parsers` resolution table.

    plugins:
    - {name: oa, type: openai-parser}
    requestHandler:
      parsers:
      - pluginRef: oa
      - pluginRef: passthrough-parser     # a type name: an instance of it, named after it

- Parser plugins take no parameters. A `pluginRef` names a declared parser plugin, or, as in
  llm-d, a parser type (an instance named after the type is implied).
- No list (or an empty one): llm-d's default, openai-parser, anthropic-parser, vllmhttp-parser,
  then passthrough-parser. A list is used as given: a path no listed parser claims is refused with
  400 unless it ends with a fallback (passthrough-parser); a second parser of a listed type and
  any parser after the fallback are skipped with a warning, as llm-d skips them.
- The deprecated top-level `parser: {pluginRef}` stands for a one-parser list when the section
  lists none (llm-d's rule), with a warning.
- Parsers epp cannot build are refused at start-up with the reason (`REFUSED`): vllmgrpc-parser
  and vertexai-parser (gRPC request protocols; epp's data path reads HTTP bodies),
  sglanghttp-parser (SGLang's native /generate and its `meta_info` usage).

`Collector` gathers the parser plugins while `epp.scheduling.config` walks the plugin list, then
`build` resolves the section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from epp.api.routes import PARSER_TYPES, Parser, Parsers

REFUSED = {
    "vllmgrpc-parser": (
        "vLLM's gRPC API is not supported: epp's data path reads HTTP request bodies (use vLLM's "
        "HTTP routes with openai-parser and vllmhttp-parser)"
    ),
    "vertexai-parser": (
        "Vertex AI's gRPC PredictionService is not supported: epp's data path reads HTTP request "
        "bodies (use openai-parser for OpenAI-compatible routes)"
    ),
    "sglanghttp-parser": (
        "SGLang's native /generate is not supported (its input_ids body and meta_info usage); use "
        "SGLang's OpenAI-compatible routes with openai-parser"
    ),
}


def is_parser_type(type_name: str) -> bool:
    return type_name in PARSER_TYPES or type_name in REFUSED


class Ref(msgspec.Struct, forbid_unknown_fields=True):
    pluginRef: str = ""


class Section(msgspec.Struct, forbid_unknown_fields=True):
    """`requestHandler`: llm-d's request-handling settings (its parsers)."""

    parsers: list[Ref] = []


Path = tuple[str | int, ...]
ErrorAt = Callable[[Path, str], Exception]


class Collector:
    """The parser plugins of one configuration, by name, as the plugin list declares them."""

    def __init__(self, error_at: ErrorAt) -> None:
        self._error_at = error_at
        self.types: dict[str, str] = {}  # name -> type
        self.warnings: list[str] = []

    def __contains__(self, name: str) -> bool:
        return name in self.types

    def add(self, path: Path, name: str, type_name: str, parameters: dict[str, Any] | None) -> None:
        refused = REFUSED.get(type_name)
        if refused is not None:
            raise self._error_at(path, f"plugin {name!r} (type {type_name!r}) is not supported: {refused}")
        if parameters:
            raise self._error_at(
                (*path, "parameters"), f"plugin {name!r} (type {type_name!r}) takes no parameters"
            )
        self.types[name] = type_name

    def build(self, section: Section | None, legacy: Ref | None) -> Parsers:
        """The parsers the configuration asks for (module docstring). Raises via `error_at`."""
        refs: list[tuple[Path, str]] = []
        if section is not None and section.parsers:
            refs = [
                (("requestHandler", "parsers", i, "pluginRef"), r.pluginRef)
                for i, r in enumerate(section.parsers)
            ]
        elif legacy is not None:
            self.warnings.append("the top-level `parser` is deprecated: use requestHandler.parsers")
            refs = [(("parser", "pluginRef"), legacy.pluginRef)]
        if not refs:
            return Parsers.default()
        parsers: list[Parser] = []
        for path, ref in refs:
            type_name = self.types.get(ref)
            if type_name is None:
                if ref in REFUSED:
                    raise self._error_at(path, f"parser {ref!r} is not supported: {REFUSED[ref]}")
                if ref not in PARSER_TYPES:
                    known = ", ".join(PARSER_TYPES)
                    raise self._error_at(
                        path, f"pluginRef {ref!r} is neither a parser plugin nor a parser type ({known})"
                    )
                type_name = ref  # llm-d instantiates the type under its own name
            parsers.append(Parser(ref, type_name))
        built = Parsers(parsers)
        self.warnings.extend(built.warnings)
        return built

    def not_a_parser(self, path: Path, ref: str, what: str) -> Exception:
        """The error for a parser plugin named where a plugin of another kind is wanted."""
        return self._error_at(path, f"plugin {ref!r} (type {self.types[ref]!r}) is a parser, not {what}: "
                              "list it in requestHandler.parsers")  # fmt: skip
