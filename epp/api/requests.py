"""Parsing of OpenAI-style request bodies into an `InferenceRequest`.

Role: the first thing done with every request body. It picks the API from the path (as GIE's
openai-parser does), validates the handful of fields the scheduler needs, estimates the prompt size,
and applies the model-name rewrite header to the body (`retarget`, which the Director also uses for
InferenceModelRewrites). Every failure is a one-line
`BadRequest` (400) that names the offending field.

Design (hot path, so the costs are deliberate):
  * One msgspec `Decoder` per API, built at import, decoding into small Structs that declare only
    the fields we use; msgspec skips every other field in C without building Python objects.
  * Polymorphic prompts (`prompt`, embeddings `input`: string | strings | token ids | token-id lists)
    are captured as `msgspec.Raw` (a zero-copy slice of the body) and then decoded by the one
    decoder matching the first significant byte. msgspec unions may hold only one array type, and
    checking a decoded `list[str | int | list[int]]` for homogeneity element by element in Python
    costs 18-30 ns per token id here; decoding the raw slice as `list[int]` validates it in C instead.
  * The model rewrite is the only path that decodes the whole body generically. Floats are decoded
    as `Decimal` and re-encoded as JSON numbers, so every number is written back exactly as the
    client spelled its value (no float rounding, no out-of-range failure on 1e400); big ints are
    exact in msgspec anyway. Without the header the body object is passed on untouched (no copy).
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from epp.api import limits as _limits
from epp.api import other_bodies as _other
from epp.api import slo as _slo
from epp.api.errors import BadRequest
from epp.api.limits import DEFAULT_LIMITS, RequestLimits
from epp.api.routes import DEFAULT as DEFAULT_PARSERS
from epp.api.routes import Api as Api  # re-exported: the API enum belongs with the request
from epp.api.routes import Route
from epp.lax import lax_bool, lax_int

MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"  # GIE's name, which llm-d still reads
LLMD_MODEL_REWRITE_HEADER = "x-llm-d-model-name-rewrite"  # llm-d Router v0.10's
MODEL_REWRITE_HEADERS = (LLMD_MODEL_REWRITE_HEADER, MODEL_REWRITE_HEADER)  # the first present wins


def rewrite_header(headers: Mapping[str, str]) -> str:
    """The model named by a model-name rewrite header ("" when none), llm-d's name first."""
    for name in MODEL_REWRITE_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return ""


@dataclasses.dataclass(slots=True)
class InferenceRequest:
    """What the scheduler needs to know about one request. Built once per request."""

    request_id: str
    api: Api
    path: str
    headers: Mapping[str, str]  # lower-case names, as received
    model: str = ""  # the model name the client asked for ("" for header-only requests)
    target_model: str = ""  # after the rewrite header or an InferenceModelRewrite; what the pod sees
    stream: bool = False
    # The prompt in the forms available: text (completions string / chat rendered later by the
    # tokenizer component), token ids (completions given as ids). Batched prompts keep all items.
    prompt_texts: list[str] = dataclasses.field(default_factory=list)
    prompt_token_ids: list[list[int]] = dataclasses.field(default_factory=list)
    # The decoded JSON body as plain Python objects, for components that need more (chat template).
    body: Mapping[str, Any] | None = None
    body_bytes: bytes = b""
    # A cheap prompt-size estimate in tokens (exact when token ids were given), for load accounting.
    prompt_tokens_estimate: int = 0
    # vLLM's `cache_salt`: requests with different salts never share KV blocks.
    cache_salt: str | None = None
    # The first (or only) prompt as the token ids the model server will compute, when known: given
    # as ids, or filled in by the tokenizer before scheduling (requestcontrol). None = unknown.
    token_ids: list[int] | None = None
    # vLLM's `add_special_tokens` for completions/embeddings prompts (default true: BOS added);
    # chat prompts come from the template, which places its own special tokens.
    add_special_tokens: bool = True
    # Envoy's subset hint: None = no restriction; else the allowed IPs (ports ignored, as GIE).
    subset_ips: frozenset[str] | None = None
    # The priority of the request's InferenceObjective (header x-gateway-inference-objective); 0 when
    # none is named or known. Negative = sheddable under saturation. Set by requestcontrol.
    priority: int = 0
    # vLLM's length parameters of a chat or completions body, for its context-length rules
    # (`epp.api.context_length`); None when absent or not an integer (vLLM answers those).
    max_output_tokens: int | None = None
    max_output_param: str = "max_tokens"  # the field `max_output_tokens` came from, for messages
    truncate_prompt_tokens: int | None = None
    truncation_side: str | None = None
    # A chat body rendered in a body-parser process (epp.requestcontrol.offload), never decoded
    # here: its (forwards_ids, add_special_tokens), which the director would read off `body`.
    chat_flags: tuple[bool, bool] | None = None
    # The key under which the body-parser process that parsed this chat keeps its body for the
    # render (`epp.requestcontrol.offload`): epp's own, unique per parse ("" when parsed here).
    # Never the client's x-request-id, which two clients may send alike.
    kept_body_key: str = dataclasses.field(default="", compare=False)
    # Latency targets in seconds from x-slo-ttft-ms / x-slo-tpot-ms (`epp.api.slo`); None = none.
    slo_ttft: float | None = None
    slo_tpot: float | None = None
    # A /render route: vLLM renders the body of `api` and runs no engine (`epp.api.routes`).
    render: bool = False
    # What request-control plugins learn of the request (llm-d's request attributes), by llm-d's
    # data key (data type, producer name): ("agent-identity", ""), ("SessionIDDataKey", name), ...
    attributes: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)

    @property
    def runs_engine(self) -> bool:
        """Whether the model server feeds the request to its engine and caches its KV blocks
        (not a render, a token count, or a body no parser read): only then are its token ids
        worth scoring."""
        return Route(self.api, self.render).runs_engine

    @property
    def anthropic_errors(self) -> bool:
        """vLLM answers this request's refusals in Anthropic's error shape (its /v1/messages and
        count_tokens routes, past request-model validation; /v1/messages/render in OpenAI's)."""
        return self.api in (Api.MESSAGES, Api.COUNT_TOKENS) and not self.render


# --- Body shapes: only the fields we read. Unknown fields are skipped by msgspec. ---------------


class _Part(msgspec.Struct):
    """A content part: {"type": "text"|"input_text"|"output_text", "text": ...}; others have no text."""

    text: str | None = None


class _Message(msgspec.Struct):
    role: str
    # Parts may be bare strings (vLLM takes them as text). Absent (UNSET) and null differ: vLLM
    # takes a message without content as an empty one, but null only on an assistant message.
    content: str | list[_Part | str] | msgspec.UnsetType | None = msgspec.UNSET


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
    prompt: msgspec.Raw = msgspec.Raw()  # empty when absent
    add_special_tokens: Any = None  # vLLM's extension; lax like pydantic: see _special_tokens
    prompt_embeds: msgspec.Raw = msgspec.Raw()  # vLLM's extension: only its presence is read


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
_STRS_DECODER = msgspec.json.Decoder(list[str])
_IDS_DECODER = msgspec.json.Decoder(list[_TokenId])
_ID_LISTS_DECODER = msgspec.json.Decoder(list[list[_TokenId]])

# For the model rewrite only: generic objects, numbers kept exact (see module docstring).
_GENERIC_DECODER = msgspec.json.Decoder(float_hook=decimal.Decimal)
_GENERIC_ENCODER = msgspec.json.Encoder(decimal_format="number")

_DECODERS: dict[Api, msgspec.json.Decoder[Any]] = {
    Api.CHAT: _CHAT_DECODER,
    Api.COMPLETIONS: _COMPLETIONS_DECODER,
    Api.RESPONSES: _RESPONSES_DECODER,
    Api.EMBEDDINGS: _EMBEDDINGS_DECODER,
}

_JSON_WS = frozenset(b" \t\r\n")


def parse_request(
    *,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    request_id: str,
    subset_ips: frozenset[str] | None = None,
    limits: RequestLimits = DEFAULT_LIMITS,
    route: Route | None = None,
) -> InferenceRequest:
    """Validate a request body and describe it for the scheduler. Raises `BadRequest`.

    `route` is the parser's verdict on `path` (`epp.api.routes`; llm-d's default parsers when
    None). `limits` (epp's own, `epp.api.limits`) bound the messages, content parts and tools of a
    body before anything renders it.

    `body_bytes` is `body` itself unless a rewrite header (`x-llm-d-model-name-rewrite`, or GIE's
    `x-gateway-model-name-rewrite`) names another model, in which case it is the body re-encoded
    with its top-level "model" replaced (`retarget`; the caller must then fix Content-Length).
    `body` of the result is left None: later components decode what they need.
    A body no parser reads (`Api.PASSTHROUGH`) is forwarded as it is: no model, no rewrite.
    """
    if route is None:
        route = DEFAULT_PARSERS.resolve(path)
    api = route.api
    slo_ttft, slo_tpot = _slo.parse_targets(headers)
    req = InferenceRequest(
        request_id=request_id,
        api=api,
        path=path,
        headers=headers,
        body_bytes=body,
        subset_ips=subset_ips,
        slo_ttft=slo_ttft,
        slo_tpot=slo_tpot,
        render=route.render,
    )
    if api is Api.PASSTHROUGH:
        return req
    if not body:
        raise BadRequest("empty request body")
    if api in _OTHER_PARSERS:
        model = _OTHER_PARSERS[api](req, body, limits)
    else:
        model = _parse_openai(req, body, limits)
    req.model = req.target_model = model
    if req.prompt_token_ids:
        req.prompt_tokens_estimate = sum(map(len, req.prompt_token_ids))
        req.token_ids = req.prompt_token_ids[0]  # a batch's prompts are separate sequences
    elif not req.prompt_tokens_estimate:  # (generate's media ids set it: the ids are known)
        n = 0
        for text in req.prompt_texts:
            # isascii() is O(1) in CPython (a flag on the string), so ASCII text costs no encode.
            n += len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        req.prompt_tokens_estimate = (n + 3) // 4  # ~4 bytes per token, rounded up

    target = rewrite_header(headers)
    if target and target != model:
        retarget(req, target)
    return req


def _decode(decoder: msgspec.json.Decoder[Any], body: bytes, limits: RequestLimits) -> Any:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        raise _validation_error(str(e)) from None
    except msgspec.DecodeError as e:
        raise BadRequest(_one_line(f"invalid JSON in request body: {e}")) from None
    except UnicodeDecodeError:
        # msgspec lets the codec's error through for invalid UTF-8 inside strings.
        raise BadRequest("request body is not valid UTF-8") from None
    except RecursionError:  # skipping a field nested ~1,000 deep
        raise _limits.too_deep(limits) from None


def _parse_openai(req: InferenceRequest, body: bytes, limits: RequestLimits) -> str:
    """Chat, completions, embeddings and Responses bodies (and their /render twins)."""
    api = req.api
    parsed = _decode(_DECODERS[api], body, limits)
    model = parsed.model
    if not model and api is not Api.RESPONSES:  # vLLM serves a Responses body without a model
        raise BadRequest("model not found in request body")
    _check_cache_salt(parsed.cache_salt)
    req.stream = bool(parsed.stream)
    req.cache_salt = parsed.cache_salt or None
    if api is Api.CHAT:
        _fill_chat(req, parsed, limits)
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
            if len(parsed.prompt) == 2 and bytes(parsed.prompt) == b'""':
                # vLLM's validate_prompt_and_prompt_embeds refuses an empty-string prompt too
                raise BadRequest("prompt must not be empty (nor prompt_embeds missing)")
            _fill_polymorphic(req, parsed.prompt, "prompt")
        req.add_special_tokens = _special_tokens(parsed.add_special_tokens)
        _fill_lengths(req, parsed)
    return model or ""


def _parse_messages(req: InferenceRequest, body: bytes, limits: RequestLimits) -> str:
    """Anthropic's Messages and count_tokens (`epp.api.other_bodies`)."""
    parsed = _decode(_other.MESSAGES_DECODER, body, limits)
    count = req.api is Api.COUNT_TOKENS
    model, max_tokens, stream = _other.check_messages(parsed, count_tokens=count)
    messages = parsed.messages or []
    if len(messages) > limits.max_messages:
        raise _limits.over("messages", len(messages), limits, "max_messages")
    parts = sum(len(m.content) for m in messages if isinstance(m.content, list))
    if parts > limits.max_content_parts:
        raise _limits.over("content parts", parts, limits, "max_content_parts")
    req.prompt_texts = _other.anthropic_texts(parsed)
    req.stream = stream
    if isinstance(parsed.cache_salt, str) and parsed.cache_salt and not count:
        req.cache_salt = parsed.cache_salt
    if max_tokens is not None:
        # vLLM sets both chat budgets from it; its messages name max_completion_tokens
        req.max_output_tokens, req.max_output_param = max_tokens, "max_completion_tokens"
    return model


def _parse_generate(req: InferenceRequest, body: bytes, limits: RequestLimits) -> str:
    """vLLM's /inference/v1/generate: the prompt is the token ids given."""
    parsed = _decode(_other.GENERATE_DECODER, body, limits)
    model = parsed.model
    if model is not None and not isinstance(model, str):
        raise BadRequest("model: must be a string")
    ids = _other.generate_ids(parsed)
    req.max_output_tokens = _other.generate_budget(parsed)
    _check_cache_salt(parsed.cache_salt)
    req.cache_salt = parsed.cache_salt or None
    if parsed.stream is not None:
        stream = lax_bool(parsed.stream)
        if stream is None:
            raise BadRequest("stream: must be a boolean")
        req.stream = stream
    if parsed.content_parts:
        # media the server resolves and expands into placeholder tokens: ids unknown here
        req.prompt_tokens_estimate = len(ids)
    else:
        req.prompt_token_ids.append(ids)
    return model or ""


def _parse_conversations(req: InferenceRequest, body: bytes, limits: RequestLimits) -> str:
    """llm-d's check of an OpenAI conversations body: a non-empty `items` list."""
    parsed = _decode(_other.CONVERSATIONS_DECODER, body, limits)
    if not isinstance(parsed.items, list) or not parsed.items:
        raise BadRequest("invalid conversations request: must have items field")
    return parsed.model if isinstance(parsed.model, str) else ""


def _parse_images(req: InferenceRequest, body: bytes, limits: RequestLimits) -> str:
    """llm-d's check of an image generation body: a non-empty `prompt` string."""
    parsed = _decode(_other.IMAGES_DECODER, body, limits)
    if not isinstance(parsed.prompt, str) or not parsed.prompt:
        raise BadRequest("invalid images generations request: must have prompt field")
    req.prompt_texts.append(parsed.prompt)
    req.stream = lax_bool(parsed.stream) is True
    return parsed.model if isinstance(parsed.model, str) else ""


_OTHER_PARSERS = {
    Api.MESSAGES: _parse_messages,
    Api.COUNT_TOKENS: _parse_messages,
    Api.GENERATE: _parse_generate,
    Api.CONVERSATIONS: _parse_conversations,
    Api.IMAGES: _parse_images,
}


def retarget(req: InferenceRequest, target: str) -> None:
    """Send `req` to model `target`: `target_model` set and the body's top-level "model" replaced
    (the response's is set back to `model` by `epp.api.responses`). Decodes the whole body: a
    large one belongs off the event loop (`epp.requestcontrol.offload`)."""
    if target == req.target_model:
        return
    req.target_model = target
    req.body_bytes = with_model(req.body_bytes, target)


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


def _check_cache_salt(salt: str | None) -> None:
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


def plain_prompt(req: InferenceRequest) -> str | None:
    """The text to tokenize "plainly" (no chat template): the first prompt of a completions or
    embeddings request, or the chat/responses texts joined by newlines; None if there is none.

    An interim rendering until chat templates are applied as vLLM does: for chat it does not give
    vLLM's tokens, so it matches only servers that tokenize the same way (the simulator).
    """
    texts = req.prompt_texts
    if not texts:
        return None
    if req.api is Api.COMPLETIONS or req.api is Api.EMBEDDINGS:
        return texts[0]
    return "\n".join(texts)


def header_only_request(
    *,
    path: str,
    headers: Mapping[str, str],
    request_id: str,
    subset_ips: frozenset[str] | None = None,
) -> InferenceRequest:
    """A request without a body (e.g. GET /v1/models): nothing to parse, the model comes from the header."""
    model = rewrite_header(headers)
    return InferenceRequest(
        request_id=request_id,
        api=Api.OTHER,
        path=path,
        headers=headers,
        model=model,
        target_model=model,
        subset_ips=subset_ips,
    )


# --- helpers -------------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    """Reasons go into an HTTP body and a log line: collapse any line breaks and runs of spaces."""
    return " ".join(text.split())


def _validation_error(msg: str) -> BadRequest:
    # msgspec appends " - at `$.path`" for anything below the root; without it the body itself
    # had the wrong type (an array, a string...).
    if " - at `$" not in msg:
        return BadRequest(_one_line(f"request body must be a JSON object ({msg})"))
    return BadRequest(_one_line(f"invalid request body: {msg}"))


def _parts_text(parts: list[_Part] | list[_Part | str], out: list[str]) -> int:
    """Append the parts' texts to `out`; returns the number of parts."""
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif part.text is not None:
            out.append(part.text)
    return len(parts)


def _fill_chat(req: InferenceRequest, parsed: _ChatBody, limits: RequestLimits) -> None:
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
    for i, msg in enumerate(messages):
        content = msg.content
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            parts += _parts_text(content, texts)
        elif content is None and msg.role != "assistant":
            raise BadRequest(f"messages[{i}].content is null (only an assistant message may be)")
    if parts > limits.max_content_parts:
        raise _limits.over("content parts", parts, limits, "max_content_parts")


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
                texts.append(_STR_DECODER.decode(out))
            except UnicodeDecodeError:
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
            req.prompt_texts.append(_STR_DECODER.decode(raw))
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
        raise BadRequest(_one_line(f"invalid request body: {field}: {msg}")) from None
    except UnicodeDecodeError:
        raise BadRequest("request body is not valid UTF-8") from None


def with_model(body: bytes, target: str) -> bytes:
    """The body with its top-level "model" set to `target`; key order and number spellings kept."""
    try:
        obj = _GENERIC_DECODER.decode(body)
        obj["model"] = target
        return _GENERIC_ENCODER.encode(obj)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:  # pragma: no cover - parsed once already
        raise BadRequest(_one_line(f"invalid JSON in request body: {e}")) from None
    except RecursionError:  # decoded (and encoded) whole, deeper in the stack than the typed parse
        raise BadRequest("request body is nested too deep to rewrite its model") from None
