"""`parse_tokenizer_arg` and `Tokenizers`: lookup, the async encode path, truncation, counters."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from epp.tokenize import registry, tokenizer

Track = Callable[[registry.Tokenizers], registry.Tokenizers]

PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog, then it runs back into the forest where its den "
    "is hidden under the roots of an old oak tree. "
)
LONG = PARAGRAPH * 40  # ~4.6k characters: goes to the worker threads
SHORT = "How are you today?"  # below INLINE_CHARS: encoded on the loop


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# -- parse_tokenizer_arg ------------------------------------------------------------------------------


def test_parse_nothing() -> None:
    spec = registry.parse_tokenizer_arg([])
    assert spec == registry.TokenizerSpec()
    assert not spec


def test_parse_default_and_models() -> None:
    spec = registry.parse_tokenizer_arg(
        ["/models/base", " llama = /models/llama ", "meta-llama/Llama-3.1-8B=/m/a=b"]
    )
    assert spec.default == Path("/models/base")
    assert spec.by_model == {"llama": Path("/models/llama"), "meta-llama/Llama-3.1-8B": Path("/m/a=b")}
    assert spec


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([""], "empty value"),
        (["  "], "empty value"),
        (["=/a"], "'=/a': the model name before '=' is empty"),
        (["m="], "'m=': the path after '=' is empty"),
        (["/a", "/b"], "'/b': a default tokenizer is already given (/a)"),
        (["m=/a", "m=/b"], "'m=/b': model 'm' already has a tokenizer (/a)"),
    ],
)
def test_parse_errors(values: list[str], expected: str) -> None:
    with pytest.raises(ValueError, match=r"^--tokenizer") as info:
        registry.parse_tokenizer_arg(values)
    assert expected in str(info.value)


# -- building and lookup ------------------------------------------------------------------------------


def test_nothing_configured_means_epp_tiny(track: Track) -> None:
    toks = track(registry.Tokenizers.from_spec(registry.TokenizerSpec()))
    found = toks.for_model("any-model")
    assert found is not None and found.name == "epp-tiny"
    assert toks.models == {}


def test_no_shipped_default(track: Track) -> None:
    toks = track(registry.Tokenizers.from_spec(registry.TokenizerSpec(), shipped_default=False))
    assert toks.for_model("any-model") is None


def test_per_model_without_default(tmp_path: Path, track: Track) -> None:
    llama = _copy(tokenizer.SHIPPED_DIR, tmp_path / "llama")
    spec = registry.parse_tokenizer_arg([f"llama={llama}", f"llama-chat={llama / 'tokenizer.json'}"])
    toks = track(registry.Tokenizers.from_spec(spec))
    a, b = toks.for_model("llama"), toks.for_model("llama-chat")
    assert a is not None and a.name == "llama"
    assert b is not None and b.name == "llama"
    assert toks.for_model("mistral") is None  # once something is configured, epp-tiny is not implied
    assert toks.default is None


def test_same_path_loaded_once(tmp_path: Path, track: Track) -> None:
    folder = _copy(tokenizer.SHIPPED_DIR, tmp_path / "llama")
    same = f"{tmp_path}/../{tmp_path.name}/llama"
    spec = registry.parse_tokenizer_arg([str(folder), f"a={folder}", f"b={same}"])
    toks = track(registry.Tokenizers.from_spec(spec))
    assert toks.for_model("a") is toks.for_model("b") is toks.default


def test_lookup_order(tmp_path: Path, track: Track, shipped: tokenizer.Tokenizer) -> None:
    base = tokenizer.Tokenizer.load(_copy(tokenizer.SHIPPED_DIR, tmp_path / "base"))
    adapter = tokenizer.Tokenizer.load(_copy(tokenizer.SHIPPED_DIR, tmp_path / "adapter"))
    toks = track(registry.Tokenizers({"base": base, "own-adapter": adapter}, default=shipped))
    assert toks.for_model("base") is base
    assert toks.for_model("own-adapter", base_model="base") is adapter  # its own entry wins
    assert toks.for_model("sql-lora", base_model="base") is base  # LoRA: falls back to its base
    assert toks.for_model("sql-lora", base_model="unknown") is shipped
    assert toks.for_model("sql-lora") is shipped


def test_load_error_names_the_model(tmp_path: Path) -> None:
    spec = registry.parse_tokenizer_arg([f"llama={tmp_path / 'missing'}"])
    with pytest.raises(tokenizer.TokenizerError, match=r"^tokenizer for model 'llama': .*missing"):
        registry.Tokenizers.from_spec(spec)
    spec = registry.parse_tokenizer_arg([str(tmp_path / "missing")])
    with pytest.raises(tokenizer.TokenizerError, match=r"^default tokenizer: "):
        registry.Tokenizers.from_spec(spec)


def test_bad_max_chars() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        registry.Tokenizers(max_chars=0)


# -- encode -------------------------------------------------------------------------------------------


async def test_async_equals_sync(track: Track, shipped: tokenizer.Tokenizer) -> None:
    toks = track(registry.Tokenizers(default=shipped))
    assert len(SHORT) <= registry.INLINE_CHARS < len(LONG)
    for text in (SHORT, LONG, ""):
        for special in (True, False):
            expected = shipped.encode(text, add_special_tokens=special)
            assert await toks.encode("m", text, add_special_tokens=special) == expected


async def test_missing_model_counted(track: Track) -> None:
    toks = track(registry.Tokenizers())
    assert await toks.encode("llama", "hi") is None
    assert await toks.encode("llama", "hi") is None
    assert await toks.encode("mistral", LONG) is None
    assert toks.missing == {"llama": 2, "mistral": 1}


async def test_missing_names_are_bounded(track: Track) -> None:
    toks = track(registry.Tokenizers())
    for i in range(registry.MAX_COUNTED_MODELS + 10):
        await toks.encode(f"model-{i}", "hi")
    await toks.encode("model-0", "hi")  # already counted: keeps its own entry
    assert len(toks.missing) == registry.MAX_COUNTED_MODELS + 1
    assert toks.missing[registry.OTHER_MODELS] == 10
    assert toks.missing["model-0"] == 2


async def test_truncation(track: Track, shipped: tokenizer.Tokenizer) -> None:
    toks = track(registry.Tokenizers(default=shipped, max_chars=1000))
    text = PARAGRAPH * 100
    ids = await toks.encode("m", text)
    assert ids == shipped.encode(text[:1000])
    assert toks.truncated == {"epp-tiny": 1}
    # Only the tokens of the cut word differ from the full text's.
    full = shipped.encode(text)
    assert ids is not None and ids[:-2] == full[: len(ids) - 2]
    assert await toks.encode("m", text[:1000]) == ids
    assert toks.truncated == {"epp-tiny": 1}  # at the limit: not truncated


async def test_many_concurrent_encodes(track: Track, shipped: tokenizer.Tokenizer) -> None:
    toks = track(registry.Tokenizers(default=shipped, workers=3))
    texts = [PARAGRAPH * (i % 37) + str(i) for i in range(300)]
    results = await asyncio.gather(*(toks.encode("m", t) for t in texts))
    assert results == [shipped.encode(t) for t in texts]


class _Gated(tokenizer.Tokenizer):
    """Blocks in encode until the test opens the gate; records which thread encoded."""

    def __init__(self, shipped: tokenizer.Tokenizer, on_start: Callable[[], object] = lambda: None) -> None:
        super().__init__(shipped.backend, name="gated")
        self.gate = threading.Event()
        self.threads: list[str] = []
        self.on_start = on_start

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        self.on_start()
        if not self.gate.wait(timeout=10):
            raise AssertionError("encode ran on the event loop: the gate could never open")
        return super().encode(text, add_special_tokens=add_special_tokens)


async def test_long_texts_do_not_block_the_loop(track: Track, shipped: tokenizer.Tokenizer) -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    gated = _Gated(shipped, on_start=lambda: loop.call_soon_threadsafe(started.set))
    # Without the prefix cache, which tokenizes through the backend and would bypass the gate.
    toks = track(registry.Tokenizers(default=gated, workers=1, prefix_cache_bytes=0))
    task = asyncio.create_task(toks.encode("m", LONG))
    await asyncio.wait_for(started.wait(), 5)  # the loop runs while the worker is inside encode
    gated.gate.set()
    assert await task == shipped.encode(LONG)
    assert gated.threads[0].startswith("epp-tokenize")


async def test_short_texts_are_encoded_inline(track: Track, shipped: tokenizer.Tokenizer) -> None:
    gated = _Gated(shipped)
    gated.gate.set()
    toks = track(registry.Tokenizers(default=gated))
    await toks.encode("m", SHORT)
    assert gated.threads == [threading.current_thread().name]


async def test_close(shipped: tokenizer.Tokenizer) -> None:
    toks = registry.Tokenizers(default=shipped)
    await toks.encode("m", LONG)
    toks.close()
    for text in (LONG, SHORT):
        with pytest.raises(RuntimeError, match="after close"):
            await toks.encode("m", text)
    toks.close()  # idempotent
