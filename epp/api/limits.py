"""epp's own limits on the shape of a request body, checked before any expensive step.

vLLM has no such limits: it renders whatever list of messages it is given. epp renders and
tokenizes chat bodies itself, on the request path, so one body of 200,000 tiny messages costs it
half a second of CPU; these limits bound that work. Their defaults sit far above what a legitimate
request carries (an agent's longest conversations have a few thousand messages; OpenAI's own API
takes fewer), and each is a flag of `epp serve` (docs/security.md#request-limits). A body over
a limit is answered 400 naming the limit and the flag.

    max_messages        chat `messages`, Responses `input` items
    max_content_parts   content parts in the whole body (all messages together)
    max_tools           chat `tools`
    max_json_depth      nesting of arrays and objects anywhere in the body (the body itself is 1)

The depth limit also keeps every recursive step (msgspec's decoder, the chat template's `tojson`,
json.loads of tool-call arguments) far below Python's recursion limit, which a body nested ~1,000
deep reached (a 500 before these limits). It is checked where the body is decoded generically
(`decode_body`), which only chat rendering needs; the typed decode of `parse_request` skips the
fields it does not read, and a recursion error there is answered 400 too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import msgspec

from epp.api.errors import BadRequest

# msgspec's decoders and json recurse: a depth near Python's recursion limit (1,000) fails
# wherever the call stack already is. The flag is capped well below it.
MAX_JSON_DEPTH_CAP = 512


@dataclasses.dataclass(frozen=True, slots=True)
class RequestLimits:
    max_messages: int = 10_000
    max_content_parts: int = 20_000
    max_tools: int = 2_000
    max_json_depth: int = 64

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 1:
                raise ValueError(f"{field.name} must be at least 1")
        if self.max_json_depth > MAX_JSON_DEPTH_CAP:
            raise ValueError(f"max_json_depth must be at most {MAX_JSON_DEPTH_CAP}")


DEFAULT_LIMITS = RequestLimits()

# Flag names, for the messages (the flags are defined in epp.flags.request_limits).
FLAGS = {
    "max_messages": "--max-request-messages",
    "max_content_parts": "--max-request-content-parts",
    "max_tools": "--max-request-tools",
    "max_json_depth": "--max-request-json-depth",
}


def over(what: str, count: int, limits: RequestLimits, field: str) -> BadRequest:
    limit = getattr(limits, field)
    return BadRequest(f"{what}: {count} exceeds epp's limit of {limit} ({FLAGS[field]})")


def too_deep(limits: RequestLimits) -> BadRequest:
    return BadRequest(
        f"request body is nested more than {limits.max_json_depth} levels deep "
        f"(epp's limit, {FLAGS['max_json_depth']})"
    )


def check_depth(obj: Any, limits: RequestLimits) -> None:
    """Raise `BadRequest` if arrays and objects in `obj` (decoded JSON) nest deeper than the limit.

    Iterative (no recursion), and it visits containers only: strings and numbers, the bulk of a
    large body, are skipped by a type test. ~0.1 us per container."""
    limit = limits.max_json_depth
    stack: list[tuple[Any, int]] = [(obj, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        value, depth = pop()
        if depth > limit:
            raise too_deep(limits)
        children = value.values() if isinstance(value, dict) else value
        for child in children:
            if isinstance(child, (dict, list)):
                push((child, depth + 1))


# Python's json.loads reads 1e400 as inf and NaN-free JSON otherwise; msgspec refuses numbers out
# of a float's range when decoding untyped, so floats come in through this hook (vLLM's server,
# reading the body with the json module, accepts them in fields it ignores).
_GENERIC = msgspec.json.Decoder(float_hook=float)


@dataclasses.dataclass(frozen=True, slots=True)
class KnownStrings:
    """Long chat message contents `parse_request` decoded already (epp/api/_jsonstr.c), and where
    their JSON strings lie in `body`, for `decode_body` to skip: (message index, start, end,
    text) each, in body order."""

    body: bytes
    spans: tuple[tuple[int, int, int, str], ...]


def decode_body(body: bytes, limits: RequestLimits, known: KnownStrings | None = None) -> Mapping[str, Any]:
    """The body as plain Python objects, for chat rendering: depth-checked, every failure a 400.

    `parse_request` has validated the body's JSON already, so what is left to fail here is depth
    and numbers; the result is a dict (parse_request refused anything else). With `known` (of this
    very body), the long contents parse_request decoded are not decoded again: msgspec grows its
    buffer for a string with escapes one realloc at a time, 0.45 ms for a 100k-token chat's system
    prompt here, twice per request with the parse's own decode."""
    if known is not None and known.body is body:
        spliced = _spliced(body, known, limits)
        if spliced is not None:
            return spliced
    try:
        obj = _GENERIC.decode(body)
    except RecursionError:
        raise too_deep(limits) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise BadRequest(" ".join(f"invalid JSON in request body: {e}".split())) from None
    if not isinstance(obj, dict):
        raise BadRequest("request body must be a JSON object")
    check_depth(obj, limits)
    return obj


def _spliced(body: bytes, known: KnownStrings, limits: RequestLimits) -> dict[str, Any] | None:
    """`decode_body` of `body` with each known string decoded as "" and then set to its text; None
    wherever the result might differ from a whole decode (which then answers, errors included)."""
    pieces: list[bytes] = []
    last = 0
    for _, start, end, _ in known.spans:
        pieces.append(body[last:start])
        pieces.append(b'""')
        last = end
    pieces.append(body[last:])
    try:
        obj: Any = _GENERIC.decode(b"".join(pieces))
    except (RecursionError, msgspec.DecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    messages = obj.get("messages")
    if not isinstance(messages, list):
        return None
    for i, _, _, _ in known.spans:
        # A duplicate "content" key (the last one wins in both decodes) would leave another value.
        message = messages[i] if i < len(messages) else None
        if not isinstance(message, dict) or message.get("content") != "":
            return None
    for i, _, _, text in known.spans:
        messages[i]["content"] = text
    check_depth(obj, limits)
    return obj
