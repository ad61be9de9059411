"""A long prompt's block keys are computed in a worker thread before scheduling (the scheduler's
Preparer stage), not on the event loop inside it; a short prompt's stay inline."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from epp.requestcontrol import director as director_mod
from epp.scheduling.plugins import precise_prefix_cache_scorer as precise
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import load_shipped
from tests.requestcontrol.test_director_tokens import director


@pytest.fixture
async def tokenizers() -> AsyncIterator[Tokenizers]:
    toks = Tokenizers(default=load_shipped(), workers=1)
    yield toks
    toks.close()


@pytest.mark.parametrize(("n_tokens", "ahead"), [(director_mod.PREPARE_AHEAD_TOKENS, True), (4000, False)])
async def test_long_prompts_are_keyed_off_the_loop(
    tokenizers: Tokenizers, monkeypatch: pytest.MonkeyPatch, n_tokens: int, ahead: bool
) -> None:
    threads: list[int] = []
    real = precise.block_keys

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(precise, "block_keys", recording)
    d = director(tokenizers)
    body = msgspec.json.encode({"model": "m", "prompt": list(range(n_tokens)), "max_tokens": 1})
    ctx = await d.route(path="/v1/completions", headers={}, body=body, subset=None)
    loop_thread = threading.get_ident()
    assert len(threads) == 1  # one group: keyed once, ahead or in `score`, never both
    assert (threads[0] != loop_thread) is ahead
    ctx.finish(complete=True)
