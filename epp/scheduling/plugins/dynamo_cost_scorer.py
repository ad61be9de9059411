"""`dynamo-cost-scorer`: NVIDIA Dynamo's KV router cost, `weight * prefill blocks + decode blocks`.

What it does (Dynamo `router-concepts.md`, peers.md section 4.1): for each endpoint

    prefill_blocks = request blocks - leading blocks of the prompt the endpoint holds on GPU
    decode_blocks  = blocks the endpoint's active requests use + the blocks this request adds
    cost           = overlapScoreWeight * prefill_blocks + decode_blocks

and the lowest cost wins (Dynamo's `router_temperature` 0: argmin). Scores must lie in [0, 1], so
costs are min-max normalised, lowest cost 1.0 and highest 0.0 (all equal: 1.0 each); with this as
the profile's only scorer, `max-score-picker` picks Dynamo's argmin (ties at random).

Overlap comes from the precise KV-event index (`Handle.kv_index`), as Dynamo's default router
reads its engines' KV events; it counts GPU blocks only (Dynamo credits device-local overlap).

Decode blocks are Dynamo's active-sequence bookkeeping, kept here from epp's own decisions: when a
request is routed (`pre_request`) its prompt's block keys become active on the primary endpoint,
and they stop being active when its response ends (`response_complete`). Blocks are counted once
per endpoint however many active requests share them (Dynamo's `--router-assume-kv-reuse`, on
by default), so ten requests on one system prompt cost its blocks once; a request adds the
blocks of its prompt that are not active there yet. Generated tokens' blocks are not counted
(Dynamo counts them only with the experimental `--router-track-output-blocks`).

Keys are computed as `precise-prefix-cache-scorer` computes them: per endpoint the block size and
model its events were stored with (else its scraped block size, else 16; its configured model),
the request's `cache_salt` mixed in. LoRA adapters are not told apart (Dynamo mixes the adapter
name into its hashes; here a LoRA request matches its base model's blocks).

Inputs consumed: `InferenceRequest.token_ids` (without them, `prompt_tokens_estimate` prices the
prefill with no overlap and nothing is booked), the KV index, `Endpoint.metrics.block_size`.

Parameters:
- `overlapScoreWeight` (1.0): weight of the prefill blocks against decode blocks; >= 0.
- `blockSize` (0): tokens per block; 0 = per endpoint, as above.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.kvcache.index import KVIndexView
from epp.kvcache.keys import BlockKey, block_keys, seed_for
from epp.scheduling import framework, interfaces, registry

DEFAULT_BLOCK_SIZE: Final = 16


@registry.register("dynamo-cost-scorer")
class DynamoCostScorer(registry.PluginBase):
    consumes_tokens: Final = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        overlapScoreWeight: Annotated[float, msgspec.Meta(ge=0.0)] = 1.0
        blockSize: Annotated[int, msgspec.Meta(ge=0)] = 0

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        if handle.kv_index is None:
            raise registry.ConfigError(
                f"plugin {name!r} (type {self.type!r}) needs vLLM KV events: start epp with "
                "--kv-events connect (or bind)"
            )
        self._index: KVIndexView = handle.kv_index
        self._weight = params.overlapScoreWeight
        self._block_size = params.blockSize
        # Active blocks per endpoint: key -> active requests using it (prefix-closed: each booking
        # is a prompt's whole chain of keys from its first block).
        self._active: dict[str, dict[BlockKey, int]] = {}
        self._booked: dict[str, tuple[str, list[BlockKey]]] = {}  # request id -> (endpoint, keys)
        # pre_request gets no CycleState; it runs right after `score` for the same request.
        self._last: tuple[InferenceRequest, dict[str, list[BlockKey]]] | None = None
        handle.datastore.subscribe(self._on_endpoints_changed)

    # --- decision -------------------------------------------------------------------------------

    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        costs = self.costs(request, endpoints)
        cycle[self.name] = costs
        return framework.lower_is_better(costs)

    def costs(self, request: InferenceRequest, endpoints: list[Endpoint]) -> list[float]:
        """Dynamo's cost of each endpoint for `request`, aligned with `endpoints` (lower is better)."""
        tokens = request.token_ids or []
        n_tokens = len(tokens) or request.prompt_tokens_estimate
        groups: dict[tuple[int, str], tuple[list[BlockKey], list[Endpoint]]] = {}
        sizes: list[int] = []
        keys_of: dict[str, list[BlockKey]] = {}
        for ep in endpoints:
            info = self._index.pod_info(ep.name)
            stored_size, model = info if info is not None else (None, ep.spec.model)
            size = self._block_size or stored_size or ep.metrics.block_size or DEFAULT_BLOCK_SIZE
            sizes.append(size)
            group = groups.get((size, model))
            if group is None:
                seed = seed_for(model, cache_salt=request.cache_salt)
                keys = block_keys(tokens, size, seed=seed) if tokens else []
                group = groups[(size, model)] = (keys, [])
            group[1].append(ep)
            keys_of[ep.name] = group[0]
        self._last = (request, keys_of)
        overlap: dict[str, int] = {}
        for keys, members in groups.values():
            if keys:
                found = self._index.match(keys, [ep.name for ep in members])
                overlap.update((name, m.gpu_blocks) for name, m in found.items())
        out = []
        for ep, size in zip(endpoints, sizes, strict=True):
            request_blocks = -(-n_tokens // size)  # ceil: a partial last block still takes a block
            prefill = request_blocks - overlap.get(ep.name, 0)
            active = self._active.get(ep.name)
            decode = request_blocks
            if active:
                decode += len(active) - _leading_run(keys_of[ep.name], active)
            out.append(self._weight * prefill + decode)
        return out

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        """Each candidate's Dynamo cost in blocks (`overlapScoreWeight` x prefill + decode)."""
        costs = cycle.get(self.name)
        endpoints = cycle.get(framework.CANDIDATES)
        if not isinstance(costs, list) or not endpoints or len(costs) != len(endpoints):
            return {}
        return {
            "request": {"overlap_score_weight": self._weight},
            "endpoints": {ep.name: {"cost_blocks": c} for ep, c in zip(endpoints, costs, strict=True)},
        }

    # --- bookkeeping of active blocks -----------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        last, self._last = self._last, None
        if last is None or last[0] is not request or not result.targets:
            return
        primary = result.targets[0].name
        keys = last[1].get(primary)
        if not keys:
            return
        active = self._active.setdefault(primary, {})
        for k in keys:
            active[k] = active.get(k, 0) + 1
        self._booked[request.request_id] = (primary, keys)

    def response_complete(self, request: InferenceRequest, outcome: interfaces.RequestOutcome) -> None:
        booked = self._booked.pop(request.request_id, None)
        if booked is None:
            return
        name, keys = booked
        active = self._active.get(name)
        if active is None:
            return
        for k in keys:
            n = active.get(k, 0) - 1
            if n > 0:
                active[k] = n
            else:
                active.pop(k, None)

    def active_blocks(self, endpoint: str) -> int:
        """Distinct blocks of the requests in flight on `endpoint` (tests, explain)."""
        return len(self._active.get(endpoint, ()))

    def _on_endpoints_changed(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        for ep in removed:
            self._active.pop(ep.name, None)


def _leading_run(keys: list[BlockKey], held: dict[BlockKey, int]) -> int:
    """How many leading `keys` are in `held`. `held` is prefix-closed (a union of whole chains
    from the first block), so binary search finds the run: ~10 lookups for a 1,000-block prompt."""
    if not keys or keys[0] not in held:
        return 0
    lo, hi = 1, len(keys)  # keys[:lo] held; keys[hi:] not known to be
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if keys[mid - 1] in held:
            lo = mid
        else:
            hi = mid - 1
    return lo
