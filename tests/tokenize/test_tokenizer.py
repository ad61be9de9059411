"""`Tokenizer`: loading from directories and files, errors, encoding, and the shipped epp-tiny."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.tokenize import tokenizer

# Written for this test (not in the build corpus): ordinary English of a chat prompt.
ENGLISH = (
    "I am planning a week-long trip to the mountains with two friends in early September. We want "
    "to hike during the day and stay in small guest houses at night, but none of us has done a "
    "multi-day walk before. Could you suggest how to prepare, what we should pack, and how far we "
    "can reasonably expect to walk each day? We are all in decent shape, although one of my friends "
    "had a knee injury last spring and would prefer routes that are not too steep on the way down."
)


@pytest.fixture
def copy_of_shipped(tmp_path: Path) -> Path:
    folder = tmp_path / "my-model"
    shutil.copytree(tokenizer.SHIPPED_DIR, folder)
    return folder


def _write_config(folder: Path, **changes: object) -> None:
    path = folder / tokenizer.CONFIG_FILE
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


# -- the shipped tokenizer ----------------------------------------------------------------------------


def test_shipped_layout(shipped: tokenizer.Tokenizer) -> None:
    assert shipped.name == tokenizer.SHIPPED_NAME == "epp-tiny"
    assert shipped.bos_token_id == 1
    assert shipped.eos_token_id == 2
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    assert [shipped.backend.token_to_id(t) for t in specials] == list(range(7))
    assert shipped.backend.get_vocab_size() == 8192
    assert shipped.chat_template is not None
    assert "<|assistant|>" in shipped.chat_template
    assert (tokenizer.SHIPPED_DIR / "tokenizer.json").stat().st_size < 600_000


def test_bos_prepended_once(shipped: tokenizer.Tokenizer) -> None:
    plain = shipped.encode("Hello, world!", add_special_tokens=False)
    assert plain and 1 not in plain
    assert shipped.encode("Hello, world!") == [1, *plain]
    assert shipped.encode("") == [1]
    assert shipped.encode("", add_special_tokens=False) == []


def test_special_tokens_in_text_are_special(shipped: tokenizer.Tokenizer) -> None:
    # As with Hugging Face tokenizers: "<s>" written in the text is the BOS token, not "<", "s", ">".
    assert shipped.encode("<s>hi</s>", add_special_tokens=False)[0] == 1
    assert shipped.encode("<|user|>\nhi", add_special_tokens=False)[0] == 5


def test_english_costs_about_four_chars_per_token(shipped: tokenizer.Tokenizer) -> None:
    ratio = len(ENGLISH) / len(shipped.encode(ENGLISH, add_special_tokens=False))
    assert 3.5 <= ratio <= 4.6, ratio


def test_no_unknown_tokens(shipped: tokenizer.Tokenizer) -> None:
    ids = shipped.encode("naïve café — 日本語のテキスト 🙂 \x00\t\r\n", add_special_tokens=False)
    assert 0 not in ids  # byte-level: every byte has a token, <unk> never appears


@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_round_trip(shipped: tokenizer.Tokenizer, text: str) -> None:
    ids = shipped.encode(text, add_special_tokens=False)
    assert shipped.backend.decode(ids, skip_special_tokens=False) == text


# -- loading ------------------------------------------------------------------------------------------


def test_load_directory(copy_of_shipped: Path, shipped: tokenizer.Tokenizer) -> None:
    tok = tokenizer.Tokenizer.load(copy_of_shipped)
    assert tok.name == "my-model"
    assert tok.path == copy_of_shipped / "tokenizer.json"
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.chat_template == shipped.chat_template
    assert tok.encode(ENGLISH) == shipped.encode(ENGLISH)


def test_load_file_reads_its_directory(copy_of_shipped: Path) -> None:
    tok = tokenizer.Tokenizer.load(str(copy_of_shipped / "tokenizer.json"), name="llama")
    assert tok.name == "llama"
    assert tok.bos_token_id == 1
    assert tok.chat_template is not None


def test_load_bare_tokenizer_json(tmp_path: Path) -> None:
    shutil.copy(tokenizer.SHIPPED_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    tok = tokenizer.Tokenizer.load(tmp_path)
    assert (tok.bos_token_id, tok.eos_token_id, tok.chat_template) == (None, None, None)
    assert tok.encode("hi")[0] == 1  # the post-processor still adds BOS


def test_chat_template_file_wins_over_config(copy_of_shipped: Path) -> None:
    (copy_of_shipped / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert tokenizer.Tokenizer.load(copy_of_shipped).chat_template == "{{ messages[0]['content'] }}"


def test_chat_template_list_in_config(copy_of_shipped: Path) -> None:
    _write_config(
        copy_of_shipped,
        chat_template=[{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
    )
    assert tokenizer.Tokenizer.load(copy_of_shipped).chat_template == "D"
    _write_config(copy_of_shipped, chat_template=[{"name": "tool_use", "template": "T"}])
    assert tokenizer.Tokenizer.load(copy_of_shipped).chat_template is None


def test_special_token_as_added_token_object(copy_of_shipped: Path) -> None:
    _write_config(copy_of_shipped, bos_token={"content": "<s>", "special": True}, eos_token=None)
    tok = tokenizer.Tokenizer.load(copy_of_shipped)
    assert (tok.bos_token_id, tok.eos_token_id) == (1, None)


# -- errors -------------------------------------------------------------------------------------------


def _error(path: Path) -> str:
    with pytest.raises(tokenizer.TokenizerError) as info:
        tokenizer.Tokenizer.load(path)
    return str(info.value)


def test_missing_path(tmp_path: Path) -> None:
    message = _error(tmp_path / "nope")
    assert str(tmp_path / "nope") in message and "no such file or directory" in message


def test_directory_without_tokenizer_json(tmp_path: Path) -> None:
    message = _error(tmp_path)
    assert str(tmp_path) in message and "no tokenizer.json" in message
    (tmp_path / "tokenizer.model").write_bytes(b"\x00")
    assert "sentencepiece tokenizer.model is not supported" in _error(tmp_path)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"{not json", "not a valid tokenizer.json"),
        (b'{"version": "1.0"}', "not a valid tokenizer.json"),
        (b"\xff\xfe\x00", "cannot read"),
    ],
)
def test_corrupt_tokenizer_json(tmp_path: Path, content: bytes, expected: str) -> None:
    (tmp_path / "tokenizer.json").write_bytes(content)
    message = _error(tmp_path)
    assert str(tmp_path / "tokenizer.json") in message and expected in message


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("{oops", "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"bos_token": "<bos>"}', "bos_token '<bos>' is not in the tokenizer's vocabulary"),
        ('{"eos_token": 2}', "eos_token must be a string"),
        ('{"chat_template": 3}', "chat_template must be a string or a list, got int"),
    ],
)
def test_bad_config(copy_of_shipped: Path, config: str, expected: str) -> None:
    (copy_of_shipped / "tokenizer_config.json").write_text(config)
    message = _error(copy_of_shipped)
    assert str(copy_of_shipped / "tokenizer_config.json") in message and expected in message


def test_unreadable_config(copy_of_shipped: Path) -> None:
    (copy_of_shipped / "tokenizer_config.json").unlink()
    (copy_of_shipped / "tokenizer_config.json").mkdir()  # exists, cannot be read as a file
    message = _error(copy_of_shipped)
    assert str(copy_of_shipped / "tokenizer_config.json") in message and "cannot read" in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (131072, 131072),
        (4096.0, 4096),
        (1000000000000000019884624838656, None),  # transformers' "unset" (int(1e30))
        (1e30, None),  # the same, as some tools write it
        (0, None),
        (-1, None),
        (True, None),
        ("4096", None),
        (4096.5, None),
    ],
)
def test_model_max_length_from_the_config(copy_of_shipped: Path, value: object, expected: int | None) -> None:
    config_file = copy_of_shipped / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["model_max_length"] = value
    config_file.write_text(json.dumps(config))
    assert tokenizer.Tokenizer.load(copy_of_shipped).model_max_length == expected


def test_model_max_length_absent(copy_of_shipped: Path, shipped: tokenizer.Tokenizer) -> None:
    assert shipped.model_max_length == 131072  # epp-tiny's config names one
    config_file = copy_of_shipped / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    del config["model_max_length"]
    config_file.write_text(json.dumps(config))
    assert tokenizer.Tokenizer.load(copy_of_shipped).model_max_length is None
