"""One model's tokenizer, loaded from Hugging Face files, and the epp-tiny tokenizer shipped with epp.

`Tokenizer.load(path)` takes a directory holding `tokenizer.json`, or that file itself; the
`tokenizer_config.json` and `chat_template.jinja` beside it are read when present (they name the
BOS/EOS tokens and carry the chat template). Only the fast-tokenizer format is supported: a
directory with just a sentencepiece `tokenizer.model` is refused with a message saying so. Every
failure is a `TokenizerError` naming the file and what is wrong with it.

`encode` is "plain" tokenization: the text through the tokenizer's normaliser, pre-tokeniser,
model and post-processor, as `transformers`' `tokenizer(text)` does for a fast tokenizer with
`add_special_tokens`. Settings that `transformers` applies on top of `tokenizer.json` for some
tokenizer classes (Llama's `add_bos_token`/`add_eos_token` rebuilding the post-processor, for
one) are not applied: the tokenizer.json's post-processor is taken as it is. vLLM-identical
tokenization is a separate step built on this one.

GIL (measured with tokenizers 0.23.3 on 2 vCPUs; tests/tokenize/bench_tokenize.py):
`tokenizers.Tokenizer.encode` holds the GIL for the whole call: run in a worker thread, a 16k-token
encode stalled the event loop for 20-30 ms, a 100k-token one for ~200 ms. `encode_batch` and
`encode_batch_fast` release it: the loop's lag stayed at p99 ~1 ms, max 3-4 ms. `encode_batch_fast`
also skips character offsets, which epp never reads, and is the fastest of the three: 100k tokens
of this repository's Markdown and code in 100-140 ms against 160-210 ms for `encode` (16k: 21-28
against 25-36 ms; the VM's timings vary by ~30%). So `Tokenizer.encode` calls
`encode_batch_fast([text])`. That single-item batch runs on tokenizers' rayon pool (or in the
calling thread with TOKENIZERS_PARALLELISM=false; both measured the same). tokenizers' own
`async_encode*` run on a tokio pool that grew to ~100 OS threads under 64 concurrent encodes and
lagged the loop by 100-150 ms on 2 vCPUs, so epp does not use them.
"""

from __future__ import annotations

import json
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tokenizers

SHIPPED_NAME = "epp-tiny"
SHIPPED_DIR = Path(__file__).resolve().parent / "data"
"""epp-tiny's files (scripts/build_tokenizer.py builds them): byte-level BPE, 8,192 ids, BOS `<s>` = 1."""

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"


class TokenizerError(Exception):
    """A tokenizer could not be loaded; the message names the path and the problem."""


class Tokenizer:
    """A loaded tokenizer for one model. Immutable; safe to share between threads."""

    __slots__ = (
        "_backend",
        "bos_token_id",
        "chat_template",
        "eos_token_id",
        "name",
        "path",
        "special_tokens",
    )

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        name: str,
        path: Path | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str | list[str]] | None = None,
    ) -> None:
        self._backend = backend
        self.name = name  # for logs and metrics: the model directory's name unless given
        self.path = path  # the tokenizer.json it was loaded from, if any
        self.bos_token_id = bos_token_id  # from tokenizer_config.json's bos_token; None if not named
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template  # Jinja source; chat_template.jinja wins over the config's
        # The config's special-token strings by name (bos_token, eos_token, ..., and the list
        # additional_special_tokens): chat templates read them as variables, as transformers passes them.
        self.special_tokens: Mapping[str, str | list[str]] = types.MappingProxyType(
            dict(special_tokens or {})
        )

    @classmethod
    def load(cls, path: str | Path, *, name: str | None = None) -> Tokenizer:
        """Load from a directory holding tokenizer.json, or from a tokenizer.json file.

        Raises:
            TokenizerError: the path is missing, or a file is unreadable or malformed.
        """
        given = Path(path)
        if given.is_dir():
            file = given / TOKENIZER_FILE
            if not file.is_file():
                hint = (
                    "; its sentencepiece tokenizer.model is not supported (transformers can save the"
                    " tokenizer as tokenizer.json)"
                    if (given / "tokenizer.model").exists()
                    else ""
                )
                raise TokenizerError(f"{given}: no {TOKENIZER_FILE} in this directory{hint}")
        elif given.exists():
            file = given
        else:
            raise TokenizerError(f"{given}: no such file or directory")
        folder = file.parent
        backend = _backend(file)
        config = _config(folder / CONFIG_FILE)
        template = _template_file(folder / TEMPLATE_FILE)
        if template is None:
            template = _config_template(config, folder / CONFIG_FILE)
        return cls(
            backend,
            name=name or folder.resolve().name,
            path=file,
            bos_token_id=_special_id(backend, config, "bos_token", folder / CONFIG_FILE),
            eos_token_id=_special_id(backend, config, "eos_token", folder / CONFIG_FILE),
            chat_template=template,
            special_tokens=_special_strings(config),
        )

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer`, for what this class does not wrap (decode, vocab)."""
        return self._backend

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The token ids of `text`; with `add_special_tokens`, as the post-processor adds them (BOS).

        Releases the GIL while it works (see the module docstring), so it may run in a thread
        beside the event loop.
        """
        return self._backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, path={str(self.path)!r})"


def load_shipped() -> Tokenizer:
    """epp-tiny, the tokenizer shipped in the package; the default when none is configured."""
    return Tokenizer.load(SHIPPED_DIR, name=SHIPPED_NAME)


def _backend(file: Path) -> tokenizers.Tokenizer:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{file}: cannot read: {e}") from e
    try:
        return tokenizers.Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise TokenizerError(f"{file}: not a valid tokenizer.json: {e}") from e


def _config(file: Path) -> dict[str, Any]:
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{file}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{file}: invalid JSON: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def _template_file(file: Path) -> str | None:
    if not file.exists():
        return None
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{file}: cannot read: {e}") from e


def _config_template(config: dict[str, Any], file: Path) -> str | None:
    """The config's `chat_template`: a string, or a list of named templates ("default" is used)."""
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item.get("name") == "default":
                template = item.get("template")
                if isinstance(template, str):
                    return template
        return None
    raise TokenizerError(f"{file}: chat_template must be a string or a list, got {type(value).__name__}")


SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _special_strings(config: Mapping[str, Any]) -> dict[str, str | list[str]]:
    """The special tokens the config names, as strings (AddedToken objects give their content).

    Only tokens that are set appear, as in transformers' `special_tokens_map`: a template testing
    `pad_token is defined` sees the same answer.
    """
    found: dict[str, str | list[str]] = {}
    for key in SPECIAL_TOKEN_NAMES:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[key] = value
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        texts = [t.get("content") if isinstance(t, dict) else t for t in extra]
        strings = [t for t in texts if isinstance(t, str)]
        if strings:
            found["additional_special_tokens"] = strings
    return found


def _special_id(backend: tokenizers.Tokenizer, config: dict[str, Any], key: str, file: Path) -> int | None:
    """The id of the config's `bos_token`/`eos_token`: a string or an AddedToken object {"content": ...}."""
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    if value is None:
        return None
    if not isinstance(value, str):
        raise TokenizerError(f"{file}: {key} must be a string or an object with content")
    token_id = backend.token_to_id(value)
    if token_id is None:
        raise TokenizerError(f"{file}: {key} {value!r} is not in the tokenizer's vocabulary")
    return token_id
