"""Which parser reads a request: llm-d Router v0.10's parser registry, by the request's path.

A parser (a plugin type of llm-d's `requestHandler.parsers`) claims path suffixes. A request goes
to the parser claiming the longest suffix its path ends with, else to the fallback (the first
listed parser that claims nothing: `passthrough-parser`), else it is refused with 400. The path is
matched as llm-d matches it (`MatchPathSuffix`): the query cut off, a trailing "/" ignored, and a
plain string suffix, so "messages" also claims "/v1/foomessages".

    parser              claims (suffix -> API)
    openai-parser       chat/completions, completions, embeddings, responses, conversations,
                        images/generations, chat/completions/render, completions/render,
                        responses/render (epp's: llm-d passes it through)
    anthropic-parser    messages, messages/count_tokens, messages/render (epp's, as above)
    vllmhttp-parser     inference/v1/generate (vLLM's tokens-in API)
    passthrough-parser  nothing: every path no other parser claims, forwarded unparsed

Without a `requestHandler.parsers` list, llm-d's default applies: openai, anthropic, vllmhttp,
then passthrough, so an unknown path is routed on load alone, never refused. An explicit list is
used as given (no implied fallback), with llm-d's rules: a second parser of a type already listed
is skipped, and so is every parser after the first fallback (both with a warning).

A `/render` route has its parent's body; vLLM renders it and runs no engine, and neither does
`messages/count_tokens` (`Route.runs_engine`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence

from epp.api.errors import BadRequest


class Api(enum.Enum):
    COMPLETIONS = "completions"
    CHAT = "chat/completions"
    RESPONSES = "responses"
    EMBEDDINGS = "embeddings"
    CONVERSATIONS = "conversations"
    IMAGES = "images/generations"
    MESSAGES = "messages"  # Anthropic's Messages API
    COUNT_TOKENS = "messages/count_tokens"  # Anthropic's token counting
    GENERATE = "inference/v1/generate"  # vLLM's tokens-in API
    PASSTHROUGH = "passthrough"  # no parser read the body: routed on load alone
    OTHER = "other"  # header-only requests (GET /v1/models): nothing to parse


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    api: Api
    render: bool = False  # a /render route: the body of `api`, rendered, no engine run
    parser: str = ""  # the name of the parser plugin that claimed it

    @property
    def runs_engine(self) -> bool:
        """Whether the model server feeds this request to its engine (and so caches its KV
        blocks): not for a render, a token count, or a body nobody parsed."""
        return not self.render and self.api not in _NO_ENGINE


_NO_ENGINE = frozenset((Api.COUNT_TOKENS, Api.PASSTHROUGH, Api.OTHER))

OPENAI = "openai-parser"
ANTHROPIC = "anthropic-parser"
VLLM_HTTP = "vllmhttp-parser"
PASSTHROUGH = "passthrough-parser"

# What each parser type claims: suffix -> (API, render).
CLAIMS: Mapping[str, Mapping[str, tuple[Api, bool]]] = {
    OPENAI: {
        "chat/completions": (Api.CHAT, False),
        "completions": (Api.COMPLETIONS, False),
        "embeddings": (Api.EMBEDDINGS, False),
        "responses": (Api.RESPONSES, False),
        "conversations": (Api.CONVERSATIONS, False),
        "images/generations": (Api.IMAGES, False),
        "chat/completions/render": (Api.CHAT, True),
        "completions/render": (Api.COMPLETIONS, True),
        "responses/render": (Api.RESPONSES, True),
    },
    ANTHROPIC: {
        "messages": (Api.MESSAGES, False),
        "messages/count_tokens": (Api.COUNT_TOKENS, False),
        "messages/render": (Api.MESSAGES, True),
    },
    VLLM_HTTP: {"inference/v1/generate": (Api.GENERATE, False)},
    PASSTHROUGH: {},
}
PARSER_TYPES = tuple(CLAIMS)
# llm-d's parsers when a configuration lists none (its loader's ensureParsers).
DEFAULT_PARSERS = (OPENAI, ANTHROPIC, VLLM_HTTP, PASSTHROUGH)


@dataclasses.dataclass(frozen=True, slots=True)
class Parser:
    name: str
    type: str


class Parsers:
    """The resolution table of one configuration's parsers (see the module docstring)."""

    def __init__(self, parsers: Sequence[Parser]) -> None:
        self.warnings: list[str] = []
        self.active: list[Parser] = []
        self._fallback: Parser | None = None
        claims: dict[str, Route] = {}
        seen: set[str] = set()
        for i, parser in enumerate(parsers):
            if parser.type not in CLAIMS:
                raise ValueError(f"unknown parser type {parser.type!r}")
            if parser.type in seen:
                self.warnings.append(
                    f"parser {parser.name!r} is skipped: a parser of type {parser.type!r} is already listed"
                )
                continue
            seen.add(parser.type)
            self.active.append(parser)
            claimed = CLAIMS[parser.type]
            if not claimed:
                self._fallback = parser
                for skipped in parsers[i + 1 :]:
                    self.warnings.append(
                        f"parser {skipped.name!r} is skipped: it comes after the fallback parser "
                        f"{parser.name!r}, which takes every path the others do not claim"
                    )
                break
            for suffix, (api, render) in claimed.items():
                claims[suffix] = Route(api, render, parser.name)
        # Longest first: the first suffix a path ends with is the longest it matches.
        self._claims = sorted(claims.items(), key=lambda kv: -len(kv[0]))

    @classmethod
    def default(cls) -> Parsers:
        return cls([Parser(t, t) for t in DEFAULT_PARSERS])

    @property
    def types(self) -> frozenset[str]:
        return frozenset(p.type for p in self.active)

    def resolve(self, path: str) -> Route:
        """The route of a request with a body to `path`. Raises `BadRequest` when no parser
        claims the path and none is the fallback (llm-d answers 400 too)."""
        clean = path.partition("?")[0].partition("#")[0].strip().rstrip("/")
        for suffix, route in self._claims:
            if clean.endswith(suffix):
                return route
        if self._fallback is not None:
            return Route(Api.PASSTHROUGH, parser=self._fallback.name)
        raise BadRequest(f"no parser registered matching path suffix for: {clean or '/'}")

    def describe(self) -> str:
        return ", ".join(f"{p.name} ({p.type})" if p.name != p.type else p.name for p in self.active)


DEFAULT = Parsers.default()


def api_for_path(path: str, parsers: Parsers = DEFAULT) -> Api:
    """The API a body-carrying request to `path` targets under `parsers` (PASSTHROUGH when only
    the fallback takes it). Raises `BadRequest` as `Parsers.resolve`."""
    return parsers.resolve(path).api


def claimed_suffixes(types: Iterable[str]) -> list[str]:
    """Every suffix the parser types claim (for docs and messages)."""
    return sorted({suffix for t in types for suffix in CLAIMS.get(t, {})})
