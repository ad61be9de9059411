"""epp.workers.shared_kv: the supervisor's KV hub learns from its workers the prompt tokens they
routed to each pod (the KV-event silence check's clock), and a worker's lookups are its own."""

from __future__ import annotations

import json
import sys

import pytest

from epp import cli
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.kvcache.events import BlockStored, EventBatch
from epp.kvcache.index import IndexReader
from epp.kvcache.keys import block_keys, seed_for
from epp.workers.shared_kv import KVHub, ReaderStats, RoutedTokens

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd is Linux's")


def hub(datastore: Datastore | None = None) -> KVHub:
    args = cli.build_parser().parse_args(["serve", "--endpoints=127.0.0.1:1", "--kv-events=connect"])
    return KVHub(args, datastore or Datastore())


def test_a_readmitted_pod_whose_feed_was_lost_is_purged_at_once() -> None:
    # The scraped datastore and the ingester share a process: the scraper's readmission of a pod
    # reaches the ingester directly, before the next request is routed.
    datastore = Datastore()
    specs = [EndpointSpec(name=n, address="127.0.0.1", port=p) for n, p in (("a", 1), ("b", 2))]
    datastore.sync("file", specs)
    kv = hub(datastore)
    try:
        toks = list(range(32))
        keys = block_keys(toks, 16, seed=seed_for("m"))
        for pod in ("a", "b"):
            feed = kv.ingester._feeds[pod]
            feed.live(0, EventBatch(0.0, [BlockStored([1, 2], None, toks, 16)]), "m")
            feed.disconnected()  # both lost their publishers
        a, b = datastore.get("a"), datastore.get("b")
        assert a is not None and b is not None
        assert {p: m.blocks for p, m in kv.index.match(keys, ["a", "b"]).items()} == {"a": 2, "b": 2}
        datastore.readmitted(a)
        assert {p: m.blocks for p, m in kv.index.match(keys, ["a", "b"]).items()} == {"b": 2}
    finally:
        kv.index.close()


def test_routed_tokens_are_summed_over_workers_and_bad_input_is_ignored() -> None:
    kv = hub()
    try:
        kv.routed(0, {"a": 1000, "b": 10})
        kv.routed(1, {"a": 500})
        assert (kv.routed_tokens("a"), kv.routed_tokens("b"), kv.routed_tokens("c")) == (1500, 10, 0)
        kv.routed(1, {"a": 700})  # a worker's count is its total so far: replaced, not added
        assert kv.routed_tokens("a") == 1700
        kv.routed(0, ["a", 1])  # not a mapping
        kv.routed(0, {"a": "many", "b": None})  # not counts
        assert (kv.routed_tokens("a"), kv.routed_tokens("b")) == (1700, 10)
        # The ingester's silence check reads the sum.
        assert kv.ingester._routed_tokens is not None and kv.ingester._routed_tokens("a") == 1700
    finally:
        kv.index.close()


def test_a_worker_sends_the_counts_that_changed_as_json() -> None:
    datastore = Datastore()
    specs = [EndpointSpec(name=n, address="127.0.0.1", port=p) for n, p in (("a", 1), ("b", 2))]
    datastore.sync("file", specs)
    routed = RoutedTokens(datastore, lambda message: None)
    assert routed.changes() == {"a": 0, "b": 0}  # first: everything
    assert routed.changes() == {}
    ep = datastore.get("a")
    assert ep is not None
    ep.book(300)
    changed = routed.changes()
    assert changed == {"a": 300}
    kv = hub()
    try:
        kv.routed(3, json.loads(json.dumps(changed)))
        assert kv.routed_tokens("a") == 300
    finally:
        kv.index.close()


def test_a_workers_lookups_are_exported_from_its_reader() -> None:
    kv = hub()
    try:
        reader = IndexReader(kv.fd)
        reader.set_pods(kv.index.pods_table())
        reader.match([1, 2, 3])
        reader.match([4])
        snap = ReaderStats(reader)._snapshot()
        assert snap.index is not None and snap.index.lookups == 2
        assert snap.lookup_seconds is reader.lookup_seconds
        assert snap.index.admissions == 0  # the supervisor's, not the worker's
    finally:
        kv.index.close()
