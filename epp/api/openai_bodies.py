"""The OpenAI-style bodies (chat, completions, embeddings, Responses, and their /render twins):
their shapes, decoded with msgspec, and what `parse_request` (`epp.api.requests`) fills in from
them. The other routes' bodies are in `epp.api.other_bodies`.

Polymorphic prompts (`prompt`, embeddings `input`: string | strings | token ids | token-id lists)
are captured as `msgspec.Raw` (a zero-copy slice of the body) and then decoded by the one decoder
matching the first significant byte. msgspec unions may hold only one array type, and checking a
decoded `list[str | int | list[int]]` for homogeneity element by element in Python costs 18-30 ns
per token id here; decoding the raw slice as `list[int]` validates it in C instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from epp.api import _jsonstr
from epp.api import limits as _limits
from epp.api.errors import BadRequest, one_line
from epp.api.limits import RequestLimits
from epp.api.routes import Api
from epp.lax import lax_int

if TYPE_CHECKING:
    from epp.api.requests import InferenceRequest


# --- Body shapes: only the fields we read. Unknown fields are skipped by msgspec. ---------------


class _Part(msgspec.Struct):
    """A content part: {"type": "text"|"input_text"|"output_text", "text": ...}; others have no text."""

    text: str | None = None


class _Message(msgspec.Struct):
    role: str
    # Kept raw: a string (the usual, and the long one) is decoded by `_string`, anything else by
    # `_CONTENT_DECODER` (`_content`). Parts may be bare strings (vLLM takes them as text). Absent
    # (empty) and null differ: vLLM takes a message without content as an empty one, but null
    # only on an assistant message.
    content: msgspec.Raw = msgspec.Raw()


class _Item(msgspec.Struct):
    """A Responses API input item: a message, a function_call_output, a reasoning item, ..."""

    content: str | list[_Part] | None = None
    # function_call_output.output is a string or a list of parts depending on the API version, and
    # other item types use `output` differently, so it is kept raw and only a string is counted.
    output: msgspec.Raw = msgspec.Raw()


class _Body(msgspec.Struct):
    model: str | None = None
    stream: bool | None = None  # some clients send null
    cache_salt: str | None = None


class _LengthFields(_Body):
    """vLLM's length parameters (chat and completions). Any: a value of the wrong type is vLLM's
    to refuse, with its own message; epp reads only integers (`_integer`)."""

    max_tokens: Any = None
    truncate_prompt_tokens: Any = None
    truncation_side: Any = None


class _ChatBody(_LengthFields):
    max_completion_tokens: Any = None  # wins over max_tokens when given (vLLM's build_tok_params)
    messages: list[_Message] | None = None
    tools: list[msgspec.Raw] | None = None  # validated as a list, otherwise left to the template step


class _CompletionsBody(_LengthFields):
    add_special_tokens: Any = None  # vLLM's extension; lax like pydantic: see _special_tokens
    prompt_embeds: msgspec.Raw = msgspec.Raw()  # vLLM's extension: only its presence is read
    prompt: msgspec.Raw = msgspec.Raw()  # empty when absent


class _ResponsesBody(_Body):
    input: str | list[_Item] | None = None
    instructions: str | None = None
    max_output_tokens: Any = None  # lax like pydantic (vLLM refuses what is not an integer)
    truncation: Any = "disabled"  # anything but "disabled" (null too) keeps the prompt's tail


class _EmbeddingsBody(_Body):
    input: msgspec.Raw = msgspec.Raw()  # empty when absent
    add_special_tokens: Any = None


_CHAT_DECODER = msgspec.json.Decoder(_ChatBody)
_COMPLETIONS_DECODER = msgspec.json.Decoder(_CompletionsBody)
_RESPONSES_DECODER = msgspec.json.Decoder(_ResponsesBody)
_EMBEDDINGS_DECODER = msgspec.json.Decoder(_EmbeddingsBody)

# A token id must fit the int64 every consumer packs it into (block hashes, digests). vLLM refuses
# such ids too (out of its vocabulary); without the bound one crashed a scorer (a 500).
_TokenId = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]

_STR_DECODER = msgspec.json.Decoder(str)
_CONTENT_DECODER = msgspec.json.Decoder(str | list[_Part | str] | None)
_STRS_DECODER = msgspec.json.Decoder(list[str])
_IDS_DECODER = msgspec.json.Decoder(list[_TokenId])
_ID_LISTS_DECODER = msgspec.json.Decoder(list[list[_TokenId]])

_DECODERS: dict[Api, msgspec.json.Decoder[Any]] = {
    Api.CHAT: _CHAT_DECODER,
    Api.COMPLETIONS: _COMPLETIONS_DECODER,
    Api.RESPONSES: _RESPONSES_DECODER,
    Api.EMBEDDINGS: _EMBEDDINGS_DECODER,
}

_JSON_WS = frozenset(b" \t\r\n")

# A string field decoded again from its Raw slice (already parsed as JSON by the body's decode)
# can fail only on invalid UTF-8: msgspec <= 0.22 lets the codec's UnicodeDecodeError through,
# 0.23 raises DecodeError ("Invalid UTF-8 encoded string").
_BAD_UTF8 = (UnicodeDecodeError, msgspec.DecodeError)


def _string(raw: msgspec.Raw) -> str:
    """A JSON string kept raw by the body's decode, as a str: in C (epp/api/_jsonstr.c, one
    allocation; msgspec's own growth of its buffer cost a 276 KB prompt 0.45 ms against 0.16 in a
    fresh heap), or by msgspec wherever the C one declines, which then answers what it would have
    (an error included)."""
    text = _jsonstr.string(raw)
    return _STR_DECODER.decode(raw) if text is None else text


def decode(decoder: msgspec.json.Decoder[Any], body: bytes, limits: RequestLimits) -> Any:
    """`body` decoded by `decoder` (any route's); every failure a one-line `BadRequest`."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        raise _validation_error(str(e)) from None
    except msgspec.DecodeError as e:
        raise BadRequest(one_line(f"invalid JSON in request body: {e}")) from None
    except UnicodeDecodeError:
        # msgspec lets the codec's error through for invalid UTF-8 inside strings.
        raise BadRequest("request body is not valid UTF-8") from None
    except RecursionError:  # skipping a field nested ~1,000 deep
        raise _limits.too_deep(limits) from None


def parse_openai(req: InferenceRequest, body: bytes, limits: RequestLimits) -> str:
    """Chat, completions, embeddings and Responses bodies (and their /render twins)."""
    api = req.api
    parsed: Any = decode(_DECODERS[api], body, limits)
    model = parsed.model
    if not model and api is not Api.RESPONSES:  # vLLM serves a Responses body without a model
        raise BadRequest("model not found in request body")
    check_cache_salt(parsed.cache_salt)
    req.stream = bool(parsed.stream)
    req.cache_salt = parsed.cache_salt or None
    if api is Api.CHAT:
        _fill_chat(req, parsed, limits, body)
        _fill_lengths(req, parsed)
        completion = _integer(parsed.max_completion_tokens)
        if completion is not None:
            req.max_output_tokens, req.max_output_param = completion, "max_completion_tokens"
    elif api is Api.RESPONSES:
        _fill_responses(req, parsed, limits)
    elif api is Api.EMBEDDINGS:
        _fill_polymorphic(req, parsed.input, "input")
        req.add_special_tokens = _special_tokens(parsed.add_special_tokens)
    else:
        # vLLM feeds prompt_embeds before any prompt: epp cannot know that sequence, so such a
        # request routes without token ids.
        if not _embeds_given(parsed.prompt_embeds):
            prompt = parsed.prompt
            if len(prompt) == 2 and bytes(prompt) == b'""':
                # vLLM's validate_prompt_and_prompt_embeds refuses an empty-string prompt too
                raise BadRequest("prompt must not be empty (nor prompt_embeds missing)")
            _fill_polymorphic(req, prompt, "prompt")
        req.add_special_tokens = _special_tokens(parsed.add_special_tokens)
        _fill_lengths(req, parsed)
    return model or ""


def _fill_lengths(req: InferenceRequest, parsed: _LengthFields) -> None:
    req.max_output_tokens = _integer(parsed.max_tokens)
    req.truncate_prompt_tokens = _integer(parsed.truncate_prompt_tokens)
    side = parsed.truncation_side
    req.truncation_side = side if side in ("left", "right") else None


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _integer(value: Any) -> int | None:
    """An integer as pydantic's lax mode reads one (3 and 3.0; not True, not 3.5); else None.

    Clamped to int64: a 400-digit max_tokens is refused by every limit it is compared with just
    as its clamped value is, and consumers that compute with it in floats (latency predictions)
    then cannot overflow."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return min(max(value, _INT64[0]), _INT64[1])
    return None


# vLLM's validate_cache_salt (every API that takes a salt): a salt it would refuse is answered 400.
_MAX_CACHE_SALT = 128
_CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")


def check_cache_salt(salt: str | None) -> None:
    """A salt vLLM would refuse is a `BadRequest` (every API that takes one)."""
    if salt is None:
        return
    if not salt or len(salt) > _MAX_CACHE_SALT or not _CACHE_SALT_FORBIDDEN.isdisjoint(salt):
        raise BadRequest(
            f"cache_salt must be a non-empty string of at most {_MAX_CACHE_SALT} characters "
            "without '@', '/', '\\' or NUL"
        )


_FALSE = frozenset((False, 0, "0", "false", "f", "no", "n", "off"))


def _special_tokens(value: Any) -> bool:
    """vLLM's `add_special_tokens` as its pydantic model reads it (lax booleans: 0, "false",
    "off"... are false); anything else, absent included, is its default, true. A value vLLM
    refuses gets vLLM's own 400: routing it as true costs nothing."""
    if isinstance(value, str):
        value = value.strip().lower()
    return not (isinstance(value, (bool, int, str)) and value in _FALSE)


def _validation_error(msg: str) -> BadRequest:
    # msgspec appends " - at `$.path`" for anything below the root; without it the body itself
    # had the wrong type (an array, a string...).
    if " - at `$" not in msg:
        return BadRequest(one_line(f"request body must be a JSON object ({msg})"))
    return BadRequest(one_line(f"invalid request body: {msg}"))


def _parts_text(parts: list[_Part] | list[_Part | str], out: list[str]) -> int:
    """Append the parts' texts to `out`; returns the number of parts."""
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif part.text is not None:
            out.append(part.text)
    return len(parts)


# A message content at least this long (as JSON) is not decoded again for the chat template
# (`epp.api.limits.KnownStrings`): shorter ones cost less to decode than to splice around.
KNOWN_STRING_BYTES = 4096


def _fill_chat(req: InferenceRequest, parsed: _ChatBody, limits: RequestLimits, body: bytes) -> None:
    messages = parsed.messages
    if messages is None:
        raise BadRequest("messages not found in request body")
    if len(messages) > limits.max_messages:
        raise _limits.over("messages", len(messages), limits, "max_messages")
    if parsed.tools is not None and len(parsed.tools) > limits.max_tools:
        raise _limits.over("tools", len(parsed.tools), limits, "max_tools")
    parts = 0
    # No messages: vLLM refuses them when it renders (epp's chat template step does too), but
    # not with prompt ids forwarded in kv_transfer_params.
    texts = req.prompt_texts
    known: list[tuple[int, int, int, str]] = []
    for i, msg in enumerate(messages):
        raw = msg.content
        text = _jsonstr.string(raw)
        if text is not None:
            texts.append(text)
            if len(raw) >= KNOWN_STRING_BYTES and (at := _jsonstr.offset(raw, body)) >= 0:
                known.append((i, at, at + len(raw), text))
            continue
        if not raw:  # absent
            continue
        content = _content(raw, i)
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            parts += _parts_text(content, texts)
        elif msg.role != "assistant":
            raise BadRequest(f"messages[{i}].content is null (only an assistant message may be)")
    if parts > limits.max_content_parts:
        raise _limits.over("content parts", parts, limits, "max_content_parts")
    if known:
        req.known_strings = _limits.KnownStrings(body, tuple(known))


def _content(raw: msgspec.Raw, i: int) -> str | list[_Part | str] | None:
    """A message's content other than a string the C decoder took: parts, null, or anything
    msgspec must judge; its errors as the body's decode gave them (paths from the body's root)."""
    try:
        content: str | list[_Part | str] | None = _CONTENT_DECODER.decode(raw)
    except msgspec.ValidationError as e:
        msg, at = str(e), f"$.messages[{i}].content"
        msg = msg.replace("at `$", f"at `{at}", 1) if " - at `$" in msg else f"{msg} - at `{at}`"
        raise _validation_error(msg) from None
    except _BAD_UTF8:
        raise BadRequest("request body is not valid UTF-8") from None
    return content


def _fill_responses(req: InferenceRequest, parsed: _ResponsesBody, limits: RequestLimits) -> None:
    inp = parsed.input
    if inp is None:
        raise BadRequest("input not found in request body")
    budget = parsed.max_output_tokens
    if budget is not None:
        n = lax_int(budget)
        if n is None:
            raise BadRequest("max_output_tokens: must be an integer")
        req.max_output_tokens, req.max_output_param = _integer(n), "max_output_tokens"
    if parsed.truncation != "disabled":
        # vLLM's TokenizeParams: keep the prompt's tail (epp.api.context_length.truncate)
        req.truncate_prompt_tokens = -1
    texts = req.prompt_texts
    if parsed.instructions:
        texts.append(parsed.instructions)
    if isinstance(inp, str):
        texts.append(inp)
        return
    # An empty list is vLLM's to refuse (or serve, with instructions): it renders the messages.
    if len(inp) > limits.max_messages:
        raise _limits.over("input items", len(inp), limits, "max_messages")
    parts = 0
    for item in inp:
        content = item.content
        if isinstance(content, str):
            texts.append(content)
        elif content is not None:
            parts += _parts_text(content, texts)
        out = item.output
        if len(out) > 1 and memoryview(out)[0] == 0x22:  # a JSON string
            try:
                texts.append(_string(out))
            except _BAD_UTF8:
                raise BadRequest("request body is not valid UTF-8") from None
    if parts > limits.max_content_parts:
        raise _limits.over("content parts", parts, limits, "max_content_parts")


def _embeds_given(raw: msgspec.Raw) -> bool:
    """prompt_embeds present and not null or an empty list (vLLM's test for "provided"). Only a
    short value is looked at: the embeddings may be megabytes of base64."""
    n = len(raw)
    return _present(raw) and (n > 16 or bytes(raw).translate(None, b" \t\r\n") != b"[]")


def _present(raw: msgspec.Raw) -> bool:
    """Whether a Raw field was given a non-null value (len test first: never copy a big value)."""
    n = len(raw)
    return n != 0 and not (n == 4 and bytes(raw) == b"null")


def _fill_polymorphic(req: InferenceRequest, raw: msgspec.Raw, field: str) -> None:
    """`prompt` / embeddings `input`: a string, strings, token ids, or token-id lists (all in C)."""
    if not _present(raw):
        raise BadRequest(f"{field} not found in request body")
    view = memoryview(raw)
    first = view[0]
    try:
        if first == 0x22:  # "
            req.prompt_texts.append(_string(raw))
            return
        if first != 0x5B:  # [
            raise BadRequest(
                f"invalid request body: {field} must be a string, a list of strings, "
                "a list of token ids or a list of token-id lists"
            )
        # Peek at the first element to pick the one decoder that can accept the whole list.
        i = 1
        while view[i] in _JSON_WS:
            i += 1
        elem = view[i]
        if elem == 0x5D:  # ]
            raise BadRequest(f"{field} must not be empty")
        if elem == 0x22:
            req.prompt_texts.extend(_STRS_DECODER.decode(raw))
        elif elem == 0x5B:
            lists = _ID_LISTS_DECODER.decode(raw)
            if field == "prompt" and not all(lists):  # vLLM completions: "The decoder prompt cannot be empty"
                raise BadRequest(f"{field}: a token-id list must not be empty")
            req.prompt_token_ids.extend(lists)
        else:
            # Digits, '-', or anything else (msgspec then reports the offending element).
            req.prompt_token_ids.append(_IDS_DECODER.decode(raw))
    except msgspec.ValidationError as e:
        # Paths in the error are relative to the raw slice: re-anchor them on the field.
        msg = str(e).replace("at `$", f"at `$.{field}", 1)
        raise BadRequest(one_line(f"invalid request body: {field}: {msg}")) from None
    except _BAD_UTF8:  # after ValidationError, a DecodeError too
        raise BadRequest("request body is not valid UTF-8") from None
