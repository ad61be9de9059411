"""Benchmark (a script, not a test): epp's CPU per routed request for long prompts, and where a
shared-prefix request's time goes.

    .venv/bin/python -m tests.requestcontrol.bench_long_prompts                  # both sections
    .venv/bin/python -m tests.requestcontrol.bench_long_prompts long --sizes 8000,32000 --reps 5
    .venv/bin/python -m tests.requestcontrol.bench_long_prompts breakdown --requests 400
    .venv/bin/python -m tests.requestcontrol.bench_long_prompts breakdown --requests 300 --pods 8,100,1000
    .venv/bin/python -m tests.requestcontrol.bench_long_prompts runrule --sizes 32000,100000 --reps 16
    .venv/bin/python -m tests.requestcontrol.bench_long_prompts steady --sizes 100000 --requests 300

Each runs epp's real request path in this process, without gRPC: `Director.route` (parse,
tokenize with epp-tiny through the prefix-tokenization cache, the default precise config's scorers
over 8 pods with a real KV index, book) and `RequestContext.finish` (release), on one event loop,
with the tokenizer's worker threads and glibc's malloc settings (`epp.malloc`) as `epp serve` has
them. CPU is the process's (every thread), per request, from `time.process_time`; "loop" is the
longest stretch the event loop was held during the request (a 1 ms ticker's largest gap), which
is what other streams wait for.

- long: completions and chats of 8k, 32k, 100k and 200k tokens, cold (text never seen) and
  "seen" (the first 90% was sent before and a pod's KV events hold it: only the last 10% is
  new). Targets (issue 28): a 100k-token request whose first 90k were seen <= 5 ms of CPU; a cold
  one <= 40 ms, kept off the event loop.
- steady: `--requests` seen requests of each size in a row (the same 90% prefix, a new last 10%
  each), the mean CPU per request once the precise scorer's speculative entries of earlier
  requests expire as they do when serving (`long`'s five are over before the first does). The
  prefix cache's commit step is counted here: where it runs (beside the request or after it)
  depends on thread timing, so counting only the request's own span moves with that.
- runrule: cold requests with `FastEngine.takes`'s run rule in C and in its former Python form,
  alternated request by request in one process.
- breakdown: the peers' shared-prefix workload's shape (inference-perf's `shared_prefix`: 30
  system prompts of 2k-4k tokens, short questions; here as chats) routed one after another, over
  8 pods or `--pods` (each system prompt held by one); CPU per request and the scheduler's wall
  time per request (p50), then the same under cProfile, by phase (parse, tokenize, keys,
  scheduling by plugin, book and release), in microseconds per request. cProfile inflates every
  call by about the same factor: read its column as shares of the measured total.

Run it on a quiet machine: on a shared one the CPU figures move with the neighbours (compare
rows of one run, not runs).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import itertools
import pstats
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from epp import malloc
from epp.api.context_length import ContextLimits
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.kvcache.events import BlockStored, EventBatch
from epp.kvcache.index import BlockIndex
from epp.requestcontrol.director import Director
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.tokenize import prefixcache
from epp.tokenize.chat import encode_chat
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import Tokenizer, load_shipped

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny"
PODS = 8
BLOCK = 16


def corpus() -> str:
    files = sorted(p for pattern in ("*.md", "docs/**/*.md", "epp/**/*.py") for p in ROOT.glob(pattern))
    return "\n".join(p.read_text(encoding="utf-8") for p in files if ".venv" not in p.parts)


class Text:
    """Slices of the repository's text of about n tokens, each unlike the others."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        base = corpus()
        self.text = base
        while len(self.text) < 4_000_000:
            self.text += "\n" + base
        self.chars_per_token = len(base) / len(tok.encode(base, add_special_tokens=False))
        self.rng = random.Random(7)

    def piece(self, tokens: int, tag: str) -> str:
        """About `tokens` tokens (+-2%) from a random place, led by `tag`."""
        size = int(tokens * self.chars_per_token)
        start = self.rng.randrange(0, len(self.text) - size)
        return f"[{tag}] " + self.text[start : start + size]


def make_director(tokenizers: Tokenizers, pods: int = PODS) -> tuple[Director, BlockIndex]:
    ds = Datastore()
    ds.sync(
        "bench",
        [
            EndpointSpec(
                name=f"pod-{i}",
                address=f"10.{(i + 1) >> 16}.{((i + 1) >> 8) & 255}.{(i + 1) & 255}",
                port=8000,
                model=MODEL,
            )
            for i in range(pods)
        ],
    )
    index = BlockIndex()
    cfg = sched_config.load_config(None, Handle(datastore=ds, kv_index=index))  # the precise default
    director = Director(
        datastore=ds,
        scheduler=cfg.scheduler,
        pre_request=cfg.pre_request,
        response_complete=cfg.response_complete,
        tokenizer=tokenizers,
        context_limits=ContextLimits(overrides={"*": 1_000_000}),
    )
    return director, index


_ids = itertools.count()


def next_headers() -> dict[str, str]:
    """What Envoy adds to every request (epp makes an id only when it is missing)."""
    return {"x-request-id": f"bench-{next(_ids)}", "content-type": "application/json"}


def body_of(kind: str, text: str, tail: str) -> bytes:
    if kind == "completions":
        return msgspec.json.encode({"model": MODEL, "prompt": text + tail, "max_tokens": 16})
    return msgspec.json.encode(
        {
            "model": MODEL,
            "max_tokens": 16,
            "messages": [{"role": "system", "content": text}, {"role": "user", "content": tail}],
        }
    )


def path_of(kind: str) -> str:
    return "/v1/completions" if kind == "completions" else "/v1/chat/completions"


def report_blocks(index: BlockIndex, tok: Tokenizer, kind: str, body: bytes, pod: str) -> None:
    """What the pod's engine would report after serving `body`: its prompt's full blocks."""
    request = msgspec.json.decode(body)
    ids = tok.encode(request["prompt"]) if kind == "completions" else encode_chat(tok, request)
    n = len(ids) // BLOCK
    event = BlockStored(
        block_hashes=[random.getrandbits(63) for _ in range(n)],
        parent_block_hash=None,
        token_ids=ids[: n * BLOCK],
        block_size=BLOCK,
    )
    index.apply(pod, EventBatch(ts=time.time(), events=[event]), model=MODEL)


async def seen_prefix(
    director: Director, tokenizers: Tokenizers, index: BlockIndex, text: Text, kind: str, size: int
) -> str:
    """A prompt's first 90% of `size` tokens, sent once before (with another last 10%) and
    reported by the pod that served it."""
    prefix = text.piece(int(size * 0.9), f"{kind}-{size}")
    first = body_of(kind, prefix, text.piece(size // 10, "warm"))
    await one(director, kind, first)
    await tokenizers.drain()
    report_blocks(index, text.tok, kind, first, "pod-0")
    return prefix


async def one(director: Director, kind: str, body: bytes) -> tuple[float, float, float]:
    """(CPU s, wall s, longest loop hold s) of routing and finishing one request."""
    gaps = [0.0]
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps[0] = max(gaps[0], now - last - 0.001)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.003)
    c0, w0 = time.process_time(), time.perf_counter()
    ctx = await director.route(path=path_of(kind), headers=next_headers(), body=body, subset=None)
    ctx.finish(complete=True)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    done.set()
    await tick
    return cpu, wall, gaps[0]


async def bench_long(sizes: list[int], reps: int) -> None:
    tok = load_shipped()
    text = Text(tok)
    print("== long prompts: CPU per request (all threads), wall, longest loop hold; medians of", reps)
    print("   (commit: CPU of the prefix cache's caching step after the answer, not in CPU ms)")
    print(f"{'kind':12} {'tokens':>7} {'prefix':6} {'CPU ms':>8} {'wall ms':>8} {'loop ms':>8} {'commit':>8}")
    for kind in ("completions", "chat"):
        for size in sizes:
            for seen in (False, True):
                tokenizers = Tokenizers(default=tok)
                director, index = make_director(tokenizers)
                try:
                    await serving(tokenizers)
                    prefix = await seen_prefix(director, tokenizers, index, text, kind, size) if seen else ""
                    samples = []
                    for r in range(reps):
                        if seen:
                            body = body_of(kind, prefix, text.piece(size // 10, f"q{r}"))
                        else:
                            whole = text.piece(size, f"cold-{kind}-{size}-{r}")
                            cut = int(len(whole) * 0.9)
                            body = body_of(kind, whole[:cut], whole[cut:])
                        gc.collect()
                        cpu, wall, hold = await one(director, kind, body)
                        c0 = time.process_time()
                        await tokenizers.drain()  # the cache's commit step, after the answer
                        samples.append((cpu, wall, hold, time.process_time() - c0))
                    cpu, wall, hold, after = (statistics.median(s[i] for s in samples) for i in range(4))
                    label = "seen" if seen else "cold"
                    print(
                        f"{kind:12} {size:>7} {label:6} {cpu * 1e3:8.2f} {wall * 1e3:8.2f} {hold * 1e3:8.2f}"
                        f" {after * 1e3:8.2f}"
                    )
                finally:
                    tokenizers.close()


async def serving(tokenizers: Tokenizers) -> None:
    """Encode the texts a serving epp has behind it before a measured one: the prefix cache checks
    the first VERIFY_FIRST texts the fast engine encodes in pieces against `tokenizers`, then one in
    VERIFY_EVERY (`epp.tokenize.prefixcache`), and a long-running epp is past the first ones."""
    for i in range(prefixcache.VERIFY_FIRST):
        await tokenizers.encode(MODEL, f"warm-up text {i} " + "with words " * 600)
        await tokenizers.drain()  # past MAX_PENDING_COMMITS waiting, a commit is dropped


PHASES: list[tuple[str, Callable[[str, str], bool]]] = [
    ("parse the body", lambda file, fn: "api/requests.py" in file and fn.startswith("parse")),
    (
        "tokenize (render + prefix cache + encode)",
        lambda file, fn: "tokenize/registry.py" in file and fn.startswith("encode"),
    ),
    ("block keys (prepare)", lambda file, fn: "precise_prefix_cache_scorer.py" in file and fn == "prepare"),
    (
        "scheduling (filters, scorers, picker)",
        lambda file, fn: "scheduling/framework.py" in file and fn == "schedule",
    ),
    ("pre-request hooks", lambda file, fn: fn == "pre_request" and "scheduling/plugins" in file),
    ("book and release", lambda file, fn: "director.py" in file and fn in ("finish", "book")),
]


async def bench_breakdown(requests: int, pods: int = PODS) -> None:
    tok = load_shipped()
    text = Text(tok)
    tokenizers = Tokenizers(default=tok)
    director, index = make_director(tokenizers, pods)
    systems = [text.piece(random.Random(i).randrange(2000, 4000), f"system-{i}") for i in range(30)]
    rng = random.Random(1)

    def body() -> bytes:
        return body_of(
            "chat", rng.choice(systems), f"question {rng.randrange(10**6)}: what does it say about routing?"
        )

    try:
        for i, system in enumerate(systems):  # each system prompt seen once and held by a pod
            warm = body_of("chat", system, "hello")
            await one(director, "chat", warm)
            report_blocks(index, tok, "chat", warm, f"pod-{i % pods}")
        for _ in range(50):  # past the first requests' one-off work (per-pod state, caches)
            ctx = await director.route(
                path="/v1/chat/completions", headers=next_headers(), body=body(), subset=None
            )
            ctx.finish(complete=True)
        await tokenizers.drain()
        bodies = [body() for _ in range(requests)]
        scheduler = director.scheduler
        schedule = scheduler.schedule
        walls: list[float] = []

        def timed(*args: Any, **kwargs: Any) -> Any:
            w0 = time.perf_counter()
            try:
                return schedule(*args, **kwargs)
            finally:
                walls.append(time.perf_counter() - w0)

        scheduler.schedule = timed  # type: ignore[method-assign]
        gc.collect()
        c0 = time.process_time()
        for b in bodies:
            ctx = await director.route(
                path="/v1/chat/completions", headers=next_headers(), body=b, subset=None
            )
            ctx.finish(complete=True)
        total = (time.process_time() - c0) / requests
        scheduler.schedule = schedule  # type: ignore[method-assign]
        await tokenizers.drain()
        print(
            f"== shared-prefix chats (30 system prompts of 2k-4k tokens, {pods} pods):"
            f" {total * 1e6:.0f} us CPU per request; scheduling p50 {statistics.median(walls) * 1e6:.0f} us"
        )
        prof = cProfile.Profile()
        bodies = [body() for _ in range(requests)]
        prof.enable()
        for b in bodies:
            ctx = await director.route(
                path="/v1/chat/completions", headers=next_headers(), body=b, subset=None
            )
            ctx.finish(complete=True)
        prof.disable()
        await tokenizers.drain()
        stats = pstats.Stats(prof)
        raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
        grand = sum(tt for (_, _, _), (_, _, tt, _, _) in raw.items())
        print(
            f"   under cProfile {grand / requests * 1e6:.0f} us per request;"
            " by phase (cumulative, us per request):"
        )
        for label, match in PHASES:
            cum = sum(ct for (file, _, fn), (_, _, _, ct, _) in raw.items() if match(file, fn))
            print(f"   {label:45} {cum / requests * 1e6:8.1f}  ({100 * cum / grand:4.1f}%)")
        print("   top functions by own time (us per request):")
        rows = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:15]
        for (file, line, fn), (_, calls, tt, _, _) in rows:
            where = f"{Path(file).name}:{line} {fn}"
            print(f"   {where:70} {tt / requests * 1e6:8.1f}  ({calls / requests:.1f} calls)")
    finally:
        tokenizers.close()


async def bench_steady(sizes: list[int], requests: int) -> None:
    tok = load_shipped()
    text = Text(tok)
    print(f"== seen long prompts in a row: mean CPU per request (all threads, commit too) over {requests}")
    print(f"{'kind':12} {'tokens':>7} {'CPU ms':>8}")
    for kind in ("completions", "chat"):
        for size in sizes:
            tokenizers = Tokenizers(default=tok)
            director, index = make_director(tokenizers)
            try:
                await serving(tokenizers)
                prefix = await seen_prefix(director, tokenizers, index, text, kind, size)
                bodies = [body_of(kind, prefix, text.piece(size // 10, f"s{r}")) for r in range(requests)]
                total = 0.0
                for body in bodies:
                    c0 = time.process_time()
                    ctx = await director.route(
                        path=path_of(kind), headers=next_headers(), body=body, subset=None
                    )
                    ctx.finish(complete=True)
                    await tokenizers.drain()  # the cache's commit step, after the answer: counted
                    total += time.process_time() - c0
                print(f"{kind:12} {size:>7} {total / requests * 1e3:8.2f}")
            finally:
                tokenizers.close()


async def bench_run_rule(sizes: list[int], reps: int) -> None:
    """Cold requests with `FastEngine.takes`'s run rule in C (now) and in its Python form (the
    oracle of tests/tokenize/test_runs.py, as epp had it), alternated request by request in one
    process, so that both arms see the same machine."""
    from epp.tokenize import tokenizer as tokenizer_module
    from tests.tokenize.test_runs import oracle

    in_c = tokenizer_module.FastEngine.takes

    def in_python(text: str, start: int = 0) -> bool:
        if len(text) - start > tokenizer_module.MAX_FAST_CHARS:
            return False
        return oracle(text[start:])

    arms = {"C": in_c, "Python": in_python}
    tok = load_shipped()
    text = Text(tok)
    print("== FastEngine.takes's run rule: cold requests, CPU ms (all threads), median (p25-p75) of", reps)
    try:
        for kind in ("completions", "chat"):
            for size in sizes:
                tokenizers = Tokenizers(default=tok)
                director, _ = make_director(tokenizers)
                samples: dict[str, list[float]] = {arm: [] for arm in arms}
                try:
                    await serving(tokenizers)
                    for r in range(reps):
                        for arm in sorted(arms, reverse=r % 2 == 1):
                            tokenizer_module.FastEngine.takes = staticmethod(arms[arm])  # type: ignore[method-assign]
                            whole = text.piece(size, f"rule-{kind}-{size}-{r}-{arm}")
                            cut = int(len(whole) * 0.9)
                            gc.collect()
                            cpu, _, _ = await one(director, kind, body_of(kind, whole[:cut], whole[cut:]))
                            await tokenizers.drain()
                            samples[arm].append(cpu * 1e3)
                finally:
                    tokenizers.close()
                cells = []
                for arm, got in samples.items():
                    q = statistics.quantiles(got, n=4)
                    cells.append(f"{arm} {statistics.median(got):6.1f} ({q[0]:.1f}-{q[2]:.1f})")
                ratio = statistics.median(samples["C"]) / statistics.median(samples["Python"])
                print(f"{kind:12} {size:>7}  " + "  ".join(cells) + f"  C/Python {ratio:.2f}")
    finally:  # as a staticmethod again: a plain function would take the engine as its text
        tokenizer_module.FastEngine.takes = staticmethod(in_c)  # type: ignore[method-assign]


def main() -> None:
    malloc.tune()  # as `epp serve` sets glibc's malloc: a large body's memory reused, not re-faulted
    parser = argparse.ArgumentParser()
    parser.add_argument("sections", nargs="*", default=["long", "breakdown"])
    parser.add_argument("--sizes", default="8000,32000,100000,200000")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--pods", default=str(PODS), help="breakdown: pod counts, comma-separated")
    args = parser.parse_args()
    runs: dict[str, Callable[[], Awaitable[None]]] = {
        "long": lambda: bench_long([int(s) for s in args.sizes.split(",")], args.reps),
        "runrule": lambda: bench_run_rule([int(s) for s in args.sizes.split(",")], args.reps),
        "steady": lambda: bench_steady([int(s) for s in args.sizes.split(",")], args.requests),
    }
    for name in args.sections:
        if name == "breakdown":
            for pods in (int(p) for p in args.pods.split(",")):
                asyncio.run(bench_breakdown(args.requests, pods))
        else:
            asyncio.run(runs[name]())


if __name__ == "__main__":
    main()
