"""Chat requests rendered with the model's chat template, the way vLLM's chat endpoint renders them.

vLLM does not hand the request body to the template as it came: it rebuilds every message first
(reference: /work/shared/reference/vllm-chat-preprocessing.md), and those changes move the token
ids. `render_chat` repeats them, in this order:

1. Messages are rebuilt with only the keys vLLM keeps: `role`, `content`, `name` (a string), and
   per role `tool_calls`, `reasoning` + `reasoning_content` (assistant), `tool_call_id` (tool),
   `tools` (developer). Other keys never reach the template.
2. Content goes to the template in the template's *content format*:
   - "string": a null content becomes "", a list of parts becomes its non-empty texts joined by
     "\\n" (a text part's text, a refusal's refusal, a thinking part's thinking);
   - "openai": a string becomes `[{"type": "text", "text": s}]`, parts become
     `{"type": "text", "text": ...}` (empty texts kept), a null content becomes `[]`.
   A tool message whose parts are all text gets them joined by "\\n" in either format. Media
   parts (image, audio, video, embeddings) are refused: their placeholders are model-specific,
   so epp cannot know the ids. An unknown part type is refused, as vLLM answers 400.
3. Each tool call's `arguments` JSON string is parsed into an object, so the template
   re-serialises it; invalid JSON, or anything but an object, becomes `{}`. An empty
   `tool_calls` list is dropped.
4. `tools` are rebuilt as `{"type", "function": {"name", "description", "parameters"[, "strict"]}}`
   in that key order, a missing description or parameters as null, unknown keys dropped.
5. When the template never quotes "developer" ('developer' or "developer"), developer messages
   become system messages, and all system messages merge into one first message whose
   non-empty texts are joined by "\\n\\n" (only when there is more than one, or it is not first).
6. Template variables: `messages`, `tools`, `documents`, `add_generation_prompt` (default True),
   `reasoning_effort`, `enable_thinking=False` when `reasoning_effort` is "none", the tokenizer's
   special-token strings (`bos_token`, `eos_token`, ...), then the body's `chat_template_kwargs`
   over all of these. `continue_final_message` cuts the text right after the last message's
   content, as transformers does (it and `add_generation_prompt` together are refused).

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
    "prompt_embeds",
)
_MEDIA_TYPES = frozenset(_MEDIA_KEYS)
# chat_template_kwargs that vLLM refuses (the template is chosen by the server, not the request).
_FORBIDDEN_KWARGS = frozenset({"chat_template", "tokenize"})


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
    if tok.chat_template is None:
        raise UnsupportedChat(f"tokenizer {tok.name!r} has no chat template")
    compiled = compile_template(tok.chat_template)
    fmt = compiled.content_format

    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise ChatTemplateError("messages must be a non-empty list")
    messages = [_message(m, fmt, i) for i, m in enumerate(raw_messages)]
    if not compiled.supports_developer and any(m["role"] == "developer" for m in messages):
        messages = _merge_system(messages)

    tools = _tools(body.get("tools"))
    add_generation_prompt = body.get("add_generation_prompt", True)
    continue_final_message = body.get("continue_final_message", False)
    variables: dict[str, Any] = dict(tok.special_tokens)
    variables["reasoning_effort"] = body.get("reasoning_effort")
    if body.get("reasoning_effort") == "none":
        variables["enable_thinking"] = False
    extra = body.get("chat_template_kwargs")
    if extra is not None:
        if not isinstance(extra, Mapping):
            raise ChatTemplateError("chat_template_kwargs must be an object")
        bad = _FORBIDDEN_KWARGS & extra.keys()
        if bad:
            raise ChatTemplateError(f"chat_template_kwargs may not set {sorted(bad)}")
        variables.update(extra)
    # These are apply_chat_template's own parameters: a kwarg of the same name replaces them.
    add_generation_prompt = variables.pop("add_generation_prompt", add_generation_prompt)
    continue_final_message = variables.pop("continue_final_message", continue_final_message)
    tools = variables.pop("tools", tools)
    documents = variables.pop("documents", body.get("documents"))
    if "messages" in variables:
        raise ChatTemplateError("chat_template_kwargs may not set messages")
    if add_generation_prompt and continue_final_message:
        raise ChatTemplateError("add_generation_prompt and continue_final_message cannot both be true")

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
        text = _cut_after_final(text, messages[-1])
    return text


def encode_chat(tok: tokenizer.Tokenizer, body: Mapping[str, Any]) -> list[int]:
    """The prompt token ids vLLM computes for a chat body: the rendered text, encoded without
    special tokens (the template writes BOS) unless the body sets `add_special_tokens`.

    Raises:
        ChatTemplateError: as `render_chat`.
    """
    return tok.encode(render_chat(tok, body), add_special_tokens=add_special_tokens(body))


def add_special_tokens(body: Mapping[str, Any]) -> bool:
    """vLLM's chat default is False: the template already writes BOS, and True may add a second."""
    return body.get("add_special_tokens") is True


# --- message preprocessing ------------------------------------------------------------------------


def _message(raw: Any, fmt: ContentFormat, index: int) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ChatTemplateError(f"messages[{index}] must be an object")
    role = raw.get("role")
    if not isinstance(role, str):
        raise ChatTemplateError(f"messages[{index}].role must be a string")
    content = raw.get("content")
    if content is None:
        parts: Sequence[Any] = []
    elif isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = content
    else:
        raise ChatTemplateError(f"messages[{index}].content must be a string, a list of parts or null")

    out: dict[str, Any] = {"role": role, "content": _content(parts, fmt, index)}
    if role == "assistant":
        calls = raw.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise ChatTemplateError(f"messages[{index}].tool_calls must be a list")
            if calls:  # an empty list is dropped so templates take their plain assistant path
                out["tool_calls"] = [_tool_call(c, index) for c in calls]
        reasoning = raw.get("reasoning")
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in raw:
            out["tool_call_id"] = raw["tool_call_id"]
        body = out["content"]
        if isinstance(body, list) and all(p.get("type") == "text" for p in body):
            # Tool results as text parts are joined in every format: most templates expect a string.
            out["content"] = "\n".join(p.get("text") or "" for p in body)
    name = raw.get("name")
    if isinstance(name, str):
        out["name"] = name
    task = raw.get("task")
    if isinstance(task, str):
        out["task"] = task
    if role == "developer":
        out["tools"] = raw.get("tools")
    return out


def _content(parts: Sequence[Any], fmt: ContentFormat, index: int) -> str | list[dict[str, Any]]:
    texts: list[str] = []
    dicts: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, str):
            kind, value = "text", part
        elif isinstance(part, Mapping):
            kind, value = _part(part, index)
            if value is None and kind in _SKIP_NULL_TYPES:
                continue
        else:
            raise ChatTemplateError(f"messages[{index}].content: a part must be a string or an object")
        if fmt == "string":
            if value:  # vLLM drops empty texts before joining
                texts.append(value)
        elif kind == "tool_reference":
            dicts.append({"type": "tool_reference", "name": value})
        else:
            dicts.append({"type": "text", "text": value})
    return "\n".join(texts) if fmt == "string" else dicts


def _part(part: Mapping[str, Any], index: int) -> tuple[str, Any]:
    """A part's kind ("text" or "tool_reference") and its text; media and unknown types raise."""
    kind = part.get("type")
    if kind is None:
        if any(key in part for key in _MEDIA_KEYS):
            raise UnsupportedChat(f"messages[{index}].content: media parts are not supported")
        if "tool_reference" in part:
            return "tool_reference", part.get("tool_reference")
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
    if not isinstance(raw, Mapping) or not isinstance(raw.get("function"), Mapping):
        raise ChatTemplateError(f"messages[{index}].tool_calls: each call must be an object with a function")
    function = dict(raw["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = None
    function["arguments"] = arguments if isinstance(arguments, dict) else {}
    call = dict(raw)
    call["function"] = function
    return call


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
        function: dict[str, Any] = {
            "name": fn["name"],
            "description": fn.get("description"),
            "parameters": fn.get("parameters"),
        }
        if fn.get("strict") is not None:
            function["strict"] = fn["strict"]
        out.append({"type": "function", "function": function})
    return out


def _cut_after_final(text: str, final: Mapping[str, Any]) -> str:
    """`continue_final_message`: the text up to the end of the last message's content, so the
    model continues that message (transformers' rule: the last occurrence of the stripped
    content; its trailing whitespace kept only if the template kept it)."""
    content = final.get("content")
    if isinstance(content, list):
        texts = [p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        if not texts:
            raise ChatTemplateError("continue_final_message: the final message has no text")
        content = texts[-1]
    if not isinstance(content, str):
        raise ChatTemplateError("continue_final_message: the final message has no text")
    stripped = content.strip()
    at = text.rfind(stripped)
    if at < 0:
        raise ChatTemplateError("continue_final_message: the final message is not in the rendered chat")
    kept = content.lstrip()
    if text[at : at + len(kept)] == kept:
        return text[: at + len(kept)]
    return text[: at + len(stripped)]
