"""A shared KV index: one process writes (BlockIndex(shared=True)), another reads (IndexReader)
through the memfd, while the writer churns: the reader's matches of records that stay are exact
whatever moves around them (Robin Hood shifts, index rebuilds, slab reuse)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import pytest

from epp.kvcache.events import BlockRemoved, BlockStored, EventBatch
from epp.kvcache.index import BlockIndex, IndexReader, MatchResult
from epp.kvcache.keys import block_keys, seed_for

BS = 4
MODEL = "m"

READER = """
import json, sys, time
from epp.kvcache.index import IndexReader
fd, seconds = int(sys.argv[1]), float(sys.argv[5])
pods, keys, expect = (json.loads(a) for a in sys.argv[2:5])
r = IndexReader(fd)
r.set_pods(pods)
n = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    got = {k: [v.blocks, v.gpu_blocks] for k, v in r.match(keys).items()}
    assert got == expect, (n, got)
    n += 1
print(json.dumps({"matches": n, "entries": r.stats().entries}))
"""


def stored(tokens: list[int], rng: random.Random, medium: str | None = None) -> BlockStored:
    n = len(tokens) // BS
    return BlockStored(
        block_hashes=[rng.getrandbits(64) for _ in range(n)],
        parent_block_hash=None,
        token_ids=tokens,
        block_size=BS,
        medium=medium,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd is Linux's")
def test_a_reader_sees_stable_records_exactly_while_the_writer_churns() -> None:
    rng = random.Random(5)
    writer = BlockIndex(max_entries=1_000_000, shared=True)
    assert writer.shared_fd is not None
    stable = [rng.randrange(1000) for _ in range(BS * 40)]
    writer.apply("stable", EventBatch(ts=0.0, events=[stored(stable, rng)]), model=MODEL)
    writer.apply("stable", EventBatch(ts=0.0, events=[stored(stable[: BS * 25], rng, "cpu")]), model=MODEL)
    keys = block_keys(stable, BS, seed=seed_for(MODEL))
    expect = {"stable": [40, 40]}
    assert {k: [v.blocks, v.gpu_blocks] for k, v in writer.match(keys).items()} == expect
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            READER,
            str(writer.shared_fd),
            json.dumps(writer.pods_table()),
            json.dumps(keys),
            json.dumps(expect),
            "3",
        ],
        pass_fds=(writer.shared_fd,),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        end = time.monotonic() + 3.5
        live: list[tuple[str, list[int]]] = []
        while time.monotonic() < end:  # fill (the indexes grow and are rebuilt), then empty, again
            for _ in range(300):
                pod = f"churn-{rng.randrange(20)}"
                ev = stored([rng.randrange(1000) for _ in range(BS * 64)], rng)
                writer.apply(pod, EventBatch(ts=0.0, events=[ev]), model=MODEL)
                live.append((pod, ev.block_hashes))
            rng.shuffle(live)
            while live:
                pod, hashes = live.pop()
                writer.apply(pod, EventBatch(ts=0.0, events=[BlockRemoved(block_hashes=hashes)]), model=MODEL)
        out, _ = reader.communicate(timeout=30)
    finally:
        if reader.poll() is None:
            reader.kill()
    assert reader.returncode == 0
    result = json.loads(out)
    assert result["matches"] > 100, result
    writer._table.check()
    assert writer.stats().entries == 65  # the stable pod's, on both tiers


def test_a_reader_follows_the_pod_table_and_marks_what_it_matched() -> None:
    rng = random.Random(1)
    writer = BlockIndex(max_entries=40, shared=True)
    assert writer.shared_fd is not None
    reader = IndexReader(writer.shared_fd)
    hot = [rng.randrange(1000) for _ in range(BS * 8)]
    writer.apply("a", EventBatch(ts=0.0, events=[stored(hot, rng)]), model=MODEL)
    hot_keys = block_keys(hot, BS, seed=seed_for(MODEL))
    assert reader.match(hot_keys) == {}  # no pod table yet: nobody to name
    reader.set_pods(writer.pods_table())
    assert reader.pod_info("a") == (BS, MODEL)
    for i in range(40):  # 8 blocks a store against a cap of 40: `hot` would go after 4 stores
        if i % 2 == 0:
            assert reader.match(hot_keys) == {"a": MatchResult(8, 8)}, i  # a reader's use keeps it
        writer.apply(
            "b",
            EventBatch(ts=0.0, events=[stored([rng.randrange(1000) for _ in range(BS * 8)], rng)]),
            model=MODEL,
        )
    assert writer.match(hot_keys) == {"a": MatchResult(8, 8)}
    writer._table.check()
    with pytest.raises(TypeError, match="cannot change"):
        reader._table.clear(0)
    writer.close()
