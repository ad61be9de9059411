"""`Tokenizers` sources: precedence between --tokenizer, the endpoints file and the config, start-up
errors, reloads off the loop, and the epp-tiny default."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import pytest

from epp.tokenize import registry, tokenizer

from .test_registry import LONG, Track


def _copy(dst: Path) -> Path:
    shutil.copytree(tokenizer.SHIPPED_DIR, dst)
    return dst


def test_precedence_flag_then_endpoints_file_then_config(tmp_path: Path, track: Track) -> None:
    a, b, c = (_copy(tmp_path / n) for n in ("a", "b", "c"))
    toks = track(
        registry.Tokenizers.from_spec(registry.parse_tokenizer_arg([f"m1={a}"]), shipped_default=False)
    )
    toks.load_models(registry.CONFIG, {"m1": c, "m2": c, "m3": c})
    toks.load_models(registry.ENDPOINTS_FILE, {"m1": b, "m2": b})
    names = {model: tok.path.parent.name for model, tok in toks.models.items() if tok.path is not None}
    assert names == {"m1": "a", "m2": "b", "m3": "c"}
    assert toks.models_from(registry.CONFIG)["m1"].path == c / "tokenizer.json"
    assert toks.for_model("m4") is None  # no default: nothing implied
    # Each resolved path is loaded once, whichever sources name it.
    assert toks.for_model("m2") is toks.models_from(registry.ENDPOINTS_FILE)["m1"]
    # A source replaced: the config's m3 goes, the endpoints file's entries stay.
    toks.load_models(registry.CONFIG, {})
    assert toks.for_model("m3") is None
    assert toks.for_model("m2") is not None


def test_start_up_error_names_model_source_and_path(tmp_path: Path, track: Track) -> None:
    toks = track(registry.Tokenizers())
    good = _copy(tmp_path / "good")
    with pytest.raises(
        tokenizer.TokenizerError,
        match=rf"^tokenizer for model 'bad' \(EndpointPickerConfig\): {tmp_path / 'missing'}: no such file",
    ):
        toks.load_models(registry.CONFIG, {"good": good, "bad": tmp_path / "missing"})
    assert toks.models == {}  # nothing changed
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not json")
    with pytest.raises(
        tokenizer.TokenizerError, match=r"^tokenizer for model 'x' \(somewhere\): .*not a valid"
    ):
        toks.load_models(registry.CONFIG, {"x": tmp_path / "broken"}, origin="somewhere")


def test_unknown_source(track: Track) -> None:
    toks = track(registry.Tokenizers())
    with pytest.raises(ValueError, match="unknown tokenizer source"):
        toks.load_models("elsewhere", {})


async def test_reload_loads_off_the_loop_and_keeps_the_previous_on_failure(
    tmp_path: Path, track: Track, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    toks = track(registry.Tokenizers())
    first = _copy(tmp_path / "first")
    toks.load_models(registry.ENDPOINTS_FILE, {"m": first})
    before = toks.for_model("m")
    threads: list[str] = []
    load = tokenizer.Tokenizer.load

    def recording(path: str | Path, *, name: str | None = None) -> tokenizer.Tokenizer:
        threads.append(threading.current_thread().name)
        return load(path, name=name)

    monkeypatch.setattr(tokenizer.Tokenizer, "load", recording)
    caplog.set_level(logging.INFO, logger="epp.tokenize")
    second = _copy(tmp_path / "second")
    ok = await toks.reload_models(registry.ENDPOINTS_FILE, {"m": first, "n": second, "o": tmp_path / "none"})
    assert not ok
    assert threads and threading.main_thread().name not in threads  # only the new path, in a thread
    assert len(threads) == 2  # second and none: first was loaded already
    assert toks.for_model("m") is before
    added = toks.for_model("n")
    assert added is not None and added.path == second / "tokenizer.json"
    assert toks.for_model("o") is None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        f"tokenizer for model 'o' (endpoints file): {tmp_path / 'none'}: no such file or directory;"
        " it has none"
    ]
    # m's new path is broken: it keeps the tokenizer it had, and the error says so.
    assert not await toks.reload_models(registry.ENDPOINTS_FILE, {"m": tmp_path / "none", "n": second})
    assert toks.for_model("m") is before
    last_error = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR][-1]
    assert last_error.startswith("tokenizer for model 'm'") and "keeping its previous tokenizer" in last_error
    # The broken path is tried again next time (it may have been fixed meanwhile).
    shutil.copytree(first, tmp_path / "none")
    assert await toks.reload_models(registry.ENDPOINTS_FILE, {"m": tmp_path / "none"})
    now = toks.for_model("m")
    assert now is not None and now is not before and toks.for_model("n") is None


async def test_encodes_use_reloaded_tokenizers_and_drop_unused_caches(tmp_path: Path, track: Track) -> None:
    toks = track(registry.Tokenizers(workers=1))
    a = _copy(tmp_path / "a")
    toks.load_models(registry.ENDPOINTS_FILE, {"m": a})
    assert await toks.encode("m", LONG) == tokenizer.Tokenizer.load(a).encode(LONG)
    assert set(toks.prefix_caches) == {"a"}
    b = _copy(tmp_path / "b")
    await toks.reload_models(registry.ENDPOINTS_FILE, {"m": b})
    assert await toks.encode("m", LONG) is not None
    assert set(toks.prefix_caches) == {"b"}  # a's cache went with a
    await toks.reload_models(registry.ENDPOINTS_FILE, {})
    assert await toks.encode("m", LONG) is None
    assert toks.missing == {"m": 1}


def test_shipped_default_only_when_asked(track: Track) -> None:
    toks = track(registry.Tokenizers.from_spec(registry.TokenizerSpec(), shipped_default=False))
    assert toks.for_model("x") is None
    toks.use_shipped_default()
    found = toks.for_model("x")
    assert found is not None and found.name == tokenizer.SHIPPED_NAME
