"""Every request vLLM renders with a chat template, as one chat prompt: `prepare(tok, dialect, body)`.

vLLM renders four APIs through its chat pipeline: chat completions itself, Anthropic's Messages
(and count_tokens), and OpenAI's Responses; each `/render` route renders like its API. The other
two are converted into a chat request first (`epp.tokenize.anthropic`, `epp.tokenize.responses`),
then rendered as chat (`epp.tokenize.chat.prepare_chat`). What differs between a route and its
render twin:

- `/v1/messages` and `count_tokens` map `thinking: disabled` to the effort the template tells
  apart from the others (`anthropic.disabled_thinking_effort`, probed once per template);
  `/v1/messages/render` always says "none";
- `/v1/responses/render` refuses `previous_response_id`, `/v1/responses` looks it up in its store.

Whether inline system messages are merged depends on the template (`anthropic.merge_inline_system`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from epp.tokenize import anthropic, responses
from epp.tokenize.chat import (
    ChatPrompt,
    ChatTemplated,
    add_special_tokens,
    forwards_ids,
    prepare_chat,
    render_chat,
)
from epp.tokenize.chat_request import ChatTemplateError


class Dialect(enum.Enum):
    CHAT = "chat"
    MESSAGES = "messages"
    MESSAGES_RENDER = "messages/render"
    COUNT_TOKENS = "messages/count_tokens"
    RESPONSES = "responses"
    RESPONSES_RENDER = "responses/render"


# The dialect of each (API, render) pair, keyed by `epp.api.routes.Api`'s values (the tokenize
# package imports nothing of epp.api).
_BY_ROUTE = {
    ("chat/completions", False): Dialect.CHAT,
    ("chat/completions", True): Dialect.CHAT,
    ("messages", False): Dialect.MESSAGES,
    ("messages", True): Dialect.MESSAGES_RENDER,
    ("messages/count_tokens", False): Dialect.COUNT_TOKENS,
    ("responses", False): Dialect.RESPONSES,
    ("responses", True): Dialect.RESPONSES_RENDER,
}


def for_route(api: str, render: bool) -> Dialect | None:
    """How vLLM renders the prompt of a request to `api` (an `Api` value): with the chat template
    in this dialect, or None (a prompt tokenized as it is, or ids given)."""
    return _BY_ROUTE.get((api, render))


@dataclasses.dataclass(frozen=True, slots=True)
class Prepared:
    """A request's chat prompt and the facts of its chat body the director reads."""

    prompt: ChatPrompt
    forwards_ids: bool  # the prompt is ids forwarded in the body (never truncated)
    add_special_tokens: bool  # the text is encoded with special tokens (truncation keeps them)


def prepare(tok: ChatTemplated, dialect: Dialect, body: Mapping[str, Any]) -> Prepared:
    """The prompt vLLM builds for a decoded `body` of `dialect`.

    Raises:
        ChatTemplateError: vLLM refuses the request (400); `anthropic_request.RequestModelError` when its
            request model does (OpenAI's error shape on the Anthropic routes).
        UnsupportedChat: epp does not model part of the request (route without token ids).
    """
    checked = dialect is not Dialect.CHAT
    if dialect is Dialect.CHAT:
        chat = body
    elif dialect in (Dialect.RESPONSES, Dialect.RESPONSES_RENDER):
        chat = responses.to_chat(body, render=dialect is Dialect.RESPONSES_RENDER).body
    else:
        effort = "none"
        thinking = body.get("thinking") if isinstance(body, Mapping) else None
        disabled = isinstance(thinking, Mapping) and thinking.get("type") == "disabled"
        if disabled and dialect is not Dialect.MESSAGES_RENDER:
            effort = _disabled_effort(tok)
        chat = anthropic.to_chat(
            body,
            count_tokens=dialect is Dialect.COUNT_TOKENS,
            merge_inline_system=anthropic.merge_inline_system(tok.chat_template),
            disabled_thinking_effort=effort,
        ).body
    prompt = prepare_chat(tok, chat, checked=checked)
    return Prepared(prompt, forwards_ids(chat), prompt.add_special_tokens or add_special_tokens(chat))


_EFFORTS: dict[tuple[Any, ...], str] = {}  # per template: what thinking "disabled" becomes
_EFFORTS_KEPT = 64  # templates remembered (one or two per model)


def _disabled_effort(tok: ChatTemplated) -> str:
    key = (tok.chat_template, tuple(sorted((k, str(v)) for k, v in tok.special_tokens.items())))
    found = _EFFORTS.get(key)
    if found is None:

        def render(effort: str) -> str | None:
            try:
                return render_chat(
                    tok, {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": effort}
                )
            except ChatTemplateError:
                return None

        found = anthropic.disabled_thinking_effort(render)
        if len(_EFFORTS) >= _EFFORTS_KEPT:
            _EFFORTS.clear()
        _EFFORTS[key] = found
    return found
