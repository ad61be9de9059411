"""Request bodies of the non-OpenAI routes: Anthropic's Messages (and count_tokens), vLLM's
tokens-in `/inference/v1/generate`, and llm-d's minimal reads of conversations and image
generation. Used by `epp.api.requests.parse_request`, which dispatches on the route.

What is read here is what routing needs (model, stream, the prompt's size, the output budget, the
salt, token ids given) and what vLLM's request model refuses before anything renders (400, in
OpenAI's error shape, as FastAPI's validation handler answers on every route). The rest of an
Anthropic body is validated where it is rendered (`epp.tokenize.anthropic`).

`/inference/v1/generate` (vLLM 0.32's `GenerateRequest`): `token_ids` a non-empty list of
non-negative integers (read as pydantic reads integers: "5" and true are 5 and 1),
`sampling_params` an object, `model` optional, `cache_salt` as chat's (1-128 characters, no '@',
'/', '\\', NUL). The ids are the prompt as they are, unless `content_parts` asks vLLM to expand
media placeholders into them (then routed without ids). vLLM's own checks of the sampling
parameters are its to answer.
"""

from __future__ import annotations

from typing import Any

import msgspec

from epp.api.errors import BadRequest
from epp.lax import lax_bool, lax_int

_INT64 = (-(1 << 63), (1 << 63) - 1)


class _Block(msgspec.Struct):
    type: Any = None
    text: Any = None
    thinking: Any = None
    content: Any = None  # a tool_result's: a string or a list of objects


class _Message(msgspec.Struct):
    role: Any = None
    content: str | list[_Block] | None = None


class MessagesBody(msgspec.Struct):
    """Anthropic's Messages body: the fields routing reads; blocks must be objects."""

    model: Any = None
    messages: list[_Message] | None = None
    system: str | list[_Block] | None = None
    max_tokens: Any = None
    stream: Any = None
    cache_salt: Any = None


class GenerateBody(msgspec.Struct):
    model: Any = None
    token_ids: Any = None
    sampling_params: Any = None
    stream: Any = None
    cache_salt: Any = None
    content_parts: Any = None


class ConversationsBody(msgspec.Struct):
    model: Any = None
    items: Any = None


class ImagesBody(msgspec.Struct):
    model: Any = None
    prompt: Any = None
    stream: Any = None


MESSAGES_DECODER = msgspec.json.Decoder(MessagesBody)
GENERATE_DECODER = msgspec.json.Decoder(GenerateBody)
CONVERSATIONS_DECODER = msgspec.json.Decoder(ConversationsBody)
IMAGES_DECODER = msgspec.json.Decoder(ImagesBody)


def clamp64(n: int) -> int:
    return min(max(n, _INT64[0]), _INT64[1])


def anthropic_texts(body: MessagesBody) -> list[str]:
    """The prompt's texts (for the size estimate): system, string contents, block texts."""
    out: list[str] = []
    _texts(body.system, out)
    for msg in body.messages or ():
        _texts(msg.content, out)
    return out


def _texts(content: str | list[_Block] | None, out: list[str]) -> None:
    if isinstance(content, str):
        out.append(content)
        return
    for block in content or ():
        for value in (block.text, block.thinking, block.content):
            if isinstance(value, str):
                out.append(value)


def check_messages(body: MessagesBody, *, count_tokens: bool) -> tuple[str, int | None, bool]:
    """(model, max_tokens, stream) of an Anthropic body, refusing what vLLM's request model
    refuses among them. Raises `BadRequest`."""
    if body.model is None:
        raise BadRequest("model: field required")
    if not isinstance(body.model, str):
        raise BadRequest("model: must be a string")
    if not body.model:
        raise BadRequest("model: Model is required")
    if body.messages is None:
        raise BadRequest("messages: field required")
    max_tokens = None
    if not count_tokens:
        if body.max_tokens is None:
            raise BadRequest("max_tokens: field required")
        max_tokens = lax_int(body.max_tokens)
        if max_tokens is None:
            raise BadRequest("max_tokens: must be an integer")
        if max_tokens <= 0:
            raise BadRequest("max_tokens: max_tokens must be positive")
        max_tokens = clamp64(max_tokens)
    stream = False
    if not count_tokens and body.stream is not None:
        read = lax_bool(body.stream)
        if read is None:
            raise BadRequest("stream: must be a boolean")
        stream = read
    return body.model, max_tokens, stream


def generate_ids(body: GenerateBody) -> list[int]:
    """`token_ids` as vLLM's GenerateRequest reads them. Raises `BadRequest`."""
    raw = body.token_ids
    if raw is None:
        raise BadRequest("token_ids: field required")
    if not isinstance(raw, list):
        raise BadRequest("token_ids: must be a list of integers")
    if not raw:
        raise BadRequest("token_ids: List should have at least 1 item after validation, not 0")
    ids: list[int] = []
    for i, value in enumerate(raw):
        n = value if type(value) is int else lax_int(value)
        if n is None:
            raise BadRequest(f"token_ids[{i}]: must be an integer")
        if n < 0:
            raise BadRequest("token_ids: token_ids must not contain negative values")
        ids.append(n)
    return ids


def generate_budget(body: GenerateBody) -> int | None:
    """sampling_params.max_tokens, for the record; vLLM does not refuse a large one here."""
    params = body.sampling_params
    if params is None:
        raise BadRequest("sampling_params: field required")
    if not isinstance(params, dict):
        raise BadRequest("sampling_params: Input should be a valid dictionary")
    value = params.get("max_tokens")
    n = lax_int(value) if value is not None else None
    return None if n is None else clamp64(n)
