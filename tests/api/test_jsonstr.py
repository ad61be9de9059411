"""epp/api/_jsonstr.c against msgspec: for any JSON string literal the C decoder answers what
msgspec decodes, or declines (None) and leaves msgspec to answer (its error included)."""

from __future__ import annotations

import json
import random

import msgspec
import pytest

from epp.api import _jsonstr
from epp.api.openai_bodies import _string

_STR = msgspec.json.Decoder(str)


def _msgspec(raw: bytes) -> str | type[Exception]:
    try:
        return _STR.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
        return type(e)


def _agree(raw: bytes) -> None:
    expected = _msgspec(raw)
    got = _jsonstr.string(raw)
    if got is not None:
        assert isinstance(expected, str), (raw, got)
        assert got == expected, raw
        # Same kind too: callers hash and slice it, and a compact ASCII str must stay one.
        assert got.isascii() == expected.isascii()
    # Through the helper the parsers use, every literal ends as msgspec's answer.
    if isinstance(expected, str):
        assert _string(msgspec.Raw(raw)) == expected
    else:
        with pytest.raises(expected):
            _string(msgspec.Raw(raw))


@pytest.mark.parametrize(
    "raw",
    [
        b'""',
        b'"a"',
        b'"hello world, a plain ASCII prompt longer than eight bytes"',
        b'"line\\nbreak\\t\\"quoted\\" \\\\ \\/ \\b \\f \\r"',
        '"héllo 😀 数据"'.encode(),
        b'"\\u00e9\\u6570\\ud83d\\ude00 \\u0041 \\u0000"',
        b'"\\uD83D\\uDE00 upper-case hex"',
        b'"\\ud800"',  # lone high surrogate
        b'"\\ud800x"',
        b'"\\ud800\\u0041"',  # high surrogate, then no low one
        b'"\\udc00"',  # lone low surrogate
        b'"\\u12G4"',
        b'"\\u12"',
        b'"\\x"',
        b'"\\',
        b'"a\x01b"',  # raw control character
        b'"a"b"',
        b'"\xff"',
        b'"\xed\xa0\x80"',  # a surrogate in UTF-8
        b'"\xc3"',  # truncated UTF-8
        b'"abc\xe9"',
        b'"no end',
        b"no quotes",
        b'"',
        b"",
        b'"abcdefgh\\n"',  # an escape right after a whole eight-byte word
        b'"abcdefg\\n"',
        b'"\\nabcdefghijklmnop"',
    ],
)
def test_a_literal_decodes_as_msgspec_decodes_it(raw: bytes) -> None:
    _agree(raw)


def test_generated_literals_decode_as_msgspec_decodes_them() -> None:
    rng = random.Random(5)
    alphabet = ["a", "Z", " ", "\n", "\t", '"', "\\", "/", "\x00", "\x1f", "\x7f", "é", "数", "😀", "\ud800"]
    pieces = [b"\\u", b"\\ud83d", b"\\ude00", b"\\", b'"', b"\xff", b"\xc3", b"\x01", b"\\n", b"\\q"]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        raw = json.dumps(text, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        if rng.random() < 0.3:  # damage it: a stray escape, quote, byte or control character
            at = rng.randrange(1, max(2, len(raw) - 1))
            raw = raw[:at] + rng.choice(pieces) + raw[at:]
        _agree(raw)


def test_a_long_prompt_with_every_kind_of_text_decodes_whole() -> None:
    text = ('routing 😀 naïve 数据\n\t"quoted" \\ ' * 5_000) + "end"
    for ensure_ascii in (False, True):
        raw = json.dumps(text, ensure_ascii=ensure_ascii).encode()
        assert _jsonstr.string(raw) == text


def test_any_buffer_is_taken_and_a_non_buffer_refused() -> None:
    assert _jsonstr.string(memoryview(b'"x\\ny"')) == "x\ny"
    assert _jsonstr.string(bytearray(b'"x"')) == "x"
    with pytest.raises(TypeError):
        _jsonstr.string("x")  # type: ignore[arg-type]
