"""vLLM 0.32's chat request model and chat preprocessing: what it refuses (400) and how it
rebuilds messages, tool calls, tools and the template's variables before rendering.

`epp.tokenize.chat` renders and encodes; this module holds the rules it applies first (the
numbered list in chat's docstring says which, in order; tests/tokenize/test_chat_vllm_rules.py
tests each, and the differential run against a real vLLM, scripts/differential_tokenize.py,
checks them together). Split out of chat.py when the rules passed 500 lines.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from epp.lax import lax_bool as lax_bool  # re-exported: chat's callers read booleans with it

ContentFormat = Literal["string", "openai"]

# Part types whose text goes into the prompt, and the key holding it.
TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
# vLLM skips these when their text is null; the other text types pass null on.
_SKIP_NULL_TYPES = frozenset({"text", "refusal"})
MEDIA_KEYS = (
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
_MEDIA_TYPES = frozenset(MEDIA_KEYS)


class ChatTemplateError(Exception):
    """The request cannot be rendered as vLLM would render it; vLLM answers it with 400."""


class UnsupportedChat(ChatTemplateError):
    """epp cannot render this request, though vLLM may well serve it (media parts, whose
    placeholders depend on the model's processor; a tokenizer without a chat template): route it
    without token ids rather than refuse it."""


# --- the request's own fields ---------------------------------------------------------------------

_REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
_TOOL_CHOICES = frozenset({"none", "auto", "required"})
# vLLM's merge of template kwargs (renderers/params.py merge_kwargs) skips these values.
_UNSET = (None, "auto")
# apply_chat_template's parameters (transformers 5): a kwarg of one of these names is taken by the
# call, not given to the template. With `tokenize` these change the ids in ways epp does not model.
TEMPLATE_PARAMETERS = frozenset(
    {"chat_template", "return_dict", "return_assistant_tokens_mask", "padding", "truncation",
     "max_length", "return_tensors", "tokenizer_kwargs"}
)  # fmt: skip
TOKENIZE_OPTIONS = frozenset({"padding", "truncation", "max_length", "return_tensors", "tokenizer_kwargs"})


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    if name not in body:
        return default
    value = lax_bool(body[name])
    if value is None:  # null included: vLLM's field is a plain bool
        raise ChatTemplateError(f"{name} must be a boolean")
    return value


def generation_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """add_generation_prompt and continue_final_message. vLLM's check_generation_prompt tests the
    raw values' truth, before they are read as booleans: "false" is a true string there."""
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise ChatTemplateError("add_generation_prompt and continue_final_message cannot both be true")
    return _flag(body, "add_generation_prompt", True), _flag(body, "continue_final_message", False)


def check_request(body: Mapping[str, Any]) -> None:
    """The checks of vLLM's request model that epp can see being failed (vLLM answers 400)."""
    effort = body.get("reasoning_effort")
    if effort is not None and (not isinstance(effort, str) or effort not in _REASONING_EFFORTS):
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
    elif not isinstance(choice, str) or choice not in _TOOL_CHOICES:  # ["auto"] is unhashable
        raise ChatTemplateError('tool_choice must be "none", "auto", "required" or a named tool')


def template_kwargs(
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


def list_of_objects(value: Any, what: str) -> list[Any]:
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


def reshape_message(
    raw: Any, fmt: ContentFormat, index: int, *, read_parts: bool = True, parts_checked: bool = False
) -> dict[str, Any]:
    """One message as vLLM's request model validates it and chat_utils rebuilds it
    (`parts_checked`: another API's request model validated the parts, not the chat one's)."""
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
        if read_parts and not parts_checked and role in _OPENAI_ROLES and not parts_pass(content, raw):
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
            function["strict"] = lax_bool(function["strict"])
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
        and (fn.get("strict") is None or lax_bool(fn["strict"]) is not None)
    )


# Roles whose parts vLLM's request model validates against OpenAI's part types (below).
_OPENAI_ROLES = frozenset({"user", "assistant", "system", "developer"})


def parts_pass(parts: Sequence[Any], message: Mapping[str, Any]) -> bool:
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
    # A type that is not a string (a list, an object: unhashable) is no part vLLM knows.
    return kind == "tool_reference" or (isinstance(kind, str) and kind in _MEDIA_TYPES)


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
            if value is not None and not isinstance(value, str):
                # vLLM's part types declare these strings: its request model refuses the rest (found
                # by tests/fuzz; the join below failed with a TypeError)
                raise ChatTemplateError(f"messages[{index}].content: a {kind} part's text must be a string")
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
        if any(key in part for key in MEDIA_KEYS):
            raise UnsupportedChat(f"messages[{index}].content: media parts are not supported")
        if "tool_reference" in part:
            return "tool_reference", part.get("name")
        raise ChatTemplateError(f"messages[{index}].content: a part has no type")
    if not isinstance(kind, str):
        raise ChatTemplateError(f"messages[{index}].content: a part's type must be a string")
    key = TEXT_PART_KEYS.get(kind)
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
        except (ValueError, RecursionError):  # nested ~1,000 deep: as unparsable, not a crash
            arguments = None
    function = {"arguments": arguments if isinstance(arguments, dict) else {}, "name": fn["name"]}
    function.update((k, v) for k, v in fn.items() if k not in function)
    call = {"id": raw["id"], "function": function, "type": "function"}
    call.update((k, v) for k, v in raw.items() if k not in call)
    return call


def tag_final(final: dict[str, Any], source: str) -> tuple[dict[str, Any], str]:
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


def cut_at_tag(text: str, final_text: str) -> str:
    """The rendering up to the tag: exactly there if the template kept the tag's trailing space,
    else with trailing whitespace stripped (the template trimmed the message)."""
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in text or tag not in text:
        raise ChatTemplateError("continue_final_message: the final message is not in the rendered chat")
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()


def merge_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def reshape_tools(raw: Any, *, allow_empty: bool = False) -> list[dict[str, Any]] | None:
    """The tools as vLLM's request model dumps them: `{"type", "function": {"name", "description",
    "parameters"[, "strict"][, "defer_loading"]}[, "defer_loading"]}`, a missing description or
    parameters as null, unknown keys dropped; a tool's defer_loading is copied into its function
    when the function has none. `allow_empty`: an empty list is the template's (set on a request
    vLLM had already validated: Anthropic's)."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ChatTemplateError("tools must be a list")
    if not raw and not allow_empty:
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
    flag = lax_bool(value)
    if flag is None:
        raise ChatTemplateError(f"{where}.{key} must be a boolean")
    return flag
