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
   message (`_parts_pass`: observed, pydantic's choice among the message shapes); a tool call
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
7. Template variables, merged in vLLM's order (`_template_kwargs`): the body's
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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

from epp.tokenize import tokenizer

ContentFormat = Literal["string", "openai"]

TEMPLATE_CACHE_SIZE = 64  # distinct template sources compiled and kept (one or two per model)

# Part types whose text goes into the prompt, and the key holding it.
_TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
# vLLM skips these when their text is null; the other text types pass null on.
_SKIP_NULL_TYPES = frozenset({"text", "refusal"})
_MEDIA_KEYS = (
    "image_url",
    "input_image",
    "image_pil",
    "image_embeds",
    "audio_url",
    "input_audio",
    "audio_embeds",
    "video_url",
    "video_embeds",
    "prompt_embeds",
)
_MEDIA_TYPES = frozenset(_MEDIA_KEYS)


class ChatTemplateError(Exception):
    """The request cannot be rendered as vLLM would render it; vLLM answers it with 400."""


class UnsupportedChat(ChatTemplateError):
    """epp cannot render this request, though vLLM may well serve it (media parts, whose
    placeholders depend on the model's processor; a tokenizer without a chat template): route it
    without token ids rather than refuse it."""


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


def render_chat(tok: tokenizer.Tokenizer, body: Mapping[str, Any]) -> str:
    """The prompt text vLLM's chat endpoint renders for `body` (a decoded chat completions body).

    Raises:
        ChatTemplateError: the tokenizer has no chat template, the body is not a chat request
            vLLM would accept, or the template fails (raise_exception, an undefined operation).
    """
    return _render(tok, body)[0]


def _render(tok: tokenizer.Tokenizer, body: Mapping[str, Any]) -> tuple[str, bool]:
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
    _check_request(body)
    messages = [_message(m, fmt, i) for i, m in enumerate(raw_messages)]
    if not compiled.supports_developer and any(m["role"] == "developer" for m in messages):
        messages = _merge_system(messages)

    add_generation_prompt, continue_final_message = _generation_flags(body)
    if add_generation_prompt and continue_final_message:
        raise ChatTemplateError("add_generation_prompt and continue_final_message cannot both be true")
    kwargs = _template_kwargs(body, _tools(body.get("tools")), add_generation_prompt, continue_final_message)
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    add_generation_prompt = kwargs.pop("add_generation_prompt")
    continue_final_message = kwargs.pop("continue_final_message")
    tokenize = kwargs.pop("tokenize", False)
    if tokenize and _TOKENIZE_OPTIONS & kwargs.keys():
        raise UnsupportedChat(
            f"chat_template_kwargs {sorted(_TOKENIZE_OPTIONS & kwargs.keys())} with tokenize"
        )
    for name in _TEMPLATE_PARAMETERS:
        kwargs.pop(name, None)  # apply_chat_template's own parameters never reach the template
    # transformers' render_jinja_template walks both (a kwarg may have replaced the request's):
    # every item must be an object, and the tools reach the template as a new list.
    if tools is not None:
        tools = _objects(tools, "tools")
    if documents is not None:
        _objects(documents, "documents")
    final_text = ""
    if continue_final_message:
        messages[-1], final_text = _tag_final(messages[-1], tok.chat_template)
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
        text = _cut_at_tag(text, final_text)
    return text, bool(tokenize)


@dataclasses.dataclass(frozen=True, slots=True)
class ChatPrompt:
    """What vLLM's chat endpoint feeds its engine for a body: `text` to encode (with special
    tokens added or not), or `token_ids` forwarded in the body that vLLM takes as they are."""

    text: str = ""
    add_special_tokens: bool = False
    token_ids: list[int] | None = None


def prepare_chat(tok: tokenizer.Tokenizer, body: Mapping[str, Any]) -> ChatPrompt:
    """The prompt vLLM's chat endpoint builds for `body`, before encoding.

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
        _check_request(body)
        _generation_flags(body)
        _tools(body.get("tools"))
        for i, message in enumerate(messages):
            # Parts are checked lazily (OpenAI's shape validates them as they are read), and
            # nothing reads them here.
            _message(message, "string", i, read_parts=False)
        return ChatPrompt(token_ids=forwarded)
    text, tokenized = _render(tok, body)
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
    if _lax_bool(body.get("echo", False)) or _has_non_text(body.get("messages")):
        return None  # vLLM renders the messages then
    ids = params["prompt_token_ids"]
    # bool is an int: vLLM checks the exact type
    if not isinstance(ids, list) or not ids or any(type(i) is not int or i < 0 for i in ids):
        raise ChatTemplateError("kv_transfer_params.prompt_token_ids must be a non-empty list of ids")
    return list(ids)


def _has_non_text(messages: Any) -> bool:
    """vLLM's has_non_text_content: a part with a media key, or of a type that is not text."""
    if not isinstance(messages, list):
        return False
    text_types = {*_TEXT_PART_KEYS, "tool_reference"}
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type", "text")
            if any(key in part for key in _MEDIA_KEYS) or not isinstance(kind, str) or kind not in text_types:
                return True
    return False


def add_special_tokens(body: Mapping[str, Any]) -> bool:
    """vLLM's chat default is False: the template already writes BOS, and True may add a second.
    Read as pydantic reads a boolean ("true", "yes", 1... are true)."""
    value = body.get("add_special_tokens", False)
    return _lax_bool(value) is True


# --- the request's own fields ---------------------------------------------------------------------

# Pydantic's lax booleans (vLLM's request model): these strings (any case) and 0/1 are accepted.
_TRUE_STRINGS = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_STRINGS = frozenset({"0", "off", "f", "false", "n", "no"})
_REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
_TOOL_CHOICES = frozenset({"none", "auto", "required"})
# vLLM's merge of template kwargs (renderers/params.py merge_kwargs) skips these values.
_UNSET = (None, "auto")
# apply_chat_template's parameters (transformers 5): a kwarg of one of these names is taken by the
# call, not given to the template. With `tokenize` these change the ids in ways epp does not model.
_TEMPLATE_PARAMETERS = frozenset(
    {"chat_template", "return_dict", "return_assistant_tokens_mask", "padding", "truncation",
     "max_length", "return_tensors", "tokenizer_kwargs"}
)  # fmt: skip
_TOKENIZE_OPTIONS = frozenset({"padding", "truncation", "max_length", "return_tensors", "tokenizer_kwargs"})


def _lax_bool(value: Any) -> bool | None:
    """A boolean as pydantic's lax mode reads it, or None if it is not one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, float) and value in (0.0, 1.0):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_STRINGS:
            return True
        if word in _FALSE_STRINGS:
            return False
    return None


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    if name not in body:
        return default
    value = _lax_bool(body[name])
    if value is None:  # null included: vLLM's field is a plain bool
        raise ChatTemplateError(f"{name} must be a boolean")
    return value


def _generation_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """add_generation_prompt and continue_final_message. vLLM's check_generation_prompt tests the
    raw values' truth, before they are read as booleans: "false" is a true string there."""
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise ChatTemplateError("add_generation_prompt and continue_final_message cannot both be true")
    return _flag(body, "add_generation_prompt", True), _flag(body, "continue_final_message", False)


def _check_request(body: Mapping[str, Any]) -> None:
    """The checks of vLLM's request model that epp can see being failed (vLLM answers 400)."""
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in _REASONING_EFFORTS:
        raise ChatTemplateError(f"reasoning_effort must be one of {sorted(_REASONING_EFFORTS)}")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ChatTemplateError("chat_template_kwargs must be an object")
    documents = body.get("documents")
    if documents is not None and not (
        isinstance(documents, list)
        and all(isinstance(d, Mapping) and all(isinstance(v, str) for v in d.values()) for d in documents)
    ):
        raise ChatTemplateError("documents must be a list of objects of strings")
    _check_tool_choice(body)


def _check_tool_choice(body: Mapping[str, Any]) -> None:
    """vLLM's check_tool_usage: a tool_choice other than "none" needs tools, and a named one
    must name one of them."""
    tools = body.get("tools")
    if tools == []:
        raise ChatTemplateError("tools must not be empty")  # vLLM's chat endpoint refuses []
    choice = body.get("tool_choice", "auto" if tools else None)
    if choice is None or choice == "none":
        return
    if tools is None:
        raise ChatTemplateError("tool_choice needs tools")
    if isinstance(choice, Mapping):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ChatTemplateError("tool_choice.function must have a name")
        if not any(isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)
                   and t["function"].get("name") == name for t in tools):  # fmt: skip
            raise ChatTemplateError("tool_choice names none of the tools")
    elif choice not in _TOOL_CHOICES:
        raise ChatTemplateError('tool_choice must be "none", "auto", "required" or a named tool')


def _template_kwargs(
    body: Mapping[str, Any],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    continue_final_message: bool,
) -> dict[str, Any]:
    """What vLLM hands apply_chat_template besides the messages, merged in vLLM's order
    (ChatCompletionRequest.build_chat_params, ChatParams.with_defaults, merge_kwargs):

    1. the body's chat_template_kwargs, overridden by the request's own add_generation_prompt,
       continue_final_message, documents and reasoning_effort (the last two only when set), and
       by `enable_thinking` = reasoning_effort != "none" when reasoning_effort is set and the
       kwargs do not name enable_thinking;
    2. under all of that, the tools (when given) and tokenize=False;
    3. in both merges a value null or "auto" counts as unset: such a kwarg is dropped (so the
       template sees it undefined), and `reasoning_effort` is only defined when set.

    `messages` and `conversation` in the kwargs collide with the call's own arguments (400);
    `chat_template` there is refused like a request template vLLM does not trust.
    """
    user = body.get("chat_template_kwargs") or {}
    if "chat_template" in user:
        raise ChatTemplateError("chat_template_kwargs may not set chat_template")
    effort = body.get("reasoning_effort")
    own: dict[str, Any] = {
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        "documents": body.get("documents"),
        "reasoning_effort": effort,
    }
    if effort is not None and "enable_thinking" not in user:
        own["enable_thinking"] = effort != "none"
    merged = {**user, **{k: v for k, v in own.items() if not _unset(v)}}
    defaults: dict[str, Any] = {"tokenize": False}
    if tools is not None:
        defaults["tools"] = tools
    out = {**defaults, **{k: v for k, v in merged.items() if not _unset(v)}}
    clash = {"messages", "conversation"} & out.keys()
    if clash:
        raise ChatTemplateError(f"chat_template_kwargs may not set {sorted(clash)}")
    return out


def _objects(value: Any, what: str) -> list[Any]:
    try:
        items = list(value)
    except TypeError:
        raise ChatTemplateError(f"{what} must be a list of objects") from None
    if not all(isinstance(item, Mapping) for item in items):
        raise ChatTemplateError(f"{what} must be a list of objects")
    return items


def _unset(value: Any) -> bool:
    return any(value is u or (type(value) is type(u) and value == u) for u in _UNSET)


# --- message preprocessing ------------------------------------------------------------------------

# Keys of vLLM's content-part types (chat_utils._KNOWN_CONTENT_PART_FIELDS): any other key of a text
# part is passed on to an "openai"-format template beside type and text.
_KNOWN_PART_KEYS = frozenset(
    {"audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil", "image_url",
     "input_audio", "name", "prompt_cache_breakpoint", "refusal", "text", "thinking", "type", "uuid",
     "video_embeds", "video_url"}
)  # fmt: skip
# Claude Code's attribution line: vLLM drops it from system messages (its value changes on every
# request, which would defeat the prefix cache).
_BILLING_HEADER = "x-anthropic-billing-header"


def _message(raw: Any, fmt: ContentFormat, index: int, *, read_parts: bool = True) -> dict[str, Any]:
    """One message as vLLM's request model validates it and chat_utils rebuilds it."""
    where = f"messages[{index}]"
    if not isinstance(raw, Mapping):
        raise ChatTemplateError(f"{where} must be an object")
    role = raw.get("role")
    if not isinstance(role, str):
        raise ChatTemplateError(f"{where}.role must be a string")
    # `reasoning_content` is the older name of `reasoning`: moved over when reasoning is absent or
    # null, dropped otherwise (ChatCompletionRequest._normalize_messages_before).
    if raw.get("reasoning") is None and raw.get("reasoning_content") is not None:
        raw = {**raw, "reasoning": raw["reasoning_content"]}
    if "name" in raw and not isinstance(raw["name"], str):
        raise ChatTemplateError(f"{where}.name must be a string")
    content = raw.get("content")
    if content is None:
        # Absent content is an empty one; null is accepted only on an assistant message, and
        # there only if its tool_calls are not null too (OpenAI's assistant message shape).
        if "content" in raw and (role != "assistant" or ("tool_calls" in raw and raw["tool_calls"] is None)):
            raise ChatTemplateError(f"{where}.content must not be null")
        parts: Sequence[Any] = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        if read_parts and role in _OPENAI_ROLES and not _parts_pass(content, raw):
            raise ChatTemplateError(f"{where}.content: parts not valid for a {role} message")
        parts = content
    else:
        raise ChatTemplateError(f"{where}.content must be a string, a list of parts or null")
    if role == "system":
        parts = _strip_billing_header(parts)
    reasoning = raw.get("reasoning")

    out: dict[str, Any] = {"role": role, "content": _content(parts, fmt, index) if read_parts else None}
    if role == "assistant":
        calls = raw.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise ChatTemplateError(f"{where}.tool_calls must be a list")
            if calls:  # an empty list is dropped so templates take their plain assistant path
                out["tool_calls"] = [_tool_call(c, index) for c in calls]
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in raw:
            call_id = raw["tool_call_id"]
            if call_id is not None and not isinstance(call_id, str):
                raise ChatTemplateError(f"{where}.tool_call_id must be a string")
            out["tool_call_id"] = call_id
        body = out["content"]
        if isinstance(body, list) and all(p.get("type") == "text" for p in body):
            # Tool results as text parts are joined in every format: most templates expect a string.
            out["content"] = "\n".join(p.get("text", "") for p in body)
    name = raw.get("name")
    if isinstance(name, str):
        out["name"] = name
    task = raw.get("task")
    if isinstance(task, str):
        out["task"] = task
    if role == "developer":
        out["tools"] = _developer_tools(raw.get("tools"))
    return out


def _developer_tools(tools: Any) -> Any:
    """A developer message's tools as vLLM's request model leaves them: when every tool is a
    function tool its message shape accepts (type "function"; a function with a string name, a
    string description, object parameters, a boolean or null strict, read as pydantic reads
    booleans), the keys are put in that shape's order (function, type; name, description,
    parameters, strict), other keys after; anything else fails that shape, and OpenAI's developer
    message keeps the list as it came."""
    if not isinstance(tools, list) or not all(_function_tool(t) for t in tools):
        return tools
    out = []
    for tool in tools:
        fn = tool["function"]
        function = {k: fn[k] for k in ("name", "description", "parameters", "strict") if k in fn}
        if function.get("strict") is not None:
            function["strict"] = _lax_bool(function["strict"])
        function.update((k, v) for k, v in fn.items() if k not in function)
        ordered = {"function": function, "type": tool["type"]}
        ordered.update((k, v) for k, v in tool.items() if k not in ordered)
        out.append(ordered)
    return out


def _function_tool(tool: Any) -> bool:
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        return False
    fn = tool.get("function")
    return (
        isinstance(fn, Mapping)
        and isinstance(fn.get("name"), str)
        and isinstance(fn.get("description", ""), str)
        and isinstance(fn.get("parameters", {}), Mapping)
        and (fn.get("strict") is None or _lax_bool(fn["strict"]) is not None)
    )


# Roles whose parts vLLM's request model validates against OpenAI's part types (below).
_OPENAI_ROLES = frozenset({"user", "assistant", "system", "developer"})


def _parts_pass(parts: Sequence[Any], message: Mapping[str, Any]) -> bool:
    """Whether vLLM's request model accepts these parts on a user, assistant, system or developer
    message. Observed on vLLM 0.32, where pydantic picks among the message shapes the one with
    the most fields set, OpenAI's before vLLM's own on a tie; OpenAI's validates parts only when
    they are read, against its own part types. So a non-empty list fails unless vLLM's shape wins
    - the message has a field only that shape has (`_VLLM_ONLY_KEYS`), or at least one part is a
    typed part (a text, thinking or refusal part with a string value, a tool reference or a media
    part) - or every part is one of OpenAI's: bare strings, input_text/output_text parts and null
    texts fail on their own and pass beside a typed part."""
    if not parts or any(_typed_part(p) for p in parts):
        return True
    own = _VLLM_ONLY_KEYS[message.get("role")]
    return any(k in message and (message[k] is None or isinstance(message[k], t)) for k, t in own)


# vLLM's own message shape (CustomChatCompletionMessageParam) has these fields that OpenAI's shape
# of the role lacks (`reasoning_content` is renamed to `reasoning` before validation).
_CUSTOM_FIELDS: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("reasoning", str),
    ("task", str),
    ("tools", list),
    ("tool_call_id", str),
    ("tool_calls", list),
)
_VLLM_ONLY_KEYS: dict[Any, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "assistant": tuple(f for f in _CUSTOM_FIELDS if f[0] != "tool_calls"),
    "user": _CUSTOM_FIELDS,
    "system": _CUSTOM_FIELDS,
    "developer": _CUSTOM_FIELDS,
}


def _typed_part(part: Any) -> bool:
    if not isinstance(part, Mapping):
        return False
    kind = part.get("type")
    if kind in ("text", "thinking", "refusal"):
        return isinstance(part.get(kind), str)
    return kind == "tool_reference" or kind in _MEDIA_TYPES


def _strip_billing_header(parts: Sequence[Any]) -> list[Any]:
    """A system message's text parts without a first line naming Claude Code's billing header
    (a part that was only that line is dropped)."""
    out: list[Any] = []
    for part in parts:
        if isinstance(part, str):
            text: Any = part
        elif isinstance(part, Mapping) and part.get("type") == "text":
            text = part.get("text")
        else:
            text = None
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _content(parts: Sequence[Any], fmt: ContentFormat, index: int) -> str | list[dict[str, Any]]:
    texts: list[str] = []
    dicts: list[dict[str, Any]] = []
    for part in parts:
        extra: dict[str, Any] = {}
        if isinstance(part, str):
            kind, value = "text", part
        elif isinstance(part, Mapping):
            kind, value = _part(part, index)
            if value is None and kind in _SKIP_NULL_TYPES:
                continue
            extra = {k: v for k, v in part.items() if k not in _KNOWN_PART_KEYS}
        else:
            raise ChatTemplateError(f"messages[{index}].content: a part must be a string or an object")
        if fmt == "string":
            if value:  # vLLM drops empty texts before joining
                texts.append(value)
        elif kind == "tool_reference":
            dicts.append({"type": "tool_reference", "name": value})
        else:
            dicts.append({"type": "text", "text": value, **extra})
    return "\n".join(texts) if fmt == "string" else dicts


def _part(part: Mapping[str, Any], index: int) -> tuple[str, Any]:
    """A part's kind ("text" or "tool_reference") and its text; media and unknown types raise."""
    kind = part.get("type")
    if kind is None or part.get("uuid") is not None:
        # vLLM then goes by the keys present (a uuid marks a media part).
        if any(key in part for key in _MEDIA_KEYS):
            raise UnsupportedChat(f"messages[{index}].content: media parts are not supported")
        if "tool_reference" in part:
            return "tool_reference", part.get("name")
        raise ChatTemplateError(f"messages[{index}].content: a part has no type")
    if not isinstance(kind, str):
        raise ChatTemplateError(f"messages[{index}].content: a part's type must be a string")
    key = _TEXT_PART_KEYS.get(kind)
    if key is not None:
        return kind, part.get(key)
    if kind == "tool_reference":
        return kind, part.get("name")
    if kind in _MEDIA_TYPES:
        raise UnsupportedChat(f"messages[{index}].content: {kind} parts are not supported")
    raise ChatTemplateError(f"messages[{index}].content: unsupported part type {kind!r}")


def _tool_call(raw: Any, index: int) -> dict[str, Any]:
    """An assistant tool call as vLLM's request model validates it - `id`, `type` "function" and
    `function` {`name`, `arguments`} all required strings, the keys put in that order (id,
    function, type; arguments, name), other keys kept after them - with its arguments parsed."""
    where = f"messages[{index}].tool_calls"
    if not isinstance(raw, Mapping):
        raise ChatTemplateError(f"{where}: each call must be an object")
    fn = raw.get("function")
    if raw.get("type") != "function" or not isinstance(fn, Mapping):
        raise ChatTemplateError(f"{where}: only calls of type function (with a function) are supported")
    if not isinstance(raw.get("id"), str):
        raise ChatTemplateError(f"{where}: each call needs a string id")
    if not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
        raise ChatTemplateError(f"{where}: a function needs a string name and string arguments")
    arguments: Any = None
    if fn["arguments"]:  # vLLM: an empty string is {}
        try:
            arguments = json.loads(fn["arguments"])
        except ValueError:
            arguments = None
    function = {"arguments": arguments if isinstance(arguments, dict) else {}, "name": fn["name"]}
    function.update((k, v) for k, v in fn.items() if k not in function)
    call = {"id": raw["id"], "function": function, "type": "function"}
    call.update((k, v) for k, v in raw.items() if k not in call)
    return call


def _tag_final(final: dict[str, Any], source: str) -> tuple[dict[str, Any], str]:
    """`continue_final_message` as transformers 5 does it: the final message's content (its last
    part with a text, for parts) gets a tag appended; the rendering is cut where the tag lands.
    Returns the tagged message and the text it continues."""
    if "content" not in source:
        raise ChatTemplateError('continue_final_message: the chat template never reads "content"')
    content = final.get("content")
    if isinstance(content, list):
        parts = [dict(p) for p in content]
        for part in reversed(parts):
            if "text" in part:
                text = part["text"]
                part["text"] = text + _CONTINUE_TAG
                return {**final, "content": parts}, text
        raise ChatTemplateError("continue_final_message: the final message has no text to continue")
    if content is None:
        raise ChatTemplateError("continue_final_message: the final message has no content")
    return {**final, "content": content + _CONTINUE_TAG}, content


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _cut_at_tag(text: str, final_text: str) -> str:
    """The rendering up to the tag: exactly there if the template kept the tag's trailing space,
    else with trailing whitespace stripped (the template trimmed the message)."""
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in text or tag not in text:
        raise ChatTemplateError("continue_final_message: the final message is not in the rendered chat")
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()


def _merge_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Developer messages as system ones, then every system message merged into one, first."""
    systems: list[str] = []
    rest: list[dict[str, Any]] = []
    merge = False
    for i, msg in enumerate(messages):
        if msg["role"] == "developer":
            msg = {k: v for k, v in msg.items() if k != "tools"}
            msg["role"] = "system"
        if msg["role"] != "system":
            rest.append(msg)
            continue
        merge = merge or i > 0 or bool(systems)
        content = msg.get("content") or ""
        if isinstance(content, list):
            content = "\n".join(p["text"] for p in content if "text" in p)
        if content:
            systems.append(content)
        rest.append(msg)
    if not merge:
        # One system message, already first: kept as it is (it may be a developer turned system).
        return rest
    return [{"role": "system", "content": "\n\n".join(systems)}, *(m for m in rest if m["role"] != "system")]


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    """The tools as vLLM's request model dumps them: `{"type", "function": {"name", "description",
    "parameters"[, "strict"][, "defer_loading"]}[, "defer_loading"]}`, a missing description or
    parameters as null, unknown keys dropped; a tool's defer_loading is copied into its function
    when the function has none."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ChatTemplateError("tools must be a list")
    if not raw:
        raise ChatTemplateError("tools must not be empty")  # vLLM's chat endpoint refuses []
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            raise ChatTemplateError(f"tools[{i}] must be an object of type function")
        fn = tool.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ChatTemplateError(f"tools[{i}].function must be an object with a name")
        description, parameters = fn.get("description"), fn.get("parameters")
        if description is not None and not isinstance(description, str):
            raise ChatTemplateError(f"tools[{i}].function.description must be a string")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ChatTemplateError(f"tools[{i}].function.parameters must be an object")
        function: dict[str, Any] = {"name": fn["name"], "description": description, "parameters": parameters}
        strict = _optional_bool(fn, "strict", f"tools[{i}].function")
        defer = _optional_bool(tool, "defer_loading", f"tools[{i}]")
        fn_defer = _optional_bool(fn, "defer_loading", f"tools[{i}].function")
        if strict is not None:
            function["strict"] = strict
        if fn_defer is None:
            fn_defer = defer
        if fn_defer is not None:
            function["defer_loading"] = fn_defer
        dumped: dict[str, Any] = {"type": "function", "function": function}
        if defer is not None:
            dumped["defer_loading"] = defer
        out.append(dumped)
    return out


def _optional_bool(obj: Mapping[str, Any], key: str, where: str) -> bool | None:
    value = obj.get(key)
    if value is None:
        return None
    flag = _lax_bool(value)
    if flag is None:
        raise ChatTemplateError(f"{where}.{key} must be a boolean")
    return flag
