"""`epp bench fleet`'s simulated pods: a real vLLM page over keep-alive HTTP, and KV-event streams
epp's decoder and index take as vLLM's."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.request

import zmq

from epp.bench import fleet, fleet_pods
from epp.datastore import promtext
from epp.datastore.engines import VLLM
from epp.datastore.scraper import filtered_path
from epp.kvcache.events import BlockRemoved, BlockStored, EventBatch, decode_batch
from epp.kvcache.index import BlockIndex


def test_a_pods_cycle_leaves_its_index_empty_and_can_start_again() -> None:
    batches = fleet_pods.pod_batches(random.Random(3), blocks_per_event=4, cache_blocks=20, requests=12)
    index = BlockIndex()
    for _ in range(2):
        for events, blocks in batches:
            st = index.apply("pod", decode_batch(fleet_pods._payload(events, time.time())), model="tiny")
            assert st.orphans == st.malformed == st.missed_removals == 0
            assert st.stored == blocks
        assert index.stats().entries == 0  # every store was removed by the cycle's end
    assert any(blocks == 0 for _, blocks in batches)


def test_pods_serve_the_page_and_publish_events() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.bench.fleet_pods", "--count", "2", "--requests", "8"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ctx = zmq.Context()
    try:
        assert proc.stdout is not None and proc.stdin is not None
        pods = json.loads(proc.stdout.readline())["pods"]
        assert [p["name"] for p in pods] == ["pod-0", "pod-1"]
        with urllib.request.urlopen(f"http://{pods[1]['address']}:{pods[1]['port']}/metrics") as r:
            page = r.read()
        assert page.count(b"\n") > 600 and b"vllm:time_to_first_token_seconds_bucket" in page
        assert promtext.parse(page).block_size > 0
        path = filtered_path("/metrics", VLLM)  # what epp's scraper asks a vLLM pod for
        with urllib.request.urlopen(f"http://{pods[1]['address']}:{pods[1]['port']}{path}") as r:
            filtered = r.read()
        assert len(filtered) < len(page) // 10 and promtext.parse(filtered) == promtext.parse(page)
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pods[0]["kv_events"])
        time.sleep(0.3)  # the subscription reaches the PUB
        proc.stdin.write(json.dumps({"rate": 2000}) + "\n")
        proc.stdin.flush()
        assert sub.poll(5000), "no KV events"
        _topic, seq, payload = sub.recv_multipart()
        assert len(seq) == 8
        batch = decode_batch(payload)
        assert isinstance(batch, EventBatch) and abs(batch.ts - time.time()) < 5
        assert any(isinstance(e, BlockStored | BlockRemoved) for e in batch.events)
        proc.stdin.write(json.dumps({"stats": True}) + "\n")
        proc.stdin.flush()
        stats = json.loads(proc.stdout.readline())
        assert stats["scrapes"] == 2 and stats["batches"] > 0 and stats["blocks"] > 0
        sub.close(linger=0)
    finally:
        ctx.destroy(linger=0)  # term() would wait forever on a socket an assertion left open
        if proc.stdin is not None:
            proc.stdin.write(json.dumps({"stop": True}) + "\n")
            proc.stdin.flush()
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def test_the_table_names_each_run() -> None:
    row = {
        "epp": "base",
        "pods": 10,
        "workers": 2,
        "scrapes_per_s": 400.0,
        "idle_core": 0.05,
        "idle_core_per_pod": 0.005,
        "cpu_ms_per_request": 3.0,
        "pss_idle": 300e6,
        "kv": [{"rate": 10000, "core": 0.1, "cpu_ms_per_1k_blocks": 8.0, "catch_up_s": 0.02, "dropped": 0}],
        "bytes_per_indexed_block": 40.0,
    }
    text = fleet.table([row])
    assert "| base | 10 | 2 | 400 | 5.0 | 0.500 | 3.00 | 300 | 10k/s -> 0.10, 8.0, 20 ms | 40 |" in text
