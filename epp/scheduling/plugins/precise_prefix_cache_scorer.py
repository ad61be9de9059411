"""`precise-prefix-cache-scorer`: prefer endpoints whose KV cache holds the request's leading blocks,
as the model servers themselves report it (vLLM KV-cache events -> `epp.kvcache.index.BlockIndex`).

What it does: the request's prompt token ids (`InferenceRequest.token_ids`, filled before scheduling
by the tokenizer, or given as ids) are cut into blocks at each endpoint's block size and keyed with
`epp.kvcache.keys` exactly as ingestion keys the `token_ids` of vLLM's `BlockStored` events. An
endpoint's match is the run of leading blocks it holds, and it scores

    (gpu_blocks * gpuWeight + offloaded_blocks * offloadWeight) / request blocks

where offloaded blocks are held only in a lower tier (CPU, storage: a reload is cheaper than a
prefill, dearer than a GPU hit). A request with no full block, or no token ids, scores 0 everywhere.

Keys must be computed the way the pod's events were keyed, so per endpoint:
- block size: `blockSize` when set; else the pod's events' block_size; else its scraped
  `vllm:cache_config_info`; else 16 (vLLM's default);
- seed: the model the pod's events were applied with (`BlockIndex.model_of`, from the endpoints
  file's `model:` or the events' topic), else the endpoint's configured model; the request's target
  model is a LoRA adapter when it differs from a known base model or the pod reports it as a
  running or waiting adapter (`vllm:lora_requests_info`); vLLM puts the adapter name in
  `BlockStored.lora_name`. The base model must be named as clients name it (vLLM's
  `--served-model-name`). `cache_salt` is mixed in as vLLM mixes it into block hashes.
Endpoints sharing (block size, seed) share one key list: usually the whole pool is one group.

Speculative entries: between a routing decision and the first KV event of its prefill there are
tens to hundreds of milliseconds in which a burst of requests sharing a new prefix would see no
holder and scatter. So `pre_request` records the request's keys as held by the primary endpoint
for `speculativeTTLSeconds`; a later request sees them like GPU blocks. Real events confirm them
(the index then holds the same keys) and the TTL drops the ones no event confirmed (the request
failed, or the model server evicted them). An endpoint leaving the pool drops its entries at once.

A prompt no endpoint holds any block of (new, or evicted everywhere) has a home: the endpoint
that rendezvous hashing of its first block key picks scores `homeScore`, the others 0. Without it
such prompts follow load alone and a tenant's requests scatter after each eviction; with it they
return to one endpoint unless load outweighs it, and independent epp replicas agree on that
endpoint (the hash is of epp's keys and a CRC of the endpoint name, the same in every process).
Off by default: on the demo's workload (8 tenants, 4 pods each caching 4 tenants' prompts, 16
clients, 4 seeds) the hit rate was 43.8% with `homeScore` 0.5 and 42.3% without, within the
run-to-run spread (38-51%), measured when the parameter was added (the demo's workload has
changed since: docs/bench/microbenchmarks.md#demo).

Writes to `CycleState[<plugin name>]` a `PrefixMatch` (request blocks, per-endpoint matches) which
`explain` turns into the explain API's `request_blocks`, `matched_blocks`, `tier` and `cached_tokens`.

Parameters (each checked at startup):
- `blockSize` (0): tokens per block; 0 = learn it per endpoint as above.
- `gpuWeight` (1.0), `offloadWeight` (0.8): value of a block matched on GPU / only off GPU.
- `speculativeTTLSeconds` (2.0): lifetime of a speculative entry; 0 disables them.
- `maxPrefixBlocksToMatch` (0): blocks keyed per request; 0 = the whole prompt.
- `homeScore` (0.0): the score of an unheld prompt's home endpoint; 0 disables homes.

Long prompts: keying costs ~250 ns a block, ~3 ms for a 200k-token prompt, and the loop held the
GIL for it inside the scheduling step. `prepare` (the scheduler's Preparer stage, which the
Director runs in a worker thread for long prompts) computes the keys ahead and `score` takes them;
`score` computes them itself when `prepare` did not run.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import threading
import zlib
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any, Final

import msgspec

from epp import clock
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.kvcache.index import KVIndexView, MatchResult
from epp.kvcache.keys import BlockKey, block_keys, seed_for
from epp.scheduling import framework, interfaces, prewarm, registry
from epp.scheduling.plugins import precise_llmd

DEFAULT_BLOCK_SIZE: Final = 16  # vLLM's default --block-size on GPUs
# Keys computed ahead and not (yet) taken by `score` (a stream cancelled while its keys were
# computed, a profile the request did not run), oldest dropped past either bound: ~40 B a key.
PREPARED_MAX: Final = 256
PREPARED_MAX_KEYS: Final = 1 << 20
# A routed prompt's keys are held speculatively in full up to DENSE_BLOCKS (32k tokens at 16 per
# block), one in SPARSE_STRIDE past it. A 200k-token prompt's 12.5k keys cost ~1 ms to add and
# ~0.7 ms to expire on the loop, every other request waiting (issue 19); kept sparse, ~0.2 ms. The
# run found for a prompt that long is exact to SPARSE_STRIDE blocks, under 1% of it.
DENSE_BLOCKS: Final = 2048
SPARSE_STRIDE: Final = 16

_Weight = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


@dataclasses.dataclass(slots=True)
class PrefixMatch:
    """What the scorer found for one request (explain and debug logs read it)."""

    request_tokens: int
    request_blocks: int  # of the first endpoint group (all endpoints, in a uniform pool)
    block_size: int
    matches: dict[str, MatchResult]  # endpoint name -> its run (endpoints with none left out)
    speculative: set[str]  # endpoints whose run came from speculative entries
    block_sizes: dict[str, int] = dataclasses.field(default_factory=dict)  # endpoint -> its block size
    home: str = ""  # the endpoint given `homeScore` (no endpoint held any block)


@registry.register("precise-prefix-cache-scorer")
class PrecisePrefixCacheScorer(registry.PluginBase):
    consumes_tokens: Final = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        blockSize: Annotated[int, msgspec.Meta(ge=0)] = 0
        gpuWeight: _Weight = 1.0
        offloadWeight: _Weight = 0.8
        speculativeTTLSeconds: Annotated[float, msgspec.Meta(ge=0.0, le=60.0)] = 2.0
        maxPrefixBlocksToMatch: Annotated[int, msgspec.Meta(ge=0)] = 0
        homeScore: _Weight = 0.0
        # llm-d's parameters (llm-d-kv-cache's structs), mapped in `precise_llmd.apply`.
        tokenProcessorConfig: precise_llmd.TokenProcessorConfig | None = None
        indexerConfig: precise_llmd.IndexerConfig | None = None
        kvEventsConfig: precise_llmd.KVEventsConfig | None = None
        speculativeIndexing: bool | None = None
        speculativeTTL: str | None = None

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        if handle.kv_index is None:
            raise registry.ConfigError(
                f"plugin {name!r} (type {self.type!r}) needs vLLM KV events: start epp with "
                "--kv-events connect (or bind), or use prefix-cache-scorer (approximate) instead"
            )
        self._index: KVIndexView = handle.kv_index
        # llm-d's form, mapped onto epp's parameters; what serve must apply, and notes to log.
        self.llmd: precise_llmd.Mapped = precise_llmd.apply(f"plugin {name!r} (type {self.type!r})", params)
        self._block_size = params.blockSize
        self._w_gpu = params.gpuWeight
        self._w_off = params.offloadWeight
        self._ttl = params.speculativeTTLSeconds
        self._max_blocks = params.maxPrefixBlocksToMatch
        self._home_score = params.homeScore
        self._name_ids: dict[str, int] = {}  # endpoint name -> crc32: stable across processes
        self._spec = _Speculative()
        # Keys computed ahead by `prepare` (worker threads) until `score` takes them: request id
        # -> (which token ids they were computed from, {(block size, seed): keys}). The ids are
        # named by identity and length, not held: an entry never taken kept a cancelled long
        # prompt's ids (~40 B a token) alive until 256 others had pushed it out.
        self._prepared: collections.OrderedDict[
            str, tuple[tuple[int, int], dict[tuple[int, int], list[BlockKey]]]
        ] = collections.OrderedDict()
        self._prepared_keys = 0
        self._prepared_lock = threading.Lock()
        # pre_request gets no CycleState; the Director calls it right after `schedule` with no
        # await in between, so the last request scored is the one being routed (else re-keyed).
        self._last: tuple[InferenceRequest, dict[str, list[BlockKey]], dict[str, int]] | None = None
        handle.datastore.subscribe(self._on_endpoints_changed)

    # --- decision -------------------------------------------------------------------------------

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        tokens = request.token_ids
        if not tokens:
            self._last = None
            cycle[self.name] = PrefixMatch(0, 0, 0, {}, set())
            return [0.0] * len(endpoints)
        groups = self._groups(request, endpoints, self._take_prepared(request, tokens))
        now = clock.now()
        self._spec.expire(now)
        matches: dict[str, MatchResult] = {}
        speculative: set[str] = set()
        keys_of: dict[str, list[BlockKey]] = {}
        first: tuple[int, int] | None = None
        block_sizes: dict[str, int] = {}
        for (block_size, _seed), (keys, members) in groups.items():
            if first is None:
                first = (len(keys), block_size)
            for ep in members:
                keys_of[ep.name] = keys
                block_sizes[ep.name] = block_size
            if not keys:
                continue
            names = [ep.name for ep in members]
            matches.update(self._index.match(keys, names))
            if self._spec:
                for name, run in self._spec.runs(keys, names).items():
                    have = matches.get(name)
                    if run and (have is None or run > have.blocks):
                        matches[name] = MatchResult(run, run)
                        speculative.add(name)
        self._last = (request, keys_of, block_sizes)
        n_blocks, block_size = first if first is not None else (0, 0)
        found = PrefixMatch(len(tokens), n_blocks, block_size, matches, speculative, block_sizes)
        cycle[self.name] = found
        if not matches and self._home_score:
            return self._home(endpoints, keys_of, found)
        out = []
        for ep in endpoints:
            m = matches.get(ep.name)
            keys = keys_of[ep.name]
            if m is None or not keys:
                out.append(0.0)
                continue
            gpu = m.gpu_blocks
            out.append((gpu * self._w_gpu + (m.blocks - gpu) * self._w_off) / len(keys))
        return out

    def _home(
        self, endpoints: list[Endpoint], keys_of: dict[str, list[BlockKey]], found: PrefixMatch
    ) -> list[float]:
        """No endpoint holds any block: `homeScore` for the endpoint rendezvous hashing picks from
        the prompt's first block key, 0 for the others."""
        best: int | None = None  # hash() may be negative
        home: Endpoint | None = None
        ids = self._name_ids
        for ep in endpoints:
            keys = keys_of[ep.name]
            if not keys:
                continue
            name_id = ids.get(ep.name)
            if name_id is None:
                name_id = ids[ep.name] = zlib.crc32(ep.name.encode())
            h = hash((keys[0], name_id))
            if best is None or h > best:
                best, home = h, ep
        if home is None:
            return [0.0] * len(endpoints)
        found.home = home.name
        return [self._home_score if ep is home else 0.0 for ep in endpoints]

    def prepare(self, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        """The request's keys per (block size, seed) group, computed in the caller's thread and
        kept for `score` (interfaces.Preparer)."""
        tokens = request.token_ids
        if not tokens:
            return
        keys = {group: chain for group, (chain, _) in self._groups(request, endpoints).items()}
        with self._prepared_lock:
            old = self._prepared.pop(request.request_id, None)
            if old is not None:
                self._prepared_keys -= _count(old[1])
            self._prepared[request.request_id] = ((id(tokens), len(tokens)), keys)
            self._prepared_keys += _count(keys)
            # requests that never got scored
            while len(self._prepared) > PREPARED_MAX or self._prepared_keys > PREPARED_MAX_KEYS:
                self._prepared_keys -= _count(self._prepared.popitem(last=False)[1][1])

    def _take_prepared(
        self, request: InferenceRequest, tokens: list[int]
    ) -> dict[tuple[int, int], list[BlockKey]] | None:
        if not self._prepared:
            return None
        with self._prepared_lock:
            entry = self._prepared.pop(request.request_id, None)
            if entry is not None:
                self._prepared_keys -= _count(entry[1])
        return entry[1] if entry is not None and entry[0] == (id(tokens), len(tokens)) else None

    def _groups(
        self,
        request: InferenceRequest,
        endpoints: list[Endpoint],
        ahead: Mapping[tuple[int, int], list[BlockKey]] | None = None,
    ) -> dict[tuple[int, int], tuple[list[BlockKey], list[Endpoint]]]:
        """Endpoints grouped by (block size, key seed), each group with the request's keys.

        Per endpoint this is one index lookup and one dict lookup: pools are usually one group,
        and at 64 endpoints a seed computed per endpoint cost more than a 1k-token prompt's walk.
        """
        tokens = request.token_ids or []
        target = request.target_model
        index = self._index
        fixed = self._block_size
        groups: dict[tuple[int, int], tuple[list[BlockKey], list[Endpoint]]] = {}
        by_pod_kind: dict[tuple[int, str, bool], list[Endpoint]] = {}
        for ep in endpoints:
            info = index.pod_info(ep.name)
            if info is None:
                block_size = fixed or ep.metrics.block_size or DEFAULT_BLOCK_SIZE
                model = ep.spec.model
            else:
                block_size = fixed or info[0] or ep.metrics.block_size or DEFAULT_BLOCK_SIZE
                model = info[1]
            # An adapter: named differently from a known base model, or seen running as a LoRA
            # adapter there (vllm:lora_requests_info), which also covers an unknown base model.
            m = ep.metrics
            adapter = bool(target) and (
                (bool(model) and target != model) or target in m.running_loras or target in m.waiting_loras
            )
            kind = (block_size, model, adapter)
            members = by_pod_kind.get(kind)
            if members is None:
                seed = seed_for(model, lora_name=target if adapter else None, cache_salt=request.cache_salt)
                group = groups.get((block_size, seed))
                if group is None and ahead is not None and (block_size, seed) in ahead:
                    group = groups[(block_size, seed)] = (ahead[(block_size, seed)], [])
                if group is None:
                    limit = len(tokens)
                    if self._max_blocks:
                        limit = min(limit, self._max_blocks * block_size)
                    ids = tokens if limit == len(tokens) else tokens[:limit]
                    group = groups[(block_size, seed)] = (block_keys(ids, block_size, seed=seed), [])
                members = by_pod_kind[kind] = group[1]
            members.append(ep)
        return groups

    def match_info(
        self, cycle: interfaces.CycleState, endpoints: Sequence[Endpoint]
    ) -> list[tuple[float, int, int]]:
        """After `score`: per endpoint (matched blocks, request blocks, tokens per block), the
        PrefixCacheMatchInfo llm-d's precise producer attaches: the tier-weighted run, cut to whole
        blocks as llm-d cuts it (`int(score)`), over the request's full blocks."""
        found = cycle.get(self.name)
        out: list[tuple[float, int, int]] = []
        for ep in endpoints:
            if not isinstance(found, PrefixMatch) or not found.request_tokens:
                out.append((0.0, 0, 0))
                continue
            size = found.block_sizes.get(ep.name, found.block_size) or DEFAULT_BLOCK_SIZE
            total = found.request_tokens // size
            if self._max_blocks:
                total = min(total, self._max_blocks)
            m = found.matches.get(ep.name)
            weighted = (
                0.0 if m is None else m.gpu_blocks * self._w_gpu + (m.blocks - m.gpu_blocks) * self._w_off
            )
            out.append((float(int(weighted)), total, size))
        return out

    # --- learning -------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        last = self._last
        self._last = None  # the request (its body, its ids) is not kept past its routing
        if not self._ttl or not result.targets:
            return
        if last is None or last[0] is not request:
            return  # not scored by this plugin (another profile, or no tokens)
        primary = result.targets[0]
        keys = last[1].get(primary.name)
        deadline = clock.now() + self._ttl
        if keys:
            self._spec.add(primary.name, keys, deadline)
        warmup = prewarm.planned(result)
        if warmup is not None:
            # The pre-warmed endpoint will hold the prompt's first blocks: its next requests
            # should find them there before the events say so, as a routed prompt's would.
            name = warmup.endpoint.name
            keys = last[1].get(name)
            size = last[2].get(name, 0)
            if keys and size:
                self._spec.add(name, keys[: warmup.tokens // size], deadline)

    def _on_endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        for ep in removed:
            self._spec.drop(ep.name)

    # --- explain --------------------------------------------------------------------------------

    def explain(self, cycle: interfaces.CycleState) -> Mapping[str, Any]:
        found = cycle.get(self.name)
        if not isinstance(found, PrefixMatch):
            return {}
        per_endpoint: dict[str, dict[str, Any]] = {}
        if found.home:
            per_endpoint[found.home] = {"matched_blocks": 0, "tier": "home", "cached_tokens": 0}
        for name, m in found.matches.items():
            tier = "gpu" if m.gpu_blocks == m.blocks else "offload"
            if name in found.speculative:
                tier = "speculative"
            per_endpoint[name] = {
                "matched_blocks": m.blocks,
                "tier": tier,
                "cached_tokens": cached_tokens(
                    found.request_tokens, m.blocks, found.block_sizes.get(name, found.block_size)
                ),
            }
        for ep in cycle.get(framework.CANDIDATES) or ():  # explain: every candidate, holding or not
            per_endpoint.setdefault(ep.name, {"matched_blocks": 0, "tier": "", "cached_tokens": 0})
        return {
            "request": {
                "request_blocks": found.request_blocks,
                "request_tokens": found.request_tokens,
                "block_size": found.block_size,
            },
            "endpoints": per_endpoint,
        }


def cached_tokens(prompt_tokens: int, matched_blocks: int, block_size: int) -> int:
    """The prompt tokens vLLM will report as cached for a run of `matched_blocks`: it always
    computes at least the prompt's last token, so a prompt fully cached block by block reuses one
    block less."""
    if prompt_tokens <= 0 or block_size <= 0:
        return 0
    return min(matched_blocks, (prompt_tokens - 1) // block_size) * block_size


class _Speculative:
    """Keys assumed held by endpoints until a deadline: endpoint -> {key: deadline}.

    An endpoint's speculative keys are prefix-closed: each entry is a prompt's whole chain of keys
    from the seed, a key stands for its whole prefix, and a key expires only once every entry
    holding it has. So the run of a prompt's leading keys an endpoint holds is found by binary
    search (~13 lookups for 100k tokens) instead of a walk: 64 endpoints each walking a 4k-token
    prompt cost ~0.3 ms. (A 60-bit key collision could break the closure; it would skew one hint.)

    Past DENSE_BLOCKS an entry keeps one key in SPARSE_STRIDE and its last (`_kept`): the same
    positions for every chain, so what is kept stays prefix-closed, and the search looks only
    there (`_position`).

    A key keeps the latest deadline of the entries holding it (deadlines grow with time: one TTL),
    so it is held while that deadline is ahead of the last `expire`'s time, and an expired key is
    just one not looked at again. Nothing runs on a timer, and no entry's keys are walked when it
    expires: an endpoint's keys are dropped whole once its last entry has expired, and otherwise
    compacted when they reach twice their count after the last compaction. (Deleting each
    expired entry's keys one by one cost the loop ~0.4 ms a request at 100k-token prompts, where
    most of the keys were held again by a later entry.)
    """

    __slots__ = ("_by_pod", "_now", "_queue")

    def __init__(self) -> None:
        self._by_pod: dict[str, _Held] = {}
        self._queue: collections.deque[tuple[float, _Held]] = collections.deque()
        self._now = -math.inf

    def __bool__(self) -> bool:
        return bool(self._by_pod)

    def add(self, pod: str, keys: list[BlockKey], deadline: float) -> None:
        held = self._by_pod.get(pod)
        if held is None:
            held = self._by_pod[pod] = _Held(pod)
        keys_of = held.keys
        keys_of.update(zip(_kept(keys), itertools.repeat(deadline)))  # 40% less than via dict.fromkeys
        held.entries += 1
        self._queue.append((deadline, held))
        if len(keys_of) > 2 * held.compacted + COMPACT_MIN_KEYS:
            now = self._now
            held.keys = {k: d for k, d in keys_of.items() if d > now}
            held.compacted = len(held.keys)

    def expire(self, now: float) -> None:
        self._now = now
        queue = self._queue
        while queue and queue[0][0] <= now:
            held = queue.popleft()[1]
            held.entries -= 1
            if not held.entries and self._by_pod.get(held.pod) is held:  # (not dropped since)
                del self._by_pod[held.pod]

    def runs(self, keys: list[BlockKey], pods: Collection[str]) -> dict[str, int]:
        """For each of `pods` holding the first key, the number of leading `keys` it holds (as of
        the last `expire`)."""
        out: dict[str, int] = {}
        if not keys:
            return out
        first = keys[0]
        n = len(keys)
        now = self._now
        # The positions looked at: those `_kept` keeps of any chain, and this prompt's last.
        ranks = n
        if n > DENSE_BLOCKS:
            ranks = DENSE_BLOCKS + (n - DENSE_BLOCKS + SPARSE_STRIDE - 1) // SPARSE_STRIDE
        by_pod = self._by_pod
        for pod in pods:
            entry = by_pod.get(pod)
            if entry is None:
                continue
            get = entry.keys.get
            if get(first, now) <= now:
                continue
            lo, hi = 1, ranks  # ranks [0, lo) held; [hi, ranks) not known to be
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if get(keys[_position(mid - 1, n)], now) > now:
                    lo = mid
                else:
                    hi = mid - 1
            out[pod] = _position(lo - 1, n) + 1
        return out

    def drop(self, pod: str) -> None:
        self._by_pod.pop(pod, None)


# An endpoint's speculative keys are compacted once they are twice their count after the last
# compaction, plus this (a dict comprehension over them: ~40 ns a key).
COMPACT_MIN_KEYS: Final = 4096


class _Held:
    """One endpoint's speculative keys, and its entries not yet expired."""

    __slots__ = ("compacted", "entries", "keys", "pod")

    def __init__(self, pod: str) -> None:
        self.pod = pod
        self.keys: dict[int, float] = {}
        self.entries = 0
        self.compacted = 0


def _count(keys: Mapping[tuple[int, int], list[BlockKey]]) -> int:
    return sum(len(chain) for chain in keys.values())


def _kept(keys: list[BlockKey]) -> list[BlockKey]:
    """The keys of a chain kept speculatively: the first DENSE_BLOCKS, then one in SPARSE_STRIDE,
    and the last. Every chain keeps the same positions, so the kept ones stay prefix-closed."""
    if len(keys) <= DENSE_BLOCKS:
        return keys
    kept = keys[:DENSE_BLOCKS]
    kept += keys[DENSE_BLOCKS + SPARSE_STRIDE - 1 :: SPARSE_STRIDE]
    if (len(keys) - DENSE_BLOCKS) % SPARSE_STRIDE:
        kept.append(keys[-1])
    return kept


def _position(rank: int, n: int) -> int:
    """The position in an `n`-key chain of the `rank`-th key `_kept` keeps."""
    if rank < DENSE_BLOCKS:
        return rank
    return min(DENSE_BLOCKS + (rank - DENSE_BLOCKS + 1) * SPARSE_STRIDE - 1, n - 1)
