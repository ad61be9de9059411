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


def decode_body(body: bytes, limits: RequestLimits) -> Mapping[str, Any]:
    """The body as plain Python objects, for chat rendering: depth-checked, every failure a 400.

    `parse_request` has validated the body's JSON already, so what is left to fail here is depth
    and numbers; the result is a dict (parse_request refused anything else)."""
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
