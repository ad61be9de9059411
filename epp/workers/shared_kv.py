"""KV events once per epp pod: one ingester, one index, read by every worker.

`kv_ingester` is what feeds a `BlockIndex` from the pods' KV events, following a datastore's
membership (`feed_spec`: where each endpoint's events come from). A single `epp serve` runs it on
its own index. Under a supervisor (`--workers N`, connect mode) each worker used to run one too,
so every event was received, decoded and keyed N times, and the pod held N indexes; now:

- the supervisor runs the one ingester (`KVHub`) on a `BlockIndex(shared=True)`, over the
  endpoints its workers list to it (epp.workers.shared_metrics), and passes the index's memfd to
  every worker it starts (`EPP_WORKER_KV_INDEX_FD`);
- a worker maps it (`IndexReader`) and matches against it; what the records do not carry (each
  pod's slot, block size and model) comes over the control socket: `{"kv_pods": [[name, slot,
  block_size, model], ...]}` whenever it changes, and whole to a worker that (re)starts;
- the routing is the workers', so each tells the supervisor the prompt tokens it routed to each
  pod (`{"routed_tokens": {pod: tokens}}`, what changed, every `ROUTED_S`): with their sum the
  ingester warns of a pod sent work that publishes no KV event (epp.kvcache.silence.Silence).
The `epp_kv_events_*` series and llm-d's index admissions and removals are the supervisor's; each
worker exports the index's size as it reads it (`epp_kv_index_*`) and its own lookups.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable
from typing import Any

from epp import tasks
from epp.datastore.endpoints import Datastore, Endpoint
from epp.kvcache.index import BlockIndex, IndexReader
from epp.kvcache.ingest import FeedSpec, KVEventIngester
from epp.observability import collectors

log = logging.getLogger("epp.workers")

POLL_S = 0.05
"""How often the supervisor looks for a change in the index's pod table."""
ROUTED_S = 1.0
"""How often a worker tells the supervisor the prompt tokens it routed to each pod (the silence
check's clock, `--kv-events-silence-grace`: tens of seconds)."""

_warned_bind_ranks: list[bool] = []  # warn once per process


def feed_spec(ep: Endpoint, args: argparse.Namespace) -> FeedSpec:
    """Where `ep`'s KV events come from: its entry's kvEvents/kvReplay, else the default ports
    offset by its data-parallel rank (vLLM's DP ranks publish on base port + rank)."""
    spec = ep.spec
    if args.kv_events == "bind" and spec.rank > 0 and not _warned_bind_ranks:
        # vLLM offsets every rank's endpoint port, connect or bind: rank r dials <epp>:5557+r,
        # and epp binds one port. Until it binds one per rank, DP servers need connect mode.
        _warned_bind_ranks.append(True)
        log.warning(
            "kv events: bind mode receives only data-parallel rank 0 (rank %d of %s dials another "
            "port); use --kv-events connect for data-parallel servers",
            spec.rank,
            ep.name,
        )
    host = f"[{spec.address}]" if ":" in spec.address else spec.address
    events = None
    if args.kv_events == "connect":
        events = spec.kv_events or f"tcp://{host}:{args.kv_events_port + spec.rank}"
    replay = spec.kv_replay
    if replay is None and args.kv_replay_port is not None:
        replay = f"tcp://{host}:{args.kv_replay_port + spec.rank}"
    return FeedSpec(
        pod=ep.name, model=spec.model, events=events, replay=replay, hostport=ep.hostport, rank=spec.rank
    )


def kv_ingester(
    args: argparse.Namespace,
    index: BlockIndex,
    datastore: Datastore,
    *,
    routed_tokens: Callable[[str], int],
) -> KVEventIngester:
    """The KV-event ingestion feeding `index`, following `datastore`'s membership; `routed_tokens`
    (prompt tokens routed to a pod so far) lets it warn of a pod sent work that publishes nothing."""
    ingester = KVEventIngester(
        index,
        bind=args.kv_events_bind if args.kv_events == "bind" else None,
        default_block_size=args.kv_block_size,
        access=args.kv_events_allow,
        max_message_bytes=args.kv_events_max_message_bytes,
        routed_tokens=routed_tokens,
        silence_grace=args.kv_events_silence_grace,
    )

    def follow_membership(added: list[Endpoint], removed: list[Endpoint]) -> None:
        # Every change re-states the whole set: the ingester reconciles (new, gone, moved).
        ingester.set_feeds(feed_spec(ep, args) for ep in datastore.endpoints())

    datastore.subscribe(follow_membership)
    # The scraped datastore is in this process, single or supervisor: a readmission reaches the
    # ingester before the next request is routed.
    datastore.subscribe_readmitted(lambda ep: ingester.pod_back(ep.name))
    ingester.set_feeds(feed_spec(ep, args) for ep in datastore.endpoints())
    return ingester


class KVHub:
    """The supervisor's ingester and shared index (see the module docstring)."""

    def __init__(self, args: argparse.Namespace, datastore: Datastore) -> None:
        self.index = BlockIndex(max_entries=args.kv_index_max_entries, shared=True)
        self._routed: dict[int, dict[str, int]] = {}  # worker -> pod -> prompt tokens it routed
        self.ingester = kv_ingester(args, self.index, datastore, routed_tokens=self.routed_tokens)
        self._send: Callable[[dict[str, Any]], None] | None = None
        self._sent_version = -1
        self._task: asyncio.Task[None] | None = None

    @property
    def fd(self) -> int:
        assert self.index.shared_fd is not None
        return self.index.shared_fd

    async def start(self, send: Callable[[dict[str, Any]], None]) -> None:
        """`send` writes a message to every started worker."""
        self._send = send
        await self.ingester.start()
        self._task = tasks.create_guarded_task(self._follow_pods(), name="kv hub", logger=log)

    async def stop(self) -> None:
        if self._task is not None:
            await tasks.cancel_and_wait([self._task])
        await self.ingester.stop()
        self.index.close()

    def routed(self, worker: int, counts: Any) -> None:
        """Worker `worker`'s prompt tokens routed to each pod so far (`{"routed_tokens": ...}`)."""
        if not isinstance(counts, dict):
            return
        mine = self._routed.setdefault(worker, {})
        for pod, tokens in counts.items():
            if isinstance(tokens, int):
                mine[str(pod)] = tokens

    def routed_tokens(self, pod: str) -> int:
        """Prompt tokens the workers routed to `pod` (the KV-event silence check's clock; a
        restarted worker's count starts again at 0, which restarts the clock)."""
        return sum(counts.get(pod, 0) for counts in self._routed.values())

    def snapshot(self) -> list[dict[str, Any]]:
        """The pod table, for a worker that just started."""
        return [{"kv_pods": self.index.pods_table()}]

    async def _follow_pods(self) -> None:
        assert self._send is not None
        while True:
            await asyncio.sleep(POLL_S)
            if self.index.pods_version != self._sent_version:
                self._sent_version = self.index.pods_version
                self._send({"kv_pods": self.index.pods_table()})


class ReaderStats:
    """A worker's `epp_kv_index_*` series (the shared index's size as this worker reads it) and
    its own lookups (llm-d's `kv_cache_index_lookup_*`, summed over the workers by
    epp.workers.merge; the admissions and removals are the supervisor's)."""

    def __init__(self, reader: IndexReader) -> None:
        self._reader = reader

    def start(self) -> None:
        collectors.kv_collector.add(self._snapshot)

    def stop(self) -> None:
        collectors.kv_collector.discard(self._snapshot)

    def _snapshot(self) -> collectors.KVSnapshot:
        st = self._reader.stats()
        return collectors.KVSnapshot(
            {}, {}, st.entries, st.keys, st.evictions, index=st, lookup_seconds=self._reader.lookup_seconds
        )


class RoutedTokens:
    """A worker's side of the silence check: the prompt tokens it routed to each pod so far, sent
    to the supervisor (`KVHub.routed`) every `ROUTED_S` when they changed."""

    def __init__(self, datastore: Datastore, send: Callable[[dict[str, Any]], None]) -> None:
        self._datastore = datastore
        self._send = send
        self._sent: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = tasks.create_guarded_task(self._loop(), name="kv routed tokens", logger=log)

    async def stop(self) -> None:
        if self._task is not None:
            await tasks.cancel_and_wait([self._task])
            self._task = None

    def changes(self) -> dict[str, int]:
        """The pods whose count changed since the last call."""
        changed = {
            ep.name: ep.routed_tokens
            for ep in self._datastore.endpoints()
            if self._sent.get(ep.name) != ep.routed_tokens
        }
        self._sent.update(changed)
        return changed

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(ROUTED_S)
            changed = self.changes()
            if changed:
                self._send({"routed_tokens": changed})
