"""`burst-prefix-cache-producer` (llm-d, Alpha): co-locate bursts of prompt-sharing requests (an RL
rollout's group samples) so a shared prompt is prefilled once, not on every replica while all
caches are still cold. A `prefix-cache-scorer` reads it (`prefixMatchInfoProducerName`).

As llm-d's: every request waits up to `windowDurationMs` (100; 1-10000) for the window it opened
or joined to close; the window's requests are then assigned jointly. A request's prompt is cut
into `blockSizeTokens` (64) token blocks, chained hashes (up to `maxPrefixTokensToMatch` tokens,
else 2048 blocks); requests with the same hashes form a group. Groups of two or more are placed
first, then (with `minColocateBlocks` > 0) single requests sharing at least that many leading
blocks with another request of the window; each unit goes to the replica already holding the
longest shared prefix when it is under its fair share of the window, else to the least loaded
one (load counted in requests, or with `balanceBy: tokens` in prefix blocks a replica must still
prefill), at most `maxPerReplica` (-1: unlimited) samples of a group per replica. The assigned
replica's match is the whole prompt, the others' none; a request overlapping no other gets no
affinity (0 everywhere). At most `maxBatchSize` (1000; -1 unlimited) requests join a window; the
rest get no affinity, as llm-d's producer fails for them (its director then schedules without).

The window is waited for before scheduling, after admission (llm-d runs its producers there);
the wait is the latency this producer adds to every request. Requests without token ids (no
tokenizer for their model) are not hashed and get no affinity, as in llm-d.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, Final, Literal

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry

MAX_WINDOW_MS = 10000
DEFAULT_MAX_BLOCKS = 2048
_ASSIGNED = "burst-prefix-cache-producer/assigned"  # request attribute key's data type


@dataclasses.dataclass(slots=True, eq=False)
class _Entry:
    hashes: tuple[int, ...]
    pods: Sequence[Endpoint]
    assigned: Endpoint | None = None


class _Batch:
    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.sealed = asyncio.Event()
        self.closed = False


@registry.register("burst-prefix-cache-producer")
class BurstPrefixCacheProducer(registry.PluginBase):
    is_producer: ClassVar[bool] = True
    consumes_tokens: Final = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        windowDurationMs: int = 100
        maxPerReplica: int = -1
        blockSizeTokens: int = 64
        maxPrefixTokensToMatch: int = 0
        minColocateBlocks: int = 0
        maxBatchSize: int = 1000
        balanceBy: Literal["requests", "tokens", ""] = "requests"

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        label = f"plugin {name!r} (type {self.type!r})"

        def check(ok: bool, field: str, rule: str) -> None:
            if not ok:
                raise registry.ConfigError(f"{label}: parameter {field} {rule}, got {getattr(params, field)}")

        check(
            0 < params.windowDurationMs <= MAX_WINDOW_MS, "windowDurationMs", f"must be in 1..{MAX_WINDOW_MS}"
        )
        check(params.maxPerReplica == -1 or params.maxPerReplica >= 1, "maxPerReplica", "must be -1 or >= 1")
        check(params.blockSizeTokens > 0, "blockSizeTokens", "must be > 0")
        check(
            params.maxPrefixTokensToMatch == 0 or params.maxPrefixTokensToMatch >= params.blockSizeTokens,
            "maxPrefixTokensToMatch",
            "must be 0 or >= blockSizeTokens",
        )
        check(params.minColocateBlocks >= 0, "minColocateBlocks", "must be >= 0")
        check(params.maxBatchSize == -1 or params.maxBatchSize >= 1, "maxBatchSize", "must be -1 or >= 1")
        self.window = params.windowDurationMs / 1000.0
        self._k = params.maxPerReplica
        self.block = params.blockSizeTokens
        self._max_blocks = (
            params.maxPrefixTokensToMatch // params.blockSizeTokens
            if params.maxPrefixTokensToMatch > 0
            else DEFAULT_MAX_BLOCKS
        )
        self._min_colocate = params.minColocateBlocks
        self._max_batch = params.maxBatchSize
        self._by_tokens = params.balanceBy == "tokens"
        self._batch: _Batch | None = None

    # --- the window -------------------------------------------------------------------------------

    def hashes(self, request: InferenceRequest) -> tuple[int, ...]:
        """The request's chained block hashes (llm-d's prefixhash: a trailing partial block too)."""
        ids = request.token_ids
        if not ids:
            return ()
        h = hash((request.target_model, request.cache_salt or ""))
        out = []
        for i in range(0, min(len(ids), self.block * self._max_blocks), self.block):
            h = hash((h, tuple(ids[i : i + self.block])))
            out.append(h)
        return tuple(out)

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        """Join the open window (opening one if none is), wait for it to close, and leave the
        assigned endpoint in the request's attributes."""
        entry = _Entry(self.hashes(request), endpoints)
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch()
            asyncio.get_running_loop().call_later(self.window, self._seal, batch)
        if self._max_batch != -1 and len(batch.entries) >= self._max_batch:
            return  # llm-d's producer fails for it: no affinity
        batch.entries.append(entry)
        await batch.sealed.wait()
        request.attributes[(_ASSIGNED, self.name)] = (entry.assigned, len(entry.hashes))

    def _seal(self, batch: _Batch) -> None:
        if batch.closed:
            return
        batch.closed = True
        if self._batch is batch:
            self._batch = None
        assign(batch.entries, self._k, self._min_colocate, self._by_tokens)
        batch.sealed.set()

    # --- what the prefix-cache-scorer reads --------------------------------------------------------

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        assigned, total = request.attributes.get((_ASSIGNED, self.name), (None, 0))
        cycle[self.name] = (assigned, total)
        return [1.0 if assigned is not None and ep is assigned else 0.0 for ep in endpoints]

    def match_info(
        self, cycle: interfaces.CycleState, endpoints: Sequence[Endpoint]
    ) -> list[tuple[float, int, int]]:
        assigned, total = cycle.get(self.name, (None, 0))
        return [(float(total) if ep is assigned else 0.0, total, self.block) for ep in endpoints]

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        assigned, total = cycle.get(self.name, (None, 0))
        return {
            "request": {
                "burst_assigned": assigned.name if assigned is not None else "",
                "request_blocks": total,
            }
        }


# ---- joint assignment (llm-d's assign.go) --------------------------------------------------------


def _prefix(hashes: tuple[int, ...], n: int) -> tuple[int, ...]:
    return hashes[:n]


def assign(entries: list[_Entry], k: int, min_colocate: int, by_tokens: bool) -> None:
    """Steer each entry of a window to a replica so that prompt-sharing entries co-locate."""
    groups: dict[tuple[int, ...], list[_Entry]] = {}
    replicas: Sequence[Endpoint] = ()
    for e in entries:
        if not e.hashes:
            continue
        groups.setdefault(e.hashes, []).append(e)
        if not replicas:
            replicas = e.pods
    if not replicas:
        return
    shared: set[tuple[int, ...]] = set()
    if min_colocate > 0:
        count: dict[tuple[int, ...], int] = {}
        sig: dict[tuple[int, ...], tuple[int, ...]] = {}
        for key, members in groups.items():
            if len(key) >= min_colocate:
                sig[key] = _prefix(key, min_colocate)
                count[sig[key]] = count.get(sig[key], 0) + len(members)
        shared = {key for key, s in sig.items() if count[s] >= 2}
    group_units = [key for key, m in groups.items() if len(m) >= 2]
    single_units = [key for key, m in groups.items() if len(m) == 1 and key in shared]
    if not group_units and not single_units:
        return
    group_units.sort(key=len, reverse=True)  # stable: longest prefix first
    single_units.sort(key=len, reverse=True)
    units = [*group_units, *single_units]
    total = sum(len(key) if by_tokens else len(groups[key]) for key in units)
    max_share = -(-total // len(replicas))
    held: dict[int, set[str]] = {}  # block hash -> replicas holding it (within this window)
    load: dict[str, int] = {}
    for key in units:
        _place(groups[key], replicas, k, min_colocate, max_share, len(key), held, load, by_tokens)


def _place(
    members: list[_Entry],
    replicas: Sequence[Endpoint],
    k: int,
    min_colocate: int,
    max_share: int,
    cost: int,
    held: dict[int, set[str]],
    load: dict[str, int],
    by_tokens: bool,
) -> None:
    hashes = members[0].hashes
    prefer = min_colocate > 0
    matches: dict[str, int] = {}
    if prefer or by_tokens:
        for h in hashes:
            holders = held.get(h)
            if not holders:
                break
            for name in holders:
                matches[name] = matches.get(name, 0) + 1
    per_replica: dict[str, int] = {}
    i = 0
    while i < len(members):
        target = _pick(replicas, per_replica, k, load, matches, min_colocate, max_share, prefer)
        name = target.name
        run = len(members) - i
        if k != -1:
            run = min(run, max(1, k - per_replica.get(name, 0)))
        for j in range(run):
            members[i + j].assigned = target
        first = per_replica.get(name, 0) == 0
        per_replica[name] = per_replica.get(name, 0) + run
        if not by_tokens:
            load[name] = load.get(name, 0) + run
        elif first:
            load[name] = load.get(name, 0) + max(0, cost - matches.get(name, 0))
        i += run
        prefer = False  # only the primary replica gets the prefix preference
    for m in members:
        if m.assigned is not None:
            for h in hashes:
                held.setdefault(h, set()).add(m.assigned.name)


def _pick(
    replicas: Sequence[Endpoint],
    per_replica: dict[str, int],
    k: int,
    load: dict[str, int],
    matches: dict[str, int],
    min_colocate: int,
    max_share: int,
    prefer: bool,
) -> Endpoint:
    def key(ep: Endpoint) -> tuple[int, int, str]:  # llm-d's `less`: load, running, name
        return (load.get(ep.name, 0), ep.metrics.running, ep.name)

    if prefer:
        fits = [
            ep
            for ep in replicas
            if (k == -1 or per_replica.get(ep.name, 0) < k)
            and load.get(ep.name, 0) < max_share
            and matches.get(ep.name, 0) >= min_colocate
        ]
        if fits:
            return min(fits, key=lambda ep: (-matches.get(ep.name, 0), *key(ep)))
    free = [ep for ep in replicas if k == -1 or per_replica.get(ep.name, 0) < k]
    return min(free or replicas, key=key)
