"""Microbenchmark (a script, not a test): block keys, `BlockIndex.apply` and `match`, bytes per entry.

    .venv/bin/python tests/kvcache/bench_index.py            # everything (~20 min, mostly memory)
    .venv/bin/python tests/kvcache/bench_index.py memory     # one section: keys|apply|match|memory
    .venv/bin/python tests/kvcache/bench_index.py memory --records 20000000 --methods rss   # at 20M
    .venv/bin/python tests/kvcache/bench_index.py --baseline 3bf6331   # and the dict-based index

Events are built before timing (decoding is measured elsewhere); `gc.collect()` before each timed
loop. Synthetic engine: block size 16, random 64-bit engine hashes, chunked prefill (2,048-token
chunks, one BlockStored each), one BlockStored per decoded block, one BlockRemoved per block the
fake pod's LRU cache (20,000 blocks) drops, 16 events per batch.
- keys: `block_keys` for 1k/4k/16k/100k-token prompts.
- apply: blocks per second over such batches from 8 pods (stored, and stored + removed), index
  uncapped and capped below the pods' caches (every store evicts). Each request's prompt is
  matched first, outside the timing, as the router would.
- match: a warm index (~1M entries) over 8 and 64 pods in which every pod holds a 1,024-token
  system prompt and its own conversations; the query is one pod's stored conversation (the whole
  prompt matches, the worst case for the walk). keys + match per query, p50 and p99. Each pod
  hashes blocks as a vLLM engine does (chained, deterministic: `engine_event`), so the system
  prompt every conversation repeats is one record per pod. With fresh random hashes per
  conversation instead (before this case modelled the engine), each system-prompt key gathered
  ~2,000 records of one pod, and the C table's match, which walks a key's records, took 9-185 ms
  against the dict index's 0.03-3.8 (which kept a key's holders as pods).
- memory: bytes per record after filling 2M records (or `--records N`): tracemalloc's traced
  bytes (they leave out allocator rounding and see none of the C table's mapping, i.e. only the
  Python side), RSS growth of this process (which includes the case's own lists of live hashes),
  and the record table's own count of the slab and index pages in use; for unique blocks (one
  holder per key), for blocks shared by all 8 pods, after a 2x turnover by BlockRemoved (the
  steady state of real engines) and after a 1x turnover by the cap (evictions). Each case runs
  in a fresh process.
`--baseline REV` runs apply, match and memory with the BlockIndex (and block keys) of git revision
REV too, in the same run: 3bf6331 is the last dict-based index, in Python.

Results of the dict-based index (commit 3bf6331 and before; the C record table's:
docs/bench/fleet-cost.md#kv-index-memory) (2026-11-22, 2-vCPU VM, Python 3.11.7; runs vary by ~30% on
this VM, ranges are over runs):
- keys: 14-21 us (1k tokens), 51-79 us (4k), 0.2-0.3 ms (16k), 1.3-1.9 ms p50 / 1.7-2.1 ms p99
  (100k); 195-300 ns per block.
- apply: 0.77-1.0M blocks/s stored + removed (0.39-0.50M stored/s in the same time); evicting at
  the cap 0.33-0.41M stored/s. Prefill alone (128-block events, ad hoc): 0.69-1.0M stored/s.
- keys + match p50 / p99, 8 pods: 0.02/0.05 ms (1k), 0.10-0.16/0.20-0.29 ms (4k), 0.6-0.9/0.9-1.2
  ms (16k), 3.8-6.3/4.9-7.6 ms (100k); 64 pods: 0.04/0.08, 0.11-0.23/0.18-0.35, 0.56-0.81/0.8-1.2,
  3.4-6.0/4.7-7.8 ms (one run had a 13 ms p99 at 100k over 200 samples).
- bytes per record (tracemalloc / RSS): unique 141 / 163; shared by 8 pods 101 / 117; after 2x
  turnover by removals 215 / 301-314; after 1x turnover by the cap 226 / 263. Unique: key int 32 +
  pe int 36 (48 with allocator rounding) + two dict entries, ~36 each when freshly grown, 60-120
  once deletions and inserts churn (CPython rebuilds a dict at 3x its live size and never shrinks
  it on deletion).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import subprocess
import sys
import time
import tracemalloc
import types
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Any

from epp.kvcache.events import BlockRemoved, BlockStored, Event, EventBatch
from epp.kvcache.index import BlockIndex
from epp.kvcache.keys import KEY_MASK, block_keys, seed_for

BS = 16
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RNG = random.Random(7)


def tokens(n: int) -> list[int]:
    return [RNG.randrange(128_000) for _ in range(n)]


def fast_tokens(n: int) -> list[int]:
    """Random token ids below 65,536, ~20x faster than `tokens` (the memory cases store 40M+)."""
    return list(array("H", RNG.randbytes(2 * n)))


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def timed(fn: Callable[[], object], n: int) -> list[float]:
    gc.collect()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class FakeEngine:
    """A vLLM-like pod: prefix-cached blocks with random engine hashes and an LRU of `capacity`."""

    def __init__(self, capacity: int, system: list[int]) -> None:
        self.capacity = capacity
        # (parent engine hash, block tokens) -> engine hash, least recently used first
        self.cache: OrderedDict[tuple[int | None, tuple[int, ...]], int] = OrderedDict()
        self.system = system

    def request(self, prompt: list[int], generated: int) -> Iterator[Event]:
        """Events of prefill (2,048-token chunks, cached blocks skipped) and decode."""
        seq = prompt + tokens(generated)
        parent: int | None = None
        pending: list[tuple[int, tuple[int, ...]]] = []
        last = len(seq) // BS - 1
        for i in range(last + 1):
            blk = tuple(seq[i * BS : (i + 1) * BS])
            chain = pending[-1][0] if pending else parent
            h = self.cache.get((chain, blk))
            if h is not None:
                self.cache.move_to_end((chain, blk))
                parent = h
                continue
            h = RNG.getrandbits(64)
            self.cache[(chain, blk)] = h
            pending.append((h, blk))
            decoding = (i + 1) * BS > len(prompt)
            if decoding or len(pending) == 2048 // BS or (i + 2) * BS > len(prompt) or i == last:
                yield BlockStored(
                    block_hashes=[x for x, _ in pending],
                    parent_block_hash=parent,
                    token_ids=[t for _, b in pending for t in b],
                    block_size=BS,
                )
                parent = pending[-1][0]
                pending = []
            while len(self.cache) > self.capacity:
                _, old = self.cache.popitem(last=False)
                yield BlockRemoved(block_hashes=[old])


def event_batches(engines: list[FakeEngine], requests: int) -> list[tuple[int, list[int], EventBatch]]:
    """(engine number, the request's prompt or [] after its first batch, batch), 16 events a batch,
    for `requests` requests spread round robin (prompts: the system prompt + 1k/3k/6k tokens)."""
    out: list[tuple[int, list[int], EventBatch]] = []
    for r in range(requests):
        i = r % len(engines)
        eng = engines[i]
        prompt = eng.system + tokens(RNG.choice((1024, 3072, 6144)))
        events = list(eng.request(prompt, 256))
        for j in range(0, len(events), 16):
            out.append((i, prompt if j == 0 else [], EventBatch(ts=0.0, events=events[j : j + 16])))
    return out


def python_block_keys(token_ids: list[int], block_size: int, *, seed: int) -> list[int]:
    """The keys as epp computed them in Python before epp/kvcache/_keys.c (the baseline)."""
    h = seed
    blocks = zip(*[iter(token_ids)] * block_size, strict=False)
    return [h := hash((h, blk)) & KEY_MASK for blk in blocks]


def bench_keys() -> None:
    print("== block_keys (block size 16): C, and the Python comprehension it replaced")
    for n in (1024, 4096, 16384, 100_000):
        ids = tokens(n)
        seed = seed_for(MODEL)
        assert block_keys(ids, BS, seed=seed) == python_block_keys(ids, BS, seed=seed)
        reps = 2000 if n < 20000 else 200
        for label, fn in (("C", block_keys), ("Python", python_block_keys)):
            s = timed(lambda ids=ids, seed=seed, fn=fn: fn(ids, BS, seed=seed), reps)
            print(
                f"  {n:>7} tokens {label:>6}  p50 {pct(s, 0.5) * 1e6:8.1f} us"
                f"  p99 {pct(s, 0.99) * 1e6:8.1f} us"
                f"  ({pct(s, 0.5) * 1e9 / (n // BS):.0f} ns/block)"
            )


def bench_apply(classes: list[tuple[str, Any]]) -> None:
    print("== apply: 8 pods, chunked prefill + decode + removals from a full 20,000-block cache")
    system = tokens(1024)
    engines = [FakeEngine(20_000, system) for _ in range(8)]
    warm = event_batches(engines, 800)  # fills the fake caches: later batches carry removals
    batches = event_batches(engines, 1600)
    names = [f"10.0.0.{i}:8000" for i in range(8)]
    seed = seed_for(MODEL)
    for (label, cap), (impl, cls) in itertools.product(
        (("uncapped", 10_000_000), ("capped at 100k (evicting)", 100_000)), classes
    ):
        label = f"{impl} {label}"
        index = cls(max_entries=cap)
        # The router matches each request's prompt before the engine reports it, which keeps the
        # keys of a shared prefix recently used (else evicting them would orphan every later
        # event chained to them); done outside the timed loop.
        for i, prompt, b in warm:
            if prompt:
                index.match(block_keys(prompt, BS, seed=seed))
            index.apply(names[i], b, model=MODEL)
        touches = [block_keys(prompt, BS, seed=seed) if prompt else [] for _, prompt, _ in batches]
        gc.collect()
        stored = removed = evicted = 0
        elapsed = 0.0
        for (i, _, b), ks in zip(batches, touches, strict=True):
            if ks:
                index.match(ks)
            t0 = time.perf_counter()
            st = index.apply(names[i], b, model=MODEL)
            elapsed += time.perf_counter() - t0
            stored += st.stored
            removed += st.removed
            evicted += st.evicted
        n_events = sum(len(b.events) for _, _, b in batches)
        print(
            f"  {label:36} stored {stored / elapsed / 1e3:4.0f}k blocks/s, stored+removed"
            f" {(stored + removed) / elapsed / 1e3:4.0f}k/s  ({stored} stored, {removed} removed,"
            f" {evicted} evicted; {n_events} events in {len(batches)} batches, {elapsed:.2f} s)"
            f"\n    {index.stats()}"
        )


def fill(index: Any, pods: list[str], system: list[int], target: int) -> None:
    """Every pod stores `system`, then conversations (4k-8k tokens, after `system`) until
    `target` records. A pod hashes a block as vLLM does (`engine_event`), so the system prompt
    each conversation starts with is the same blocks again there, not new records."""
    for pod in pods:
        index.apply(pod, EventBatch(ts=0.0, events=[engine_event(pod, system)]), model=MODEL)
    i = 0
    while index.stats().entries < target:
        pod = pods[i % len(pods)]
        i += 1
        ids = tokens(RNG.choice((4096, 8192)))
        index.apply(pod, EventBatch(ts=0.0, events=[engine_event(pod, system + ids)]), model=MODEL)


def engine_event(pod: str, seq: list[int]) -> BlockStored:
    """A BlockStored of `seq` from its start, hashed as one vLLM engine hashes it: each block's
    hash chains its parent's and its tokens (seeded per pod), so a prefix stored again gets the
    same hashes, as a real engine's prefix cache does."""
    hashes: list[int] = []
    parent = hash(pod)
    for i in range(len(seq) // BS):
        parent = hash((parent, *seq[i * BS : (i + 1) * BS])) & 0xFFFFFFFFFFFFFFFF
        hashes.append(parent)
    return BlockStored(
        block_hashes=hashes, parent_block_hash=None, token_ids=seq[: len(hashes) * BS], block_size=BS
    )


def stored_event(seq: list[int]) -> BlockStored:
    """A BlockStored of `seq` from its start, with fresh engine hashes."""
    return BlockStored(
        block_hashes=[RNG.getrandbits(64) for _ in range(len(seq) // BS)],
        parent_block_hash=None,
        token_ids=seq[: len(seq) // BS * BS],
        block_size=BS,
    )


def bench_match(classes: list[tuple[str, Any]]) -> None:
    print("== keys + match, warm index (~1M records), system prompt on every pod, whole prompt matches")
    for n_pods, (impl, cls) in itertools.product((8, 64), classes):
        index = cls(max_entries=10_000_000)
        pods = [f"10.0.{i // 256}.{i % 256}:8000" for i in range(n_pods)]
        system = tokens(1024)
        fill(index, pods, system, 1_000_000)
        seed = seed_for(MODEL)
        for n in (1024, 4096, 16384, 100_000):
            queries = []
            for q in range(20):
                seq = system + tokens(n - len(system))
                pod = pods[q % n_pods]
                index.apply(pod, EventBatch(ts=0.0, events=[engine_event(pod, seq)]), model=MODEL)
                queries.append(seq)
            reps = 100 if n < 20000 else 30
            k_s: list[float] = []
            m_s: list[float] = []
            both: list[float] = []
            gc.collect()
            for _ in range(reps):
                for seq in queries:
                    t0 = time.perf_counter()
                    ks = block_keys(seq, BS, seed=seed)
                    t1 = time.perf_counter()
                    res = index.match(ks)
                    t2 = time.perf_counter()
                    k_s.append(t1 - t0)
                    m_s.append(t2 - t1)
                    both.append(t2 - t0)
            assert max(r.blocks for r in res.values()) == n // BS, res
            print(
                f"  {impl:8} {n_pods:>2} pods {n:>7} tokens: keys+match p50 {pct(both, 0.5) * 1e3:6.3f} ms"
                f" p99 {pct(both, 0.99) * 1e3:6.3f} ms  (keys p50 {pct(k_s, 0.5) * 1e3:6.3f},"
                f" match p50 {pct(m_s, 0.5) * 1e3:6.3f} p99 {pct(m_s, 0.99) * 1e3:6.3f})"
            )
        print(f"     index {index.stats()}")


MEM_PODS = [f"10.0.0.{i}:8000" for i in range(8)]


def mem_unique(index: Any, target: int) -> None:
    i = 0
    while index.stats().entries < target:
        index.apply(MEM_PODS[i % 8], EventBatch(ts=0.0, events=[mem_event(4096)]), model=MODEL)
        i += 1


def mem_shared(index: Any, target: int) -> None:
    while index.stats().entries < target:
        ids = fast_tokens(4096)
        for pod in MEM_PODS:
            index.apply(pod, EventBatch(ts=0.0, events=[stored_event(ids)]), model=MODEL)


def mem_steady(index: Any, target: int) -> None:
    """Fill, then as many records again stored while the oldest are removed (the engines' LRU)."""
    live: deque[tuple[str, list[int]]] = deque()
    i = stored_total = 0
    while stored_total < 2 * target:
        pod = MEM_PODS[i % 8]
        ev = mem_event(4096)
        index.apply(pod, EventBatch(ts=0.0, events=[ev]), model=MODEL)
        live.append((pod, ev.block_hashes))
        stored_total += len(ev.block_hashes)
        while index.stats().entries > target - 256:
            p, hs = live.popleft()
            index.apply(
                p, EventBatch(ts=0.0, events=[BlockRemoved(block_hashes=[h]) for h in hs]), model=MODEL
            )
        i += 1


def mem_evicting(index: Any, target: int) -> None:
    """Fill to the cap, then as many records again, each store evicting (no removals)."""
    i = 0
    while index.stats().evictions < target:
        index.apply(MEM_PODS[i % 8], EventBatch(ts=0.0, events=[mem_event(4096)]), model=MODEL)
        i += 1


def mem_event(n: int) -> BlockStored:
    return stored_event(fast_tokens(n))


MEM_CASES: dict[str, tuple[str, Callable[[Any, int], None]]] = {
    "unique": ("unique blocks (1 holder per key)", mem_unique),
    "shared": ("every block on all 8 pods", mem_shared),
    "steady": ("unique, after 2x turnover by removals", mem_steady),
    "evicting": ("unique, after 1x turnover by the cap", mem_evicting),
}


def index_class(rev: str | None) -> Any:
    """BlockIndex, or the one of git revision `rev` with that revision's block keys."""
    if rev is None:
        return BlockIndex
    modules = {}
    for name in ("keys", "index"):  # keys first: the old index calls the old block_keys
        source = subprocess.run(
            ["git", "show", f"{rev}:epp/kvcache/{name}.py"], capture_output=True, text=True, check=True
        ).stdout
        module = types.ModuleType(f"baseline_{name}")
        exec(compile(source, f"{rev}:epp/kvcache/{name}.py", "exec"), module.__dict__)
        modules[name] = module
    modules["index"].block_keys = modules["keys"].block_keys
    return modules["index"].BlockIndex


def measure_memory(case: str, method: str, target: int, baseline: str | None) -> None:
    """One measurement, in a fresh process (RSS never gives memory back between cases)."""
    label, build = MEM_CASES[case]
    gc.collect()
    if method == "tracemalloc":
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
    else:
        base = rss()
    index = index_class(baseline)(max_entries=target)
    build(index, target)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base if method == "tracemalloc" else rss() - base
    st = index.stats()
    table = f", table {index.nbytes() / st.entries:5.1f} B/record" if hasattr(index, "nbytes") else ""
    which = "baseline " if baseline else ""
    print(
        f"  {which}{label:34} {method:11} {used / st.entries:6.1f} B/record{table}"
        f"  ({st.entries} records, {st.keys} keys)",
        flush=True,
    )


def bench_memory(target: int, baseline: str | None, methods: list[str]) -> None:
    print(
        f"== bytes per record, {target:,} records, 8 pods (tracemalloc: traced bytes; rss: process"
        " growth; table: the record table's arrays)"
    )
    for path in (None, baseline) if baseline else (None,):
        for case in MEM_CASES:
            for method in methods:
                extra = ["--baseline", path] if path else []
                subprocess.run(
                    [sys.executable, __file__, "_memory", case, method, "--records", str(target), *extra],
                    check=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sections", nargs="*")
    parser.add_argument("--records", type=int, default=2_000_000, help="records in the memory cases")
    parser.add_argument(
        "--methods",
        default="tracemalloc,rss",
        help="memory: tracemalloc,rss (tracemalloc slows the fill ~3x)",
    )
    parser.add_argument("--baseline", help="a git revision whose BlockIndex and block keys are measured too")
    args = parser.parse_args()
    if args.sections[:1] == ["_memory"]:
        measure_memory(args.sections[1], args.sections[2], args.records, args.baseline)
        return
    classes = [("C", BlockIndex)]
    if args.baseline:
        classes.append(("baseline", index_class(args.baseline)))
    sections: dict[str, Callable[[], None]] = {
        "keys": bench_keys,
        "apply": lambda: bench_apply(classes),
        "match": lambda: bench_match(classes),
        "memory": lambda: bench_memory(args.records, args.baseline, args.methods.split(",")),
    }
    for name in args.sections or list(sections):
        sections[name]()
    print(f"Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
