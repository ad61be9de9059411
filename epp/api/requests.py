"""Parsing of request bodies into an `InferenceRequest`.

Role: the first thing done with every request body. It picks the API from the path (as GIE's
openai-parser does), validates the handful of fields the scheduler needs, estimates the prompt size,
and applies the model-name rewrite header to the body (`retarget`, which the Director also uses for
InferenceModelRewrites). Every failure is a one-line `BadRequest` (400) that names the offending
field. The bodies' shapes: `epp.api.openai_bodies` (OpenAI's APIs), `epp.api.other_bodies` (the
other routes).

Design (hot path, so the costs are deliberate):
  * One msgspec `Decoder` per API, built at import, decoding into small Structs that declare only
    the fields we use; msgspec skips every other field in C without building Python objects.
  * Polymorphic prompts are decoded from a raw slice by the one decoder that fits
    (`epp.api.openai_bodies`).
  * The model rewrite is the only path that decodes the whole body generically. Floats are decoded
    as `Decimal` and re-encoded as JSON numbers, so every number is written back exactly as the
    client spelled its value (no float rounding, no out-of-range failure on 1e400); big ints are
    exact in msgspec anyway. Without the header the body object is passed on untouched (no copy).
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Mapping
from typing import Any

import msgspec

from epp.api import limits as _limits
from epp.api import openai_bodies as _openai
from epp.api import other_bodies as _other
from epp.api import slo as _slo
from epp.api.errors import BadRequest, one_line
from epp.api.limits import DEFAULT_LIMITS, RequestLimits
from epp.api.routes import DEFAULT as DEFAULT_PARSERS
from epp.api.routes import Api as Api  # re-exported: the API enum belongs with the request
from epp.api.routes import Route
from epp.lax import lax_bool

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
    # A chat's long message contents, decoded by the parse, for the template's decode to skip
    # (`epp.api.limits.decode_body`); they apply to the parsed body only, not to a rewritten one.
    known_strings: _limits.KnownStrings | None = dataclasses.field(default=None, compare=False, repr=False)
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


# For the model rewrite only: generic objects, numbers kept exact (see module docstring).
_GENERIC_DECODER = msgspec.json.Decoder(float_hook=decimal.Decimal)
_GENERIC_ENCODER = msgspec.json.Encoder(decimal_format="number")


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
        model = _openai.parse_openai(req, body, limits)
    req.model = req.target_model = model
    if req.prompt_token_ids:
        req.prompt_tokens_estimate = sum(map(len, req.prompt_token_ids))
        req.token_ids = req.prompt_token_ids[0]  # a batch's prompts are separate sequences
    elif not req.prompt_tokens_estimate:  # (generate's media ids set it: the ids are known)
        req.prompt_tokens_estimate = (sum(map(utf8_length, req.prompt_texts)) + 3) // 4  # ~4 bytes a token

    target = rewrite_header(headers)
    if target and target != model:
        retarget(req, target)
    return req


# Past this many characters a text's UTF-8 length is estimated from samples (`utf8_length`).
EXACT_LENGTH_CHARS = 1 << 16
_SAMPLES = 16
_SAMPLE_CHARS = 1 << 10


def utf8_length(text: str) -> int:
    """`text`'s UTF-8 length: exact up to EXACT_LENGTH_CHARS characters, estimated from evenly
    spaced samples past it. isascii() is O(1) in CPython (a flag on the string), so ASCII text is
    never encoded; encoding a whole 100k-token prompt with one emoji in it (a 4-byte-per-character
    string) took 0.13 ms of the loop, for a figure that is itself an estimate."""
    n = len(text)
    if text.isascii():
        return n
    if n <= EXACT_LENGTH_CHARS:
        return len(text.encode("utf-8", "surrogatepass"))
    step = n // _SAMPLES
    starts = range(0, step * _SAMPLES, step)
    sampled = sum(len(text[i : i + _SAMPLE_CHARS].encode("utf-8", "surrogatepass")) for i in starts)
    return round(n * sampled / (_SAMPLES * _SAMPLE_CHARS))


def _parse_messages(req: InferenceRequest, body: bytes, limits: RequestLimits) -> str:
    """Anthropic's Messages and count_tokens (`epp.api.other_bodies`)."""
    parsed = _openai.decode(_other.MESSAGES_DECODER, body, limits)
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
    parsed = _openai.decode(_other.GENERATE_DECODER, body, limits)
    model = parsed.model
    if model is not None and not isinstance(model, str):
        raise BadRequest("model: must be a string")
    ids = _other.generate_ids(parsed)
    req.max_output_tokens = _other.generate_budget(parsed)
    _openai.check_cache_salt(parsed.cache_salt)
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
    parsed = _openai.decode(_other.CONVERSATIONS_DECODER, body, limits)
    if not isinstance(parsed.items, list) or not parsed.items:
        raise BadRequest("invalid conversations request: must have items field")
    return parsed.model if isinstance(parsed.model, str) else ""


def _parse_images(req: InferenceRequest, body: bytes, limits: RequestLimits) -> str:
    """llm-d's check of an image generation body: a non-empty `prompt` string."""
    parsed = _openai.decode(_other.IMAGES_DECODER, body, limits)
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


def with_model(body: bytes, target: str) -> bytes:
    """The body with its top-level "model" set to `target`; key order and number spellings kept."""
    try:
        obj = _GENERIC_DECODER.decode(body)
        obj["model"] = target
        return _GENERIC_ENCODER.encode(obj)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:  # pragma: no cover - parsed once already
        raise BadRequest(one_line(f"invalid JSON in request body: {e}")) from None
    except RecursionError:  # decoded (and encoded) whole, deeper in the stack than the typed parse
        raise BadRequest("request body is nested too deep to rewrite its model") from None
