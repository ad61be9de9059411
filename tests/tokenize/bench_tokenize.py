"""Microbenchmark (a script, not a test): tokenizing prompts with epp-tiny, and what it does to the loop.

    .venv/bin/python -m tests.tokenize.bench_tokenize              # everything (~1 min)
    .venv/bin/python -m tests.tokenize.bench_tokenize stall    # or sync|async|concurrency|engines|prefix

Texts: this repository's Markdown and Python files in path order (prose, tables and code, ~2.7
characters per epp-tiny token), repeated as needed and cut to exactly 1k/4k/16k/100k tokens.
`gc.collect()` before each timed loop.
- sync: one call at a time on this thread. `Tokenizer.encode` (what epp uses: fastokens for texts
  `FastEngine.takes`, else tokenizers' `encode_batch_fast`) against tokenizers' `encode` and
  `encode_batch`.
- engines: fastokens alone, `Tokenizer.encode`, and `tokenizers` on pieces of 1,700 to 270,000
  characters; how many pieces fastokens takes; ids compared.
- prefix: the prefix cache, with fastokens and with `tokenizers` only
  (docs/bench/microbenchmarks.md#microbenchmarks).
- async: `await Tokenizers.encode(...)` one at a time (workers 2): latency including the hand-off
  to a worker thread.
- stall: a task sleeping 1 ms in a loop measures how late it wakes (loop lag) while prompts of
  16k and 100k tokens are encoded back to back for ~1 s: idle; on the loop with `encode`;
  in a thread with `encode` (holds the GIL); through `Tokenizers.encode` (releases it).
- concurrency: 64 concurrent 4k-token encodes through `Tokenizers` with 1, 2 and 4 workers:
  wall time, tokens per second, loop lag.

Results with fastokens 0.3.5 (2026-11-22, commit 0d7a48d), sync p50 / p99 ms, `Tokenizer.encode`:
0.31/0.73 (1k), 1.34/2.41 (4k), 23.8/26.5 (16k: over MAX_FAST_CHARS, so tokenizers), 128/208
(100k, tokenizers); tokenizers' `encode` in the same run 1.33, 6.37, 32.1, 184. (`async` repeats one
text, which the prefix cache answers whole since it was added: it no longer measures encoding.)

Earlier results (2026-11-22, 2-vCPU VM, Python 3.11.7, tokenizers 0.23.3; timings vary ~30% between runs):
- sync p50 / p99 ms. Tokenizer.encode: 0.95/1.3 (1k), 4.5/7.6 (4k), 21/30 (16k), 112/144 (100k).
  tokenizers encode: 1.1/2.0, 6.0/10, 25/34, 181/202. encode_batch: 1.4/2.3, 6.2/11, 27/40,
  179/203. About 1.1 us per token for this text with Tokenizer.encode.
- async p50 / p99 ms: 0.96/1.9 (1k), 4.9/6.6 (4k), 15/20 (16k), 106/137 (100k): the hand-off to a
  worker costs less than the run-to-run noise.
- stall, max / p99 ms: idle 1.0/0.3. 16k tokens: on the loop 107 (the 1 ms ticker waits out more
  than one encode, since the work task is resumed ahead of its timer), thread with encode 29,
  Tokenizers.encode 3.7/1.0. 100k tokens: 611, 225, 2.4/1.2.
- concurrency, 64 x 4k tokens: 1 worker 283 ms (0.9M tokens/s), lag p99 1.2 ms; 2 workers 162 ms
  (1.6M tokens/s), p99 4.4 ms; 4 workers 191 ms (1.3M tokens/s), p99 8.6 ms.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from epp.tokenize import chat, prefixcache, registry, tokenizer

ROOT = Path(__file__).resolve().parents[2]
SIZES = {1_000: 200, 4_000: 100, 16_000: 40, 100_000: 10}  # tokens -> repetitions


def source_text() -> str:
    files = sorted(
        p
        for pattern in ("*.md", "docs/**/*.md", "epp/**/*.py", "tests/**/*.py")
        for p in ROOT.glob(pattern)
        if ".venv" not in p.parts
    )
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def texts(tok: tokenizer.Tokenizer) -> dict[int, str]:
    """Texts of exactly n tokens (without BOS) for each size."""
    base = source_text()
    out = {}
    for n in SIZES:
        text = base
        while len(tok.encode(text, add_special_tokens=False)) <= n:
            text += "\n" + base
        offsets = tok.backend.encode(text, add_special_tokens=False).offsets
        out[n] = text[: offsets[n - 1][1]]
    return out


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f}"


def timed(fn: Callable[[], object], n: int) -> list[float]:
    fn()
    gc.collect()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def bench_sync(tok: tokenizer.Tokenizer, by_size: dict[int, str]) -> None:
    print("== sync, one call at a time: p50 / p99 ms")
    backend = tok.backend
    for n, reps in SIZES.items():
        text = by_size[n]
        row = [f"{n:>7} tokens ({len(text):>7} chars)"]
        for label, fn in (
            ("Tokenizer.encode", lambda text=text: tok.encode(text)),
            ("tokenizers encode", lambda text=text: backend.encode(text)),
            ("encode_batch", lambda text=text: backend.encode_batch([text])),
        ):
            s = timed(fn, reps)
            row.append(f"{label} {ms(pct(s, 0.5))} /{ms(pct(s, 0.99))}")
        print("  ".join(row))


async def bench_async(tok: tokenizer.Tokenizer, by_size: dict[int, str]) -> None:
    print("== async, Tokenizers.encode one at a time (2 workers): p50 / p99 ms")
    toks = registry.Tokenizers(default=tok, workers=2)
    try:
        for n, reps in SIZES.items():
            text = by_size[n]
            await toks.encode("m", text)
            gc.collect()
            samples = []
            for _ in range(reps):
                t0 = time.perf_counter()
                await toks.encode("m", text)
                samples.append(time.perf_counter() - t0)
            print(f"{n:>7} tokens  {ms(pct(samples, 0.5))} / {ms(pct(samples, 0.99))}")
    finally:
        toks.close()


async def lag_while(work: Callable[[], Awaitable[object]], duration: float) -> tuple[float, float, int]:
    """Run `work` back to back for `duration` s (at least once); return (max, p99) loop lag, calls."""
    lags: list[float] = []
    done = False

    async def ticker() -> None:
        while not done:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    gc.collect()
    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    calls = 0
    end = time.perf_counter() + duration
    while True:  # at least once
        await work()
        calls += 1
        await asyncio.sleep(0)
        if time.perf_counter() >= end:
            break
    done = True
    await tick
    return max(lags), pct(lags, 0.99), calls


async def bench_stall(tok: tokenizer.Tokenizer, by_size: dict[int, str]) -> None:
    print("== stall: loop lag while encoding back to back for 1 s: max / p99 ms (calls)")
    loop = asyncio.get_running_loop()
    gil_pool = ThreadPoolExecutor(1)
    toks = registry.Tokenizers(default=tok, workers=2)

    async def idle() -> None:
        await asyncio.sleep(0.01)

    try:
        mx, p99, calls = await lag_while(idle, 1.0)
        print(f"idle{'':28} {ms(mx)} / {ms(p99)}")
        for n in (16_000, 100_000):
            text = by_size[n]

            async def on_loop(text: str = text) -> None:
                tok.backend.encode(text)

            async def thread_gil(text: str = text) -> None:
                await loop.run_in_executor(gil_pool, tok.backend.encode, text)

            async def tokenizers_path(text: str = text) -> None:
                await toks.encode("m", text)

            for label, work in (
                ("on the loop, encode", on_loop),
                ("thread, encode (GIL held)", thread_gil),
                ("Tokenizers.encode", tokenizers_path),
            ):
                mx, p99, calls = await lag_while(work, 1.0)
                print(f"{n:>7} tokens {label:26} {ms(mx)} / {ms(p99)}  ({calls})")
    finally:
        gil_pool.shutdown()
        toks.close()


async def bench_concurrency(tok: tokenizer.Tokenizer, by_size: dict[int, str]) -> None:
    print("== concurrency: 64 concurrent 4k-token encodes via Tokenizers")
    text = by_size[4_000]
    for workers in (1, 2, 4):
        toks = registry.Tokenizers(default=tok, workers=workers)
        try:
            await asyncio.gather(*(toks.encode("m", text) for _ in range(8)))
            t0 = time.perf_counter()
            mx, p99, _ = await lag_while(
                lambda toks=toks: asyncio.gather(*(toks.encode("m", text) for _ in range(64))), 0.0
            )
            wall = time.perf_counter() - t0
            print(
                f"workers {workers}: wall {ms(wall)} ms  {64 * 4_000 / wall / 1e3:7.0f}k tokens/s  "
                f"lag max {ms(mx)} p99 {ms(p99)}"
            )
        finally:
            toks.close()


def _chunks_of(tok: tokenizer.Tokenizer, text: str, tokens: int) -> list[str]:
    """`text` cut into consecutive pieces of about `tokens` tokens (at ~2.7 characters per token)."""
    size = int(tokens * 2.7)
    return [text[i : i + size] for i in range(0, len(text) - size, size)]


def _cut(tok: tokenizer.Tokenizer, text: str, tokens: int) -> str:
    """The start of `text` that is exactly `tokens` tokens (without BOS)."""
    offsets = tok.backend.encode(text[: tokens * 8], add_special_tokens=False).offsets
    return text[: offsets[tokens - 1][1]]


async def _warm_chat_requests(
    tok: tokenizer.Tokenizer, bodies: list[dict[str, object]], seen: dict[str, object]
) -> None:
    """What a request waits for: `await Tokenizers.encode_chat` (render, lookup on the loop, then
    the encode: on the loop or in a worker), one request at a time. With the fast engine the cache's
    commit step runs after the answer: measured back to back (each commit overlapping the next
    request) and with the previous commit done first (requests spaced out)."""
    toks = registry.Tokenizers(default=tok, workers=2)
    try:
        await toks.encode_chat("m", seen)
        await toks.drain()
        cache = toks.prefix_caches[tok.name]
        half = len(bodies) // 2  # new user messages in each pass
        for spaced, part in ((False, bodies[:half]), (True, bodies[half:])):
            samples = []
            gc.collect()
            for body in part:
                if spaced:
                    await toks.drain()
                t0 = time.perf_counter()
                await toks.encode_chat("m", body)
                samples.append(time.perf_counter() - t0)
            await toks.drain()
            how = "previous commit done" if spaced else "back to back"
            print(
                f"warm 4k chat, await Tokenizers.encode_chat ({how}):"
                f" {ms(pct(samples, 0.5))} / {ms(pct(samples, 0.99))}"
            )
        dropped = toks.commits_dropped.get(tok.name, 0)
        assert cache.partial_hits + dropped == len(bodies), (cache.partial_hits, dropped)
        print(
            f"  commits dropped (too many pending): {dropped}; engine mismatches: {cache.engine_mismatches}"
        )
    finally:
        toks.close()


def _begin_and_commit(cache: prefixcache.PrefixCache, text: str) -> tuple[float, float]:
    """Seconds to `begin`'s ids (what a request waits for) and to the end of its commit step."""
    t0 = time.perf_counter()
    _, commit = cache.begin(text, add_special_tokens=False)
    t1 = time.perf_counter()
    commit()
    return t1 - t0, time.perf_counter() - t0


def bench_prefix(tok: tokenizer.Tokenizer) -> None:
    print(f"== prefix cache (PrefixCache, sync), engine {tok.engine}: p50 / p99 ms")
    base = source_text() * 4
    cache = prefixcache.PrefixCache(tok)
    # Cold: every text new (a miss, with chunking and insertion), one core.
    cold = [base[i * 997 : i * 997 + 10_800] for i in range(1, 60)]
    t0 = time.perf_counter()
    n = sum(len(cache.encode(t)) for t in cold)
    print(f"cold, one thread: {n / (time.perf_counter() - t0) / 1e3:7.0f}k tokens/s (cache on, with commit)")
    t0 = time.perf_counter()
    n = sum(len(tok.encode(t)) for t in cold)
    print(f"cold, one thread: {n / (time.perf_counter() - t0) / 1e3:7.0f}k tokens/s (no cache)")
    cold2 = [base[i * 991 : i * 991 + 10_800] for i in range(60, 188)]
    for label, fn in (("cache on, with commit", cache.encode), ("no cache", tok.encode)):
        with ThreadPoolExecutor(2) as pool:
            t0 = time.perf_counter()
            n = sum(len(ids) for ids in pool.map(fn, cold2))
            print(f"cold, two threads: {n / (time.perf_counter() - t0) / 1e3:7.0f}k tokens/s ({label})")
        cold2 = [t + "x" for t in cold2]

    # Warm 4k: a 3,500-token system prompt seen before, a new 500-token user message each time
    # (both cut at exact token counts; the chat is ~4,010 tokens).
    system = _cut(tok, base, 3_500)
    users: list[str] = []
    at = len(system)
    while len(users) < 400:  # 200 for `PrefixCache`, 2 x 100 for the request path
        users.append(_cut(tok, base[at:], 500))
        at += len(users[-1])

    def body(user: str) -> dict[str, object]:
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}

    prompts = [chat.render_chat(tok, body(u)) for u in users]
    print(f"warm 4k chat: {len(tok.encode(prompts[0]))} tokens")
    full = timed(lambda: tok.encode(prompts[0], add_special_tokens=False), 50)
    cache = prefixcache.PrefixCache(tok)
    cache.encode(chat.render_chat(tok, body("Hello")), add_special_tokens=False)
    gc.collect()
    ready, done = (list(x) for x in zip(*(_begin_and_commit(cache, t) for t in prompts[:200]), strict=True))
    print(f"warm 4k chat: ids {ms(pct(ready, 0.5))} / {ms(pct(ready, 0.99))}, with commit", end="")
    print(f" {ms(pct(done, 0.5))} / {ms(pct(done, 0.99))}  (no cache {ms(pct(full, 0.5))})")
    asyncio.run(_warm_chat_requests(tok, [body(u) for u in users[200:]], body("Hello")))

    # Warm 100k: a conversation of ~300-token turns; the previous turn's prompt was seen.
    turns = _chunks_of(tok, base, 300)
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    cache = prefixcache.PrefixCache(tok)
    k = 2
    while len(chat.render_chat(tok, {"messages": messages[:k]})) < 100_000 * 2.7:
        k += 2
    ready, done = [], []
    for j in range(k, k + 60, 2):
        cache.encode(chat.render_chat(tok, {"messages": messages[: j - 1], "add_generation_prompt": False}))
        text = chat.render_chat(tok, {"messages": messages[: j + 1]})
        a, b = _begin_and_commit(cache, text)
        ready.append(a)
        done.append(b)
    print(f"warm 100k conversation: {len(tok.encode(text))} tokens, ids {ms(pct(ready, 0.5))} /", end="")
    print(f" {ms(pct(ready, 0.99))}, with commit {ms(pct(done, 0.5))} / {ms(pct(done, 0.99))}")
    print(
        f"memory: {cache.cached_bytes / cache.cached_tokens:.1f} bytes per cached token "
        f"({cache.cached_tokens} tokens, {cache.nodes} chunks, {cache.cached_bytes / 2**20:.1f} MiB)"
    )


def bench_engines() -> None:
    """fastokens against tokenizers on the same texts, one call at a time: p50 / p99 ms. fastokens
    alone (`FastEngine.encode`), then `Tokenizer.encode` as epp calls it: fastokens only for texts
    `FastEngine.takes` (no run over MAX_RUN_CHARS), the rest with tokenizers after that check."""
    fast, ref = tokenizer.load_shipped(), tokenizer.load_shipped(engine="tokenizers")
    engine = fast.fast
    assert engine is not None
    base = source_text()
    print("== engines (sync): p50 / p99 ms; fastokens alone, Tokenizer.encode (fastokens), tokenizers")
    for chars, n in ((1_700, 300), (4_096, 200), (10_800, 100), (270_000, 10)):
        pieces = (
            [base[i * chars : (i + 1) * chars] for i in range(n)]
            if chars * n < len(base)
            else [base[:chars]] * n
        )
        same = all(engine.encode(t, add_special_tokens=True) == ref.encode(t) for t in pieces)
        rows = []
        for fn in (lambda t: engine.encode(t, add_special_tokens=True), fast.encode, ref.encode):
            samples = []
            gc.collect()
            for t in pieces:
                t0 = time.perf_counter()
                fn(t)
                samples.append(time.perf_counter() - t0)
            rows.append(samples)
        taken = sum(engine.takes(t) for t in pieces)
        cells = "  ".join(f"{ms(pct(r, 0.5))} / {ms(pct(r, 0.99))}" for r in rows)
        print(
            f"{chars:>7} chars (~{len(ref.encode(pieces[0]))} tokens): {cells}"
            f"  (alone {pct(rows[2], 0.5) / pct(rows[0], 0.5):.1f}x; taken {taken}/{len(pieces)};"
            f" ids equal: {same})"
        )


def main(argv: list[str]) -> None:
    tok = tokenizer.load_shipped()
    by_size = texts(tok) if set(argv) - {"prefix", "engines"} or not argv else {}
    sections = set(argv) or {"sync", "async", "stall", "concurrency", "engines", "prefix"}
    if "sync" in sections:
        bench_sync(tok, by_size)
    if "async" in sections:
        asyncio.run(bench_async(tok, by_size))
    if "stall" in sections:
        asyncio.run(bench_stall(tok, by_size))
    if "concurrency" in sections:
        asyncio.run(bench_concurrency(tok, by_size))
    if "engines" in sections:
        bench_engines()
    if "prefix" in sections:
        bench_prefix(tok)
        bench_prefix(tokenizer.load_shipped(engine="tokenizers"))


if __name__ == "__main__":
    main(sys.argv[1:])
