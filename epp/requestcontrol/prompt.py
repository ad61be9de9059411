"""A request's prompt as the model server will see it: token ids, and vLLM's context-length rules.

The one slow step of a routing decision (milliseconds for long prompts), run before the
scheduler, which is synchronous. Every API vLLM renders with a chat template (chat, Anthropic's
Messages and count_tokens, Responses, their /render routes) is rendered with the model's template
after vLLM's own preprocessing (`epp.tokenize.dialects`); completions and embeddings prompts are
tokenized as they are (`plain_prompt`); vLLM's /inference/v1/generate gives its ids. A tokenizer
failure costs the request its token ids (prefix scorers then see none), never the request; a
request vLLM would refuse (the template raises, a malformed part) is answered 400 here. Large
bodies and long chats are decoded and rendered by body-parser processes when the director has
them (`epp.requestcontrol.offload`); tokenizing stays here.

The pods' context length is enforced only on ids the model's own tokenizer computed (or ids the
request gave): a stand-in tokenizer (epp-tiny, when nothing names one) counts other tokens, and
once refused a 408-character Chinese prompt as over 1,024 of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from epp.api import context_length, errors
from epp.api.limits import RequestLimits, decode_body
from epp.api.requests import Api, InferenceRequest, plain_prompt
from epp.datastore.endpoints import Datastore
from epp.observability.logs import Throttle
from epp.requestcontrol.offload import BodyParsers
from epp.tokenize import render
from epp.tokenize.anthropic_request import RequestModelError
from epp.tokenize.chat import ChatPrompt, ChatTemplated, ChatTemplateError, UnsupportedChat
from epp.tokenize.dialects import Dialect, Prepared, for_route
from epp.tokenize.registry import RENDER_INLINE_MESSAGES, Saturated
from epp.tokenize.render import Renderer

log = logging.getLogger("epp.director")
_BUG_LOG = Throttle(10.0)


class PromptTokenizer(Protocol):
    """What the Director needs of a tokenizer registry (`epp.tokenize`)."""

    async def encode(
        self, model: str, text: str, *, base_model: str | None = None, add_special_tokens: bool = True
    ) -> list[int] | None:
        """The token ids of `text` for `model` (a LoRA adapter without a tokenizer of its own uses
        `base_model`'s); None when no tokenizer is known for either."""
        ...

    async def encode_dialect(
        self, model: str, dialect: Dialect, body: Mapping[str, Any], *, base_model: str | None = None
    ) -> tuple[list[int], Prepared] | None:
        """The prompt token ids vLLM computes for a decoded `body` of an API it renders with a chat
        template (and the facts of its chat body); None when no tokenizer is known for `model` or
        `base_model`. Raises when vLLM would refuse the request."""
        ...

    def is_models_own(self, model: str, *, base_model: str | None = None) -> bool:
        """Whether the tokenizer serving `model` was named for it (or as every model's default),
        not the stand-in epp ships: only such ids are held to the pods' context length."""
        ...

    max_chars: int
    """Characters of a prompt read: a chat rendered elsewhere is cut just past this."""

    def chat_template_for(self, model: str, *, base_model: str | None = None) -> ChatTemplated | None:
        """The chat template (and the tokens it reads) of `model`'s tokenizer; None as
        `encode_dialect`."""
        ...

    async def encode_prompt(
        self, model: str, prompt: ChatPrompt, *, base_model: str | None = None
    ) -> list[int] | None:
        """The token ids of a chat prompt rendered elsewhere (`chat_template_for`)."""
        ...


class Prompts:
    """Fills requests' token ids (`fill`) for one director."""

    def __init__(
        self,
        datastore: Datastore,
        limits: RequestLimits,
        context_limits: context_length.ContextLimits | None = None,
        body_parsers: BodyParsers | None = None,
        renderer: Renderer | None = None,
    ) -> None:
        self._datastore = datastore  # for the pool's base model (LoRA adapters' tokenizer)
        self.limits = limits
        self.context_limits = context_limits  # None: no context length enforced (the servers do)
        self.body_parsers = body_parsers
        # The model servers' /render, for models no local tokenizer is named for (token-producer).
        self.renderer = renderer

    async def fill(self, request: InferenceRequest, tokenizer: PromptTokenizer | None) -> None:
        """The prompt's token ids (with `tokenizer`, when given), and vLLM's context-length rules
        for them: raises `errors.BadRequest` where the model server would answer 400."""
        limit = None
        if self.context_limits is not None and context_length.applies(request):
            limit = self.context_limits.max_model_len(request.target_model)
            if limit is not None:
                context_length.check_parameters(request, limit)
        if request.prompt_token_ids:  # given as ids: every prompt of a batch is known
            if limit is not None:
                request.token_ids = context_length.check_given_ids(request.prompt_token_ids, request, limit)
            elif request.truncate_prompt_tokens is not None and request.truncate_prompt_tokens >= 0:
                request.token_ids = context_length.truncate(request.prompt_token_ids[0], request, 0)
            return
        if tokenizer is None:
            return
        if self._rendered_by_pods(request, tokenizer):
            await self._render(request)
            return  # the pod's own ids: its truncation applied, its refusals the pod's to answer
        await self._tokenize(request, tokenizer)
        ids = request.token_ids
        if ids is None:
            return
        if limit is not None and not tokenizer.is_models_own(
            request.target_model, base_model=self._datastore.base_model
        ):
            limit = None  # a stand-in's count says nothing of the model's (module docstring)
        keep = request.truncate_prompt_tokens
        if keep is not None and request.chat_flags is not None and request.chat_flags[0]:
            keep = None  # vLLM takes forwarded ids as they are (found by the differential run)
        if keep is not None and (keep >= 0 or limit is not None) and keep < len(ids):
            specials = (0, 0)
            if request.truncation_side is None and _adds_special_tokens(request):
                model, base = request.target_model, self._datastore.base_model
                specials = await context_length.text_specials(
                    lambda text, add: tokenizer.encode(model, text, base_model=base, add_special_tokens=add)
                )
            ids = context_length.truncate(ids, request, limit or 0, specials=specials)
            request.token_ids = ids
            request.prompt_tokens_estimate = len(ids)
        if limit is not None:
            context_length.check_prompt(len(ids), request, limit, from_text=True)

    async def _tokenize(self, request: InferenceRequest, tokenizer: PromptTokenizer) -> None:
        """Fill `request.token_ids` (and the exact prompt size) unless the ids came with it."""
        if request.token_ids is not None:
            return
        # vLLM tokenizes an adapter's prompt with the base model's tokenizer unless the adapter
        # ships its own: the pool's base model (as its endpoints name it) is the fallback.
        base_model = self._datastore.base_model
        dialect = dialect_of(request)
        try:
            if dialect is not None:
                # The model server sees the template's rendering of the (re-written) body.
                if dialect is Dialect.CHAT and self._renders_elsewhere(request):
                    ids = await self._encode_chat_elsewhere(request, tokenizer, base_model)
                else:
                    body = await self._decoded_off_loop(request)
                    found = await tokenizer.encode_dialect(
                        request.target_model, dialect, body, base_model=base_model
                    )
                    if found is None:
                        return
                    ids, prepared = found
                    request.chat_flags = (prepared.forwards_ids, prepared.add_special_tokens)
            else:
                text = plain_prompt(request)
                if text is None or request.api not in _PLAIN:
                    return
                ids = await tokenizer.encode(
                    request.target_model,
                    text,
                    base_model=base_model,
                    add_special_tokens=request.add_special_tokens,
                )
        except UnsupportedChat as exc:  # vLLM may serve it (media parts): route without token ids
            log.debug("request %s routed without token ids: %s", request.request_id, exc)
            return
        except RequestModelError as exc:  # vLLM's request model refuses it
            raise errors.BadRequest(str(exc), validation=True) from None
        except ChatTemplateError as exc:  # vLLM answers these 400 too: answer before routing
            raise errors.BadRequest(str(exc)) from None
        except errors.RequestError:  # the body over a limit (_decoded)
            raise
        except Saturated as exc:  # overload: answered early, with the reason, never queued on
            raise errors.ServiceUnavailable(f"{exc}: retry") from None
        except Exception:  # a tokenizer bug costs the prefix hint, never the request
            # An epp bug, but one a client's request may trigger at will: one line per interval.
            _BUG_LOG.log(
                log,
                logging.ERROR,
                "tokenizing the prompt for model %r failed",
                request.target_model,
                exc_info=True,
            )
            return
        if ids is not None:
            request.token_ids = ids
            request.prompt_tokens_estimate = len(ids)

    def _rendered_by_pods(self, request: InferenceRequest, tokenizer: PromptTokenizer) -> bool:
        """Whether the request's ids come from the pods' /render: a route that renders and runs
        an engine, for a model a token producer renders and no local tokenizer is named for."""
        renderer = self.renderer
        if renderer is None or not request.runs_engine or request.api not in _RENDER_ROUTES:
            return False
        model = request.target_model
        base = self._datastore.base_model
        return renderer.serves(model) and not tokenizer.is_models_own(model, base_model=base)

    async def _render(self, request: InferenceRequest) -> None:
        assert self.renderer is not None
        try:
            body = await self._decoded_off_loop(request)
        except errors.RequestError:
            return  # the pod answers what it makes of the body
        route = _RENDER_ROUTES[request.api]
        media = any(
            isinstance(m, Mapping) and isinstance(m.get("content"), list) for m in body.get("messages") or ()
        )
        ids = await self.renderer.render(request.target_model, route, body, multimodal=media)
        if ids is not None:
            request.token_ids = ids
            request.prompt_tokens_estimate = len(ids)

    def _renders_elsewhere(self, request: InferenceRequest) -> bool:
        """Whether a body parser renders this chat: a body over its size, or a chat of more
        messages than the loop renders inline (the small body is decoded here to count them)."""
        parsers = self.body_parsers
        if parsers is None:
            return False
        if parsers.wants(len(request.body_bytes)):
            return True
        messages = self._decoded(request).get("messages")
        return isinstance(messages, list) and len(messages) > RENDER_INLINE_MESSAGES

    async def _encode_chat_elsewhere(
        self, request: InferenceRequest, tokenizer: PromptTokenizer, base_model: str | None
    ) -> list[int] | None:
        assert self.body_parsers is not None
        model = request.target_model
        template = tokenizer.chat_template_for(model, base_model=base_model)
        if template is None:
            return None
        prepared = await self.body_parsers.prepare_chat(
            template, request.body_bytes, self.limits, tokenizer.max_chars, kept=request.kept_body_key or None
        )
        request.chat_flags = (prepared.forwards_ids, prepared.add_special_tokens)
        return await tokenizer.encode_prompt(model, prepared.prompt, base_model=base_model)

    async def _decoded_off_loop(self, request: InferenceRequest) -> Mapping[str, Any]:
        """`_decoded`, in a thread for a large body: the depth walk is Python the loop can
        preempt there (msgspec's decode itself holds the GIL either way). The long contents the
        parse decoded already (`known_strings`) are not decoded again, so they do not count."""
        if request.body is None and _to_decode(request) > _DECODE_INLINE_BYTES:
            request.body = await asyncio.to_thread(
                decode_body, request.body_bytes, self.limits, request.known_strings
            )
        return self._decoded(request)

    def _decoded(self, request: InferenceRequest) -> Mapping[str, Any]:
        """The body as plain objects, decoded once per request and depth-checked (400s)."""
        if request.body is None:
            request.body = decode_body(request.body_bytes, self.limits, request.known_strings)
        return request.body


_DECODE_INLINE_BYTES = 256 << 10  # ~0.3 ms to decode: less than a hand-off to a thread costs


def _to_decode(request: InferenceRequest) -> int:
    """The bytes of the body `decode_body` decodes: all but the known strings' (when they apply)."""
    size = len(request.body_bytes)
    known = request.known_strings
    if known is not None and known.body is request.body_bytes:
        size -= sum(end - start for _, start, end, _ in known.spans)
    return size


def _adds_special_tokens(request: InferenceRequest) -> bool:
    """Whether the tokenizer added special tokens to the request's text (chat: only when asked)."""
    if request.chat_flags is not None:
        return request.chat_flags[1]
    return request.add_special_tokens


_PLAIN = frozenset((Api.COMPLETIONS, Api.EMBEDDINGS))
_RENDER_ROUTES = {
    Api.CHAT: render.CHAT,
    Api.COMPLETIONS: render.COMPLETIONS,
    Api.MESSAGES: render.MESSAGES,
    Api.RESPONSES: render.RESPONSES,
}


def dialect_of(request: InferenceRequest) -> Dialect | None:
    """How vLLM renders the request's prompt: with a chat template (a `Dialect`), or None."""
    return for_route(request.api.value, request.render)
