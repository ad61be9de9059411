"""The endpoints file's per-model `tokenizer:`: parsing, start-up, and reloads into the real registry."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from epp.datastore.endpoints import Datastore
from epp.datastore.standalone import EndpointsFile, parse_endpoints_document
from epp.tokenize import registry, tokenizer

from .fake_vllm import until

POLL = 0.01


def write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture
def toks() -> Iterator[registry.Tokenizers]:
    made = registry.Tokenizers(workers=1)
    yield made
    made.close()


def copy_shipped(dst: Path) -> Path:
    shutil.copytree(tokenizer.SHIPPED_DIR, dst)
    return dst


# -- parsing ----------------------------------------------------------------------------------------


def test_tokenizer_per_model() -> None:
    doc = parse_endpoints_document(
        "endpoints:\n"
        "  - {address: 'a:1', model: llama, tokenizer: /models/llama}\n"
        "  - {address: 'b:1', model: llama}\n"  # one entry naming it is enough for the model
        "  - {address: 'c:1', model: llama, tokenizer: ' /models/llama '}\n"  # repeating it is fine
        "  - {address: 'd:1', model: qwen, tokenizer: qwen-tok, ranks: 2}\n"
        "  - e:1\n"
    )
    assert doc.tokenizers == {"llama": "/models/llama", "qwen": "qwen-tok"}
    assert [s.name for s in doc.endpoints] == ["a:1", "b:1", "c:1", "d:1", "d:2", "e:1"]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ("- {address: 'a:1', tokenizer: /t}", "entry 1: tokenizer needs model"),
        ("- {address: 'a:1', model: m, tokenizer: ''}", "entry 1: tokenizer must be a non-empty path"),
        ("- {address: 'a:1', model: m, tokenizer: [a]}", "entry 1: tokenizer must be a non-empty path"),
        (
            "- {address: 'a:1', model: m, tokenizer: /t}\n- {address: 'b:1', model: m, tokenizer: /u}",
            "entry 2: model 'm' already has tokenizer '/t' (entry 1)",
        ),
        (
            "- {address: 'a:1', model: m, tokeniser: /t}",
            "entry 1: unknown key 'tokeniser' (did you mean 'tokenizer'?)",
        ),
    ],
)
def test_tokenizer_errors(entries: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_endpoints_document(entries)
    assert message in str(info.value)


def test_relative_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    f = EndpointsFile(tmp_path / "conf" / "endpoints.yaml", Datastore())
    doc = parse_endpoints_document(
        "- {address: 'a:1', model: m, tokenizer: tok}\n- {address: 'b:1', model: n, tokenizer: /abs}"
    )
    assert f.tokenizer_paths(doc) == {"m": tmp_path / "conf" / "tok", "n": Path("/abs")}


# -- start-up and reloads ---------------------------------------------------------------------------


def test_start_up_loads_tokenizers(tmp_path: Path, toks: registry.Tokenizers) -> None:
    copy_shipped(tmp_path / "llama")
    path = tmp_path / "endpoints.yaml"
    write(path, "- {address: 'a:1', model: llama, tokenizer: llama}\n- {address: 'b:1', model: other}\n")
    f = EndpointsFile(path, Datastore(), tokenizers=toks.source(registry.ENDPOINTS_FILE))
    f.load()
    llama = toks.for_model("llama")
    assert llama is not None and llama.path == tmp_path / "llama" / "tokenizer.json"
    assert toks.for_model("other") is None


def test_start_up_error_names_model_and_path(tmp_path: Path, toks: registry.Tokenizers) -> None:
    path = tmp_path / "endpoints.yaml"
    write(path, "- {address: 'a:1', model: llama, tokenizer: /nowhere/llama}\n")
    ds = Datastore()
    f = EndpointsFile(
        path, ds, tokenizers=toks.source(registry.ENDPOINTS_FILE, origin=f"endpoints file {path}")
    )
    expected = rf"^tokenizer for model 'llama' \(endpoints file {path}\): /nowhere/llama: no such file"
    with pytest.raises(tokenizer.TokenizerError, match=expected):
        f.load()
    assert ds.endpoints() == []  # the datastore is untouched


async def test_reload_adds_new_models_and_keeps_the_old_one_on_a_broken_path(
    tmp_path: Path, toks: registry.Tokenizers, caplog: pytest.LogCaptureFixture
) -> None:
    copy_shipped(tmp_path / "llama")
    path = tmp_path / "endpoints.yaml"
    write(path, "- {address: 'a:1', model: llama, tokenizer: llama}\n")
    ds = Datastore()
    f = EndpointsFile(path, ds, poll_interval=POLL, tokenizers=toks.source(registry.ENDPOINTS_FILE))
    await f.start()
    caplog.set_level(logging.INFO, logger="epp.tokenize")
    try:
        llama = toks.for_model("llama")
        assert llama is not None
        # A new model with its tokenizer: loaded off the loop, the first one kept as it was.
        copy_shipped(tmp_path / "qwen")
        write(
            path,
            "- {address: 'a:1', model: llama, tokenizer: llama}\n"
            "- {address: 'b:1', model: qwen, tokenizer: qwen}\n",
        )
        await until(lambda: toks.for_model("qwen") is not None, "qwen's tokenizer")
        assert toks.for_model("llama") is llama
        assert [ep.name for ep in ds.endpoints()] == ["a:1", "b:1"]
        # A broken path: logged with model and path; llama keeps the tokenizer it had.
        write(
            path,
            "- {address: 'a:1', model: llama, tokenizer: gone}\n"
            "- {address: 'c:1', model: qwen, tokenizer: qwen}\n",
        )
        await until(lambda: any(r.levelno == logging.ERROR for r in caplog.records), "the error")
        error = next(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
        assert "tokenizer for model 'llama'" in error and str(tmp_path / "gone") in error
        assert "keeping its previous tokenizer" in error
        assert toks.for_model("llama") is llama
        assert sorted(ep.name for ep in ds.endpoints()) == ["a:1", "c:1"]  # endpoints still applied
        # Fixed: the new path loads; a model the file stops naming loses its tokenizer.
        shutil.copytree(tmp_path / "llama", tmp_path / "gone")
        write(path, "- {address: 'a:1', model: llama, tokenizer: gone}\n")
        await until(lambda: toks.for_model("qwen") is None, "qwen dropped")
        fixed = toks.for_model("llama")
        assert fixed is not None and fixed is not llama and fixed.path == tmp_path / "gone" / "tokenizer.json"
    finally:
        await f.stop()
