"""Chat requests rendered with the model's chat template, the way vLLM's chat endpoint renders them.

vLLM does not hand the request body to the template as it came: its request model validates and
reshapes it, and its chat preprocessing rebuilds every message (reference:
/work/shared/reference/vllm-chat-preprocessing.md; vLLM 0.32's entrypoints/openai/chat_completion/
protocol.py, renderers/chat_utils.py, hf.py, params.py; transformers 5's render_jinja_template).
Those changes move the token ids. `prepare_chat` repeats them, in this order (each rule has a test
in tests/tokenize/test_chat_vllm_rules.py, and the differential run against real vLLM,
e2e/vllm/differential.py, checks them together):

0. Ids forwarded in `kv_transfer_params.prompt_token_ids` are the prompt as they are (no
   template, no tokenizer), unless `echo` is set or a message has non-text parts.
1. What vLLM's request model refuses (400): a `name` that is not a string; null content except on
   an assistant message (whose tool_calls are then not null); content neither string, list nor
   null; parts its request model does not accept on a user, assistant, system or developer
   message (`parts_pass`: observed, pydantic's choice among the message shapes); a tool call
   without a string `id`, `type` "function", or a function with string `name` and `arguments`;
   `tools: []`, a tool of another type, a description that is not a string, parameters that are
   not an object; a `tool_choice` other than "none" without tools, an unknown one, a named one
   naming no tool; an unknown `reasoning_effort`; `documents` that are not objects of strings;
   `add_generation_prompt` / `continue_final_message` that are not booleans as pydantic reads them
   ("false", "off", 0 ... are false; null is refused), or both true (tested on the raw values, so
   "false" counts as true there); no messages.
2. Messages are rebuilt with only the keys vLLM keeps: `role`, `content`, `name`, `task` (strings),
   and per role `tool_calls`, `reasoning` + `reasoning_content` (assistant), `tool_call_id` (tool),
   `tools` (developer). `reasoning_content` is the older name of `reasoning`: it fills a reasoning
   that is absent or null. A system message's first line naming Claude Code's billing header
   (`x-anthropic-billing-header`) is dropped.
3. Content goes to the template in the template's *content format*:
   - "string": a null content becomes "", a list of parts becomes its non-empty texts joined by
     "\\n" (a text part's text, a refusal's refusal, a thinking part's thinking);
   - "openai": a string becomes `[{"type": "text", "text": s}]`, parts become
     `{"type": "text", "text": ...}` plus any keys no vLLM part type declares (empty texts kept),
     a null content becomes `[]`.
   A tool message whose parts are all text gets them joined by "\\n" in either format. Media
   parts (image, audio, video, embeddings) are refused: their placeholders are model-specific,
   so epp cannot know the ids. An unknown part type is refused, as vLLM answers 400.
4. Tool calls get the key order of vLLM's validated dicts (id, function, type; arguments, name;
   other keys after), and `arguments` is parsed into an object, so the template re-serialises
   it; invalid JSON, an empty string, or anything but an object becomes `{}`. An empty
   `tool_calls` list is dropped.
5. `tools` are rebuilt as `{"type", "function": {"name", "description", "parameters"[, "strict"]
   [, "defer_loading"]}[, "defer_loading"]}`, a missing description or parameters as null,
   unknown keys dropped.
6. When the template never quotes "developer" ('developer' or "developer"), developer messages
   become system messages, and all system messages merge into one first message whose
   non-empty texts are joined by "\\n\\n" (only when there is more than one, or it is not first).
7. Template variables, merged in vLLM's order (`template_kwargs`): the body's
   `chat_template_kwargs`, overridden by the request's own `add_generation_prompt`,
   `continue_final_message`, `documents` and `reasoning_effort` (the last two when set) and by
   `enable_thinking` = `reasoning_effort != "none"` (when reasoning_effort is set and the kwargs
   do not name it); under all of that the tools; a null or "auto" value counts as unset, so such
   a kwarg is undefined in the template (as is reasoning_effort when unset). The tokenizer's
   special-token strings (`bos_token`, ...) lie under the kwargs. `tools` and `documents` must
   then be lists of objects. `tokenize` in the kwargs makes vLLM take apply_chat_template's ids,
   which have no special tokens added.
8. `continue_final_message` as transformers 5 does it: a tag is appended to the final message's
   content (its last part with a text) and the rendering is cut where the tag lands, trailing
   whitespace stripped if the template did not keep the tag's space.

Content format ("auto" detection, the rule vLLM applies): a template is "openai" when it has a
`for` loop over a message's content - `message['content']` or `message.content`, possibly
sliced or through a filter, where `message` is a loop variable over `messages` (or over a name
set from `messages`) - or a loop over a variable named `content`. Everything else is "string",
including templates that only test `content is string` or index the content without a loop.

The Jinja environment is the one transformers builds for chat templates: sandboxed and
immutable, `trim_blocks` and `lstrip_blocks`, the loop controls (`break`/`continue`), a
`{% generation %}` block that renders its body, `raise_exception(message)`, `strftime_now(format)`
and a `tojson` filter without HTML escaping (ensure_ascii off; indent, separators and sort_keys
accepted). Each template source is compiled once and cached.

Every failure (no template, a malformed body, a template that raises) is a `ChatTemplateError`;
vLLM answers such requests with 400, and epp routes them without token ids.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

from epp.tokenize import tokenizer
from epp.tokenize.chat_request import (
    MEDIA_KEYS,
    TEMPLATE_PARAMETERS,
    TEXT_PART_KEYS,
    TOKENIZE_OPTIONS,
    check_request,
    cut_at_tag,
    generation_flags,
    lax_bool,
    list_of_objects,
    merge_system,
    reshape_message,
    reshape_tools,
    tag_final,
    template_kwargs,
)

# Re-exported (the `as` form, for mypy --strict): callers catch chat.ChatTemplateError.
from epp.tokenize.chat_request import (
    ChatTemplateError as ChatTemplateError,
)
from epp.tokenize.chat_request import (
    ContentFormat as ContentFormat,
)
from epp.tokenize.chat_request import (
    UnsupportedChat as UnsupportedChat,
)

TEMPLATE_CACHE_SIZE = 64  # distinct template sources compiled and kept (one or two per model)


class ChatTemplated(Protocol):
    """What rendering reads of a tokenizer: a `tokenizer.Tokenizer`, or its picklable part that a
    body-parser process renders with (`epp.requestcontrol.offload`)."""

    @property
    def name(self) -> str: ...

    @property
    def chat_template(self) -> str | None: ...

    @property
    def special_tokens(self) -> Mapping[str, str | list[str]]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledTemplate:
    """A chat template compiled once, with what vLLM decides from its source."""

    template: jinja2.Template
    content_format: ContentFormat
    supports_developer: bool  # the source quotes "developer": developer messages are kept as they are


# --- the Jinja environment -----------------------------------------------------------------------


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant text with it (for
    training masks); for a prompt it renders its body unchanged. Without it such templates fail
    to compile."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template: {message}")


def _strftime_now(fmt: str) -> str:
    # Templates that print today's date (Llama 3.x) make the prompt depend on the day, in vLLM too.
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt's text.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


@functools.lru_cache(maxsize=TEMPLATE_CACHE_SIZE)
def compile_template(source: str) -> CompiledTemplate:
    """Compile a chat template (cached by source). Raises ChatTemplateError if it does not parse."""
    try:
        ast = _ENV.parse(source)
        template = _ENV.from_string(ast)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {e}") from e
    return CompiledTemplate(
        template=template,
        content_format=detect_content_format(ast),
        supports_developer="'developer'" in source or '"developer"' in source,
    )


# --- content format detection ---------------------------------------------------------------------


def detect_content_format(ast: jinja2.nodes.Template) -> ContentFormat:
    """ "openai" if the template loops over a message's content, else "string" (module docstring)."""
    message_names = set(_loop_targets(ast, _names_set_from(ast, "messages"), key=None))
    for loop in ast.find_all(jinja2.nodes.For):
        if isinstance(loop.iter, jinja2.nodes.Name) and loop.iter.name == "content":
            return "openai"
        if any(_reads(loop.iter, name, "content") for name in message_names):
            return "openai"
    return "string"


def _names_set_from(ast: jinja2.nodes.Template, root: str) -> set[str]:
    """`root` and every name assigned from it, or from such a name, directly or sliced/filtered."""
    names = {root}
    pending = [root]
    while pending:
        source = pending.pop()
        for assign in ast.find_all(jinja2.nodes.Assign):
            target = assign.target
            fresh = isinstance(target, jinja2.nodes.Name) and target.name not in names
            if fresh and _reads(assign.node, source, None):
                assert isinstance(target, jinja2.nodes.Name)
                names.add(target.name)
                pending.append(target.name)
    return names


def _loop_targets(ast: jinja2.nodes.Template, sources: set[str], *, key: str | None) -> Iterator[str]:
    for loop in ast.find_all(jinja2.nodes.For):
        if isinstance(loop.target, jinja2.nodes.Name) and any(_reads(loop.iter, s, key) for s in sources):
            yield loop.target.name


def _reads(node: jinja2.nodes.Node, name: str, key: str | None) -> bool:
    """Whether `node` is `name` (or `name[key]` / `name.key`), possibly sliced, filtered or tested."""
    while True:
        wrapped = isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)) and node.node is not None
        sliced = isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice)
        if not (wrapped or sliced):
            break
        node = node.node  # type: ignore[attr-defined]
    if key is None:
        return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name
    if isinstance(node, jinja2.nodes.Getitem):
        if not (isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key):
            return False
    elif isinstance(node, jinja2.nodes.Getattr):
        if node.attr != key:
            return False
    else:
        return False
    inner = node.node
    return isinstance(inner, jinja2.nodes.Name) and inner.ctx == "load" and inner.name == name


# --- rendering ------------------------------------------------------------------------------------


def render_chat(tok: ChatTemplated, body: Mapping[str, Any], *, checked: bool = False) -> str:
    """The prompt text vLLM's chat endpoint renders for `body` (a decoded chat completions body).

    Raises:
        ChatTemplateError: the tokenizer has no chat template, the body is not a chat request
            vLLM would accept, or the template fails (raise_exception, an undefined operation).
    """
    return _render(tok, body, checked)[0]


def _render(tok: ChatTemplated, body: Mapping[str, Any], checked: bool = False) -> tuple[str, bool]:
    """The rendered text, and whether vLLM tokenizes it the way apply_chat_template does
    (`tokenize` set in chat_template_kwargs: no special tokens added, whatever the body says)."""
    if tok.chat_template is None:
        raise UnsupportedChat(f"tokenizer {tok.name!r} has no chat template")
    compiled = compile_template(tok.chat_template)
    fmt = compiled.content_format

    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list):
        raise ChatTemplateError("messages must be a list")
    if not raw_messages:
        raise ChatTemplateError("messages must not be empty")
    if not checked:
        check_request(body)
    messages = [reshape_message(m, fmt, i, parts_checked=checked) for i, m in enumerate(raw_messages)]
    if not compiled.supports_developer and any(m["role"] == "developer" for m in messages):
        messages = merge_system(messages)

    add_generation_prompt, continue_final_message = generation_flags(body)
    if add_generation_prompt and continue_final_message:
        raise ChatTemplateError("add_generation_prompt and continue_final_message cannot both be true")
    kwargs = template_kwargs(
        body,
        reshape_tools(body.get("tools"), allow_empty=checked),
        add_generation_prompt,
        continue_final_message,
    )
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    add_generation_prompt = kwargs.pop("add_generation_prompt")
    continue_final_message = kwargs.pop("continue_final_message")
    tokenize = kwargs.pop("tokenize", False)
    if tokenize and TOKENIZE_OPTIONS & kwargs.keys():
        raise UnsupportedChat(
            f"chat_template_kwargs {sorted(TOKENIZE_OPTIONS & kwargs.keys())} with tokenize"
        )
    for name in TEMPLATE_PARAMETERS:
        kwargs.pop(name, None)  # apply_chat_template's own parameters never reach the template
    # transformers' render_jinja_template walks both (a kwarg may have replaced the request's):
    # every item must be an object, and the tools reach the template as a new list.
    if tools is not None:
        tools = list_of_objects(tools, "tools")
    if documents is not None:
        list_of_objects(documents, "documents")
    final_text = ""
    if continue_final_message:
        messages[-1], final_text = tag_final(messages[-1], tok.chat_template)
    variables: dict[str, Any] = {**tok.special_tokens, **kwargs}
    try:
        text = compiled.template.render(
            messages=messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except ChatTemplateError:
        raise
    except Exception as e:  # a template can fail in any way (undefined calls, type errors, sandbox)
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
    if continue_final_message:
        text = cut_at_tag(text, final_text)
    return text, bool(tokenize)


@dataclasses.dataclass(frozen=True, slots=True)
class ChatPrompt:
    """What vLLM's chat endpoint feeds its engine for a body: `text` to encode (with special
    tokens added or not), or `token_ids` forwarded in the body that vLLM takes as they are."""

    text: str = ""
    add_special_tokens: bool = False
    token_ids: list[int] | None = None


def prepare_chat(tok: ChatTemplated, body: Mapping[str, Any], *, checked: bool = False) -> ChatPrompt:
    """The prompt vLLM's chat endpoint builds for `body`, before encoding.

    `checked`: the body is a chat request epp built from another API's body (Anthropic's
    Messages, OpenAI's Responses: `epp.tokenize.dialects`), whose own request model vLLM
    validated instead; the chat request model's checks (tool_choice against tools, `tools: []`,
    which parts a message shape accepts) did not run on it in vLLM, and do not here.

    `kv_transfer_params.prompt_token_ids` (disaggregated serving: the prefill stage's ids) are
    taken as they are, without rendering, unless the body sets `echo` or a message has non-text
    parts (vLLM's online_renderer._reused_prompt_token_ids); the request model's own checks still
    apply. With `tokenize` in chat_template_kwargs vLLM gets ids from apply_chat_template, which
    adds no special tokens whatever `add_special_tokens` says.

    Raises:
        ChatTemplateError: as `render_chat`; forwarded ids that are not a non-empty list of
            non-negative integers.
    """
    forwarded = _forwarded_ids(body)
    if forwarded is not None:
        # Nothing is rendered, but vLLM's request model still validates the whole body.
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ChatTemplateError("messages must be a list")
        if not checked:
            check_request(body)
        generation_flags(body)
        reshape_tools(body.get("tools"), allow_empty=checked)
        for i, message in enumerate(messages):
            # Parts are checked lazily (OpenAI's shape validates them as they are read), and
            # nothing reads them here.
            reshape_message(message, "string", i, read_parts=False)
        return ChatPrompt(token_ids=forwarded)
    text, tokenized = _render(tok, body, checked)
    return ChatPrompt(text=text, add_special_tokens=not tokenized and add_special_tokens(body))


def encode_chat(tok: tokenizer.Tokenizer, body: Mapping[str, Any]) -> list[int]:
    """The prompt token ids vLLM computes for a chat body (`prepare_chat`, then encoded).

    Raises:
        ChatTemplateError: as `prepare_chat`.
    """
    prompt = prepare_chat(tok, body)
    if prompt.token_ids is not None:
        return prompt.token_ids
    return tok.encode(prompt.text, add_special_tokens=prompt.add_special_tokens)


def forwards_ids(body: Mapping[str, Any]) -> bool:
    """Whether vLLM takes the body's forwarded `kv_transfer_params.prompt_token_ids` as the prompt
    (see `prepare_chat`); such ids are not truncated (`truncate_prompt_tokens`) either."""
    try:
        return _forwarded_ids(body) is not None
    except ChatTemplateError:
        return False


def _forwarded_ids(body: Mapping[str, Any]) -> list[int] | None:
    params = body.get("kv_transfer_params")
    if not isinstance(params, Mapping) or params.get("prompt_token_ids") is None:
        return None
    if lax_bool(body.get("echo", False)) or _has_non_text(body.get("messages")):
        return None  # vLLM renders the messages then
    ids = params["prompt_token_ids"]
    # bool is an int: vLLM checks the exact type
    # (ids past int64 are out of any vocabulary, and would not fit the block hashes)
    if not isinstance(ids, list) or not ids or any(type(i) is not int or not 0 <= i < _ID_END for i in ids):
        raise ChatTemplateError("kv_transfer_params.prompt_token_ids must be a non-empty list of ids")
    return list(ids)


_ID_END = 1 << 63


def _has_non_text(messages: Any) -> bool:
    """vLLM's has_non_text_content: a part with a media key, or of a type that is not text."""
    if not isinstance(messages, list):
        return False
    text_types = {*TEXT_PART_KEYS, "tool_reference"}
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type", "text")
            if any(key in part for key in MEDIA_KEYS) or not isinstance(kind, str) or kind not in text_types:
                return True
    return False


def add_special_tokens(body: Mapping[str, Any]) -> bool:
    """vLLM's chat default is False: the template already writes BOS, and True may add a second.
    Read as pydantic reads a boolean ("true", "yes", 1... are true)."""
    value = body.get("add_special_tokens", False)
    return lax_bool(value) is True
