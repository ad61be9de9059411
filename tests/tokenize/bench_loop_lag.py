"""Event-loop lag while cold ~100k-token prompts are tokenized, prefix cache off vs on (a script).

The prefix cache chunks each new text in Python (holding the GIL), so on cold long prompts the
loop stalls where the GIL-releasing tokenizer call alone would not. Six distinct texts of 60,000
words drawn from README.md (~100k tokens each), 2 workers, the GIL's switch interval as `epp serve`
sets it; a ticker measures how late 1 ms sleeps wake up. With the cache: the first texts (which it
also encodes with `tokenizers`, to check fastokens' ids), and texts past those checks.

    .venv/bin/python -m tests.tokenize.bench_loop_lag
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

from epp.serve import GIL_SWITCH_INTERVAL
from epp.tokenize import prefixcache
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import load_shipped

WORDS = (Path(__file__).parents[2] / "README.md").read_text().split()


async def run(cache_bytes: int, *, checked: bool = True) -> None:
    toks = Tokenizers(default=load_shipped(), workers=2, prefix_cache_bytes=cache_bytes)
    if not checked:  # past the texts the cache checks against `tokenizers` (all but 1 in 64 after)
        for i in range(prefixcache.VERIFY_FIRST):
            await toks.encode("m", f"warm-up {i} " + " ".join(WORDS[:1000]))
            await toks.drain()
    rng = random.Random(1)
    texts = [" ".join(rng.choices(WORDS, k=60_000)) for _ in range(6)]
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    task = asyncio.create_task(ticker())
    t0 = time.perf_counter()
    for text in texts:
        await toks.encode("m", text)
    elapsed = time.perf_counter() - t0
    done.set()
    await task
    toks.close()
    lags.sort()
    print(
        f"prefix cache {cache_bytes >> 20:3d} MiB{'' if checked else ', past the checks'}:"
        f" {elapsed / len(texts) * 1e3:5.0f} ms per text; "
        f"loop lag p99 {lags[int(len(lags) * 0.99)] * 1e3:5.1f} ms, max {lags[-1] * 1e3:5.1f} ms"
    )


def main() -> None:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)  # as `epp serve` runs
    asyncio.run(run(0))
    asyncio.run(run(64 << 20))
    asyncio.run(run(64 << 20, checked=False))


if __name__ == "__main__":
    main()
