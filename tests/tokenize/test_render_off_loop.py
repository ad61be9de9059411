"""A long chat is rendered by a tokenizer worker, not on the event loop (issue 19: eight 14 MiB
message lists rendered on the loop took every other request's p50 to 5.9 s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from epp.tokenize import chat
from epp.tokenize.registry import RENDER_INLINE_MESSAGES, Tokenizers
from epp.tokenize.tokenizer import load_shipped


def _chat(n: int) -> dict[str, Any]:
    roles = ("user", "assistant")
    return {"model": "m", "messages": [{"role": roles[i % 2], "content": f"turn {i} " * 5} for i in range(n)]}


async def _largest_gap(work: Callable[[], Any]) -> float:
    """The longest the loop went without running a 1 ms ticker while `work()` was awaited."""
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    await work()
    done = True
    await task
    return max(gaps)


async def test_a_long_chat_renders_off_the_loop(track: Callable[[Tokenizers], Tokenizers]) -> None:
    tok = load_shipped()
    toks = track(Tokenizers(default=tok, workers=1, prefix_cache_bytes=0))
    body = _chat(5_000)  # ~300k characters rendered: under the tokenizer's max_chars
    assert await toks.encode_chat("m", body) == chat.encode_chat(tok, body)
    body = _chat(40_000)
    t0 = time.perf_counter()
    chat.prepare_chat(tok, body)
    inline = time.perf_counter() - t0  # what rendering on the loop stalled it for (~0.5 s)
    gap = await _largest_gap(lambda: toks.encode_chat("m", body))
    # a worker holds the GIL for sys.getswitchinterval() (5 ms) at a time; the margin is for
    # a loaded machine's scheduling
    assert gap < inline / 3, (gap, inline)


async def test_a_short_chat_still_renders_inline(track: Callable[[Tokenizers], Tokenizers]) -> None:
    tok = load_shipped()
    toks = track(Tokenizers(default=tok, workers=1))
    body = _chat(RENDER_INLINE_MESSAGES)
    assert await toks.encode_chat("m", body) == chat.encode_chat(tok, body)
