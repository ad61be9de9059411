"""`chat.render_chat` against transformers' `apply_chat_template`, for requests vLLM passes to the
template unchanged (plain string contents, no tools): skipped when transformers is not installed.
For a template that walks content parts (vLLM's "openai" content format), vLLM turns each string
into one text part; transformers is given the messages in that shape."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.tokenize import chat, tokenizer

DATA = Path(__file__).resolve().parent / "data"
TEMPLATES = ("epp-tiny", "llama3_like", "chatml_tools", "mistral_like", "openai_parts")
DATE = "01 Jan 2026"

_content = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30) | st.sampled_from(
    ["", " ", "  padded  ", "line\nbreak", "<s> inside", "{{ not jinja }}", "日本語 👍🏽"]
)


@pytest.fixture(scope="module")
def hf() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers = pytest.importorskip("transformers")
        tiny = tokenizer.load_shipped()
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=tiny.backend, bos_token="<s>", eos_token="</s>"
        )


def _tok(name: str) -> tokenizer.Tokenizer:
    tiny = tokenizer.load_shipped()
    if name == "epp-tiny":
        return tiny
    return tokenizer.Tokenizer(
        tiny.backend,
        name=name,
        chat_template=(DATA / f"{name}.jinja").read_text(),
        bos_token_id=tiny.bos_token_id,
        special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
    )


@pytest.mark.parametrize("name", TEMPLATES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    system=st.none() | _content,
    turns=st.lists(_content, min_size=1, max_size=5),
    generation=st.booleans(),
)
def test_render_chat_equals_apply_chat_template(
    hf: Any, name: str, system: str | None, turns: list[str], generation: bool
) -> None:
    tok = _tok(name)
    messages: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(turns)]
    body = {
        "messages": messages,
        "add_generation_prompt": generation,
        "chat_template_kwargs": {"date_string": DATE},
    }
    try:
        ours: str | None = chat.render_chat(tok, body)
    except chat.ChatTemplateError:
        ours = None
    if chat.compile_template(tok.chat_template or "").content_format == "openai":
        messages = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]
    try:
        theirs: str | None = hf.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=generation,
            chat_template=tok.chat_template,
            date_string=DATE,
        )
    except Exception:  # the template's raise_exception, as transformers surfaces it
        theirs = None
    assert ours == theirs
