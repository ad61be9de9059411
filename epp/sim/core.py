"""The step-based simulated vLLM engine: vLLM V1's scheduler and block pool where routing sees them.

A pure, clock-free model: the caller passes the time in (`add_request(req, now)`, `step(now)`)
and runs each step for the `duration` it returns. Nothing here sleeps, reads a clock, opens a
socket or needs asyncio, so the same core serves the fast (virtual-time) benchmark and the
real-time HTTP simulator.

What each step does, as vLLM V1's `Scheduler.schedule` (`vllm/v1/core/sched/scheduler.py`):

* **Token budget.** `max_num_batched_tokens` tokens per step, shared by every scheduled request.
  Running requests come first, in admission order: a decoding request takes one token, a request
  still prefilling takes what is left of its prompt up to the remaining budget (chunked prefill:
  a long prompt spans several steps). Then waiting requests, FIFO, while the budget lasts and
  fewer than `max_num_seqs` run; the first one that does not fit stops admission (no skipping).
  A waiting request is admitted only if its whole sequence fits in the free blocks (vLLM's
  `scheduler_reserve_full_isl`, on by default), even when only a first chunk is scheduled.
* **Prefix cache at admission.** A waiting request takes the leading full blocks of its
  sequence that are cached, at most `(tokens - 1) // block_size` of them, because vLLM always
  computes the last token to get logits. `num_cached_tokens` (usage.cached_tokens) is that
  count at first admission; `prefix_cache_queries` / `prefix_cache_hits` add the request's tokens
  and its hit tokens then (requests resumed after preemption are counted apart by vLLM, so not
  here).
* **Blocks.** Allocated per step for the tokens scheduled (`epp.sim.blocks`: vLLM's null block and
  free queue, evictions announced), and committed to the cache as the step that computes them is scheduled
  (`BlockStored` carries the blocks a step completes, generated tokens included, as vLLM's
  `allocate_slots` -> `cache_blocks`). A cached hit block that sits in the free queue counts
  against the free blocks, as vLLM's `get_num_blocks_to_allocate` counts it.
* **Preemption.** When a running request needs a block and none is free, the most recently
  admitted running request is preempted (recompute mode): its blocks are freed (they stay
  cached), it goes back to the front of the waiting queue with nothing computed, and
  `num_preemptions` counts it; if the request itself is the last one, it waits. A step that
  preempted admits no waiting request. Resumed requests recompute prompt and generated tokens,
  usually hitting the blocks they just freed.
* **Outputs.** A request whose scheduled tokens catch up with its sequence samples one token at
  the end of the step (`first_token_time` for the first), and finishes on `max_tokens`; its
  blocks are freed at once (tail first, still cached). Generated token ids are
  `output_token_ids` when given (e.g. a capture's), else `default_output_token(i)`.

Step time comes from `epp.sim.profiles.Profile.step_time` (prefill tokens and their attention
pairs, decoding sequences and their context). Cost per step: O(running requests) plus O(blocks
allocated, cached or evicted); a prompt's block hashes are computed once, at `add_request`, and
a generated block's when its last token is sampled.

Absent, because routing cannot observe them or they are off by default: speculative decoding,
priority scheduling, `long_prefill_token_threshold` (0 by default), async scheduling, KV
connectors and CPU offload, LoRA slot limits (`max_loras`), structured output, pipeline
parallelism, the watermark (0 by default). docs/simulator.md has the model, calibration and
fidelity notes; tests/sim/test_conformance.py holds the engine to real vLLM 0.32 captures step by
step (scheduled tokens, preemptions, KV events).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from epp.sim import blocks, profiles
from epp.sim.request import DONE as _DONE
from epp.sim.request import NEW as _NEW
from epp.sim.request import RUNNING as _RUNNING
from epp.sim.request import WAITING as _WAITING
from epp.sim.request import EngineRequest as EngineRequest
from epp.sim.request import RequestRejected as RequestRejected
from epp.sim.request import StepResult as StepResult
from epp.sim.request import default_output_token as default_output_token

Event = blocks.Event


class Engine:
    """One simulated vLLM engine core; see the module docstring. Single-threaded."""

    def __init__(
        self,
        profile: profiles.Profile,
        *,
        name: str = "",
        record_events: bool = False,
        record_schedule: bool = False,
        hasher: blocks.BlockHasher = blocks.FAST_HASHER,
        keep_digests: bool = False,
    ) -> None:
        """`record_schedule`: keep what each step scheduled (`last_scheduled`, `last_preempted`),
        as vLLM's SchedulerOutput has it; for conformance tests against real captures. `hasher`:
        how block hashes are computed (vLLM's, for a simulator others read the events of);
        `keep_digests`: the pool keeps whole digests for events sent with them (`digest_for`)."""
        self.profile = profile
        self.name = name
        self.hasher = hasher
        # request id -> tokens the last step scheduled, in vLLM's order (running, then admitted),
        # and the ids preempted since the step before it (a forced reset's too, as vLLM's
        # preempted_req_ids); None unless record_schedule.
        self.last_scheduled: dict[str, int] | None = {} if record_schedule else None
        self.last_preempted: list[str] | None = [] if record_schedule else None
        self._preempted_log: list[str] | None = [] if record_schedule else None
        self._pool = blocks.BlockPool(
            profile.num_gpu_blocks, profile.block_size, record_events=record_events, keep_digests=keep_digests
        )
        self._waiting: collections.deque[EngineRequest] = collections.deque()
        self._running: list[EngineRequest] = []
        self._requests: dict[str, EngineRequest] = {}
        # vLLM's counters (tokens), as /metrics exposes them.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.num_steps = 0
        self.prompt_tokens_total = 0  # vllm:prompt_tokens_total: prefill tokens computed
        self.generation_tokens_total = 0
        # The sums and counts of three of vLLM's latency histograms, in simulated seconds: decode
        # (first token to finish), observed when a request finishes, as vLLM does; the time
        # between two tokens of a request, per token after its first; arrival to first token.
        self.decode_seconds_total = 0.0
        self.requests_finished = 0
        self.token_seconds_total = 0.0
        self.later_tokens_total = 0
        self.ttft_seconds_total = 0.0
        self.first_tokens_total = 0

    # --- what /metrics shows ----------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        """Blocks held by requests over all blocks (free cached blocks count as free), 0..1."""
        return self._pool.usage()

    @property
    def num_free_blocks(self) -> int:
        return self._pool.num_free

    @property
    def num_cached_blocks(self) -> int:
        """Distinct block hashes in the prefix cache."""
        return self._pool.distinct_cached

    def running_requests(self) -> tuple[EngineRequest, ...]:
        """The running requests, in admission order (a copy)."""
        return tuple(self._running)

    def waiting_requests(self) -> tuple[EngineRequest, ...]:
        """The waiting requests, in the order they will be admitted (a copy)."""
        return tuple(self._waiting)

    def cached_prefix_blocks(
        self, token_ids: Sequence[int], *, lora_name: str | None = None, cache_salt: str | None = None
    ) -> int:
        """How many leading full blocks of `token_ids` are cached now (nothing is touched)."""
        digests = self.hasher.digests(
            token_ids, self.profile.block_size, lora_name=lora_name, cache_salt=cache_salt
        )
        return len(self._pool.lookup(digests))

    def cached_digest_blocks(self, digests: Sequence[blocks.Digest]) -> int:
        """How many leading blocks of already-hashed `digests` are cached now (nothing is
        touched): a benchmark's view of which pods hold a shared prefix, without hashing again."""
        return len(self._pool.lookup(digests))

    # --- requests ---------------------------------------------------------------------------------

    def add_request(self, req: EngineRequest, now: float) -> None:
        """Queue `req` (FIFO) at `now`.

        Raises:
            RequestRejected: what vLLM answers 400 to: an empty prompt, `max_tokens` < 1, or a
                prompt plus `max_tokens` longer than `max_model_len`.
            ValueError: `req` was added before, or its id is in use.
        """
        n, prof = len(req.prompt_token_ids), self.profile
        if n == 0:
            raise RequestRejected("The decoder prompt cannot be empty")
        if req.max_tokens < 1:
            raise RequestRejected(f"max_tokens must be at least 1, got {req.max_tokens}.")
        if n + req.max_tokens > prof.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {prof.max_model_len} tokens. However, you requested "
                f"{n + req.max_tokens} tokens ({n} in the messages, {req.max_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        if req._state != _NEW or req.request_id in self._requests:
            raise ValueError(f"request {req.request_id!r} was already added")
        self.hasher.extend(
            req._digests,
            req.prompt_token_ids,
            prof.block_size,
            lora_name=req.lora_name,
            cache_salt=req.cache_salt,
        )
        req.arrival_time = now
        req._state = _WAITING
        self._requests[req.request_id] = req
        self._waiting.append(req)

    def abort(self, request_id: str) -> None:
        """Drop the request and free its blocks (computed ones stay cached); no-op if unknown or done."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        if req._state == _WAITING:
            self._waiting.remove(req)
        else:
            self._running.remove(req)
        self._release(req)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def reset_prefix_cache(self, *, reset_running_requests: bool = False) -> bool:
        """Forget every cached block (one `AllBlocksCleared`, published with the next step's events);
        refused (False) while requests hold blocks, as vLLM refuses.

        `reset_running_requests` (vLLM's `?reset_running_requests=true`): first preempt every
        running request, most recently admitted first (each counts as a preemption), so nothing
        holds a block; they recompute from scratch when admitted again.
        """
        if reset_running_requests:
            while self._running:
                self._preempt(self._running.pop())
        return self._pool.reset()

    def take_events(self) -> list[Event]:
        """KV events since the last call, in order (empty unless `record_events`)."""
        return self._pool.take_events()

    def digest_for(self, event_hash: int) -> bytes:
        """The whole digest behind a hash of the last events taken (needs `keep_digests`)."""
        return self._pool.digest_for(event_hash)

    # --- the step -----------------------------------------------------------------------------------

    def step(self, now: float) -> StepResult:
        """Schedule and run one step from `now`; its outputs take effect at `now + duration`.

        Call only when `has_unfinished()`; the next call must not come before `now + duration`.
        """
        # One pass over the scheduled requests: schedule, add up the step's cost, apply the
        # outputs. Applying a request's outputs before later requests are scheduled changes
        # nothing they see (the budget and the pool do not depend on it; finished requests free
        # their blocks only after the pass), and it saves a second loop over ~all running
        # requests every step, the simulator's hot spot.
        prof, pool = self.profile, self._pool
        bs = prof.block_size
        budget = prof.max_num_batched_tokens
        running = self._running
        first: list[EngineRequest] = []
        done: list[EngineRequest] = []
        preempted = scheduled = False
        prefill_tokens = prefill_pairs = decode_seqs = decode_context = generated = 0
        trace = self.last_scheduled
        if trace is not None:
            trace.clear()

        # Running requests first, in admission order. Most are decoding (one token, a new block
        # every `bs` tokens), so their path is inlined: this loop is the simulator's hot spot.
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            c = req._num_computed
            k = req.num_output_tokens
            total = req._num_prompt + k
            n = total - c
            if n > budget:
                n = budget
            need = (c + n + bs - 1) // bs - len(req._blocks)
            if need > 0:
                while need > pool.num_free:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        break
                if req._state != _RUNNING:  # it preempted itself: nothing later can run either
                    break
                req._blocks += pool.allocate(need)
            if (c + n) // bs > req._num_cached_blocks:
                self._cache(req, (c + n) // bs)
            scheduled = True
            budget -= n
            i += 1
            if trace is not None:
                trace[req.request_id] = n
            if n == 1 and c >= req._num_prompt:
                decode_seqs += 1
                decode_context += c + 1
            else:
                prefill_tokens += n
                prefill_pairs += n * c + n * (n + 1) // 2
            c += n
            req._num_computed = c
            if c == total:  # caught up with its sequence: it samples a token (as `_sample`)
                generated += 1
                script = req._script
                # default_output_token(k), inlined
                req.output_token_ids.append(
                    script[k] if script is not None and k < len(script) else 1 + k % 1000
                )
                k += 1
                req.num_output_tokens = k
                if req.first_token_time is None:
                    first.append(req)
                if k >= req.max_tokens:
                    done.append(req)
                elif (total + 1) % bs == 0:
                    self._hash_generated_block(req)

        # Then waiting requests, FIFO, unless this step had to preempt.
        if not preempted:
            waiting = self._waiting
            while waiting and budget > 0 and len(running) < prof.max_num_seqs:
                req = waiting[0]
                total = req._num_prompt + req.num_output_tokens
                hit = pool.lookup(req._digests, (total - 1) // bs)
                c = len(hit) * bs
                local = c
                if req.remote_tokens and req.num_preemptions == 0:  # KV received: no compute
                    c = max(c, min(req.remote_tokens, total - 1))
                n = total - c
                if n > budget:
                    n = budget
                evictable = 0
                for b in hit:
                    if b.ref == 0:
                        evictable += 1
                # The whole sequence must fit, not just this step's chunk: vLLM's default
                # scheduler_reserve_full_isl passes allocate_slots(full_sequence_must_fit=True).
                if (total + bs - 1) // bs - len(hit) + evictable > pool.num_free:
                    break  # head-of-line: vLLM does not skip to a smaller request
                need = (c + n + bs - 1) // bs - len(hit)
                waiting.popleft()
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = now
                pool.touch(hit)
                req._blocks = hit
                req._num_computed = c
                req._num_cached_blocks = len(hit)
                if req.num_preemptions == 0:
                    req.num_cached_tokens = local
                    self.prefix_cache_queries += total
                    self.prefix_cache_hits += local
                req._state = _RUNNING
                running.append(req)
                if need > 0:
                    req._blocks += pool.allocate(need)
                if (c + n) // bs > req._num_cached_blocks:
                    self._cache(req, (c + n) // bs)
                scheduled = True
                budget -= n
                if trace is not None:
                    trace[req.request_id] = n
                if n == 1 and c >= req._num_prompt:
                    decode_seqs += 1
                    decode_context += c + 1
                else:
                    prefill_tokens += n
                    prefill_pairs += n * c + n * (n + 1) // 2
                c += n
                req._num_computed = c
                if c == total:
                    generated += 1
                    self._sample(req, first, done)

        # How long the step takes; outputs count at its end.
        if scheduled or self.has_unfinished():
            duration = prof.step_time(prefill_tokens, prefill_pairs, decode_seqs, decode_context)
        else:
            duration = 0.0
        end = now + duration
        self.num_steps += 1
        self.prompt_tokens_total += prefill_tokens
        self.generation_tokens_total += generated
        # Steps run back to back while requests are running, so a token after a request's first
        # came one step after its previous one (a preempted request's gap is not counted).
        later = generated - len(first)
        self.later_tokens_total += later
        self.token_seconds_total += later * duration
        for req in first:
            req.first_token_time = end
            self.ttft_seconds_total += end - req.arrival_time
        self.first_tokens_total += len(first)
        if done:
            for req in done:
                req.finish_time = end
                if req.first_token_time is not None:
                    self.requests_finished += 1
                    self.decode_seconds_total += end - req.first_token_time
                del self._requests[req.request_id]
                self._release(req)
            self._running = [r for r in self._running if r._state == _RUNNING]
        if self._preempted_log is not None:
            self.last_preempted, self._preempted_log = self._preempted_log, []
        return StepResult(duration, first, done, prefill_tokens, decode_seqs)

    # --- internals ----------------------------------------------------------------------------------

    def _sample(self, req: EngineRequest, first: list[EngineRequest], done: list[EngineRequest]) -> None:
        """`req`'s scheduled tokens caught up with its sequence: it samples its next token."""
        k = req.num_output_tokens
        script = req._script
        req.output_token_ids.append(
            script[k] if script is not None and k < len(script) else default_output_token(k)
        )
        k += 1
        req.num_output_tokens = k
        if req.first_token_time is None:
            first.append(req)
        if k >= req.max_tokens:
            done.append(req)
        elif (req._num_prompt + k) % self.profile.block_size == 0:
            self._hash_generated_block(req)

    def _hash_generated_block(self, req: EngineRequest) -> None:
        """The token just sampled completes a block: hash it now, once; it is cached when the step
        computing that token is scheduled."""
        self.hasher.extend(
            req._digests,
            req._tokens,
            self.profile.block_size,
            lora_name=req.lora_name,
            cache_salt=req.cache_salt,
        )

    def _cache(self, req: EngineRequest, full: int) -> None:
        """Commit `req`'s blocks up to `full` (exclusive) to the prefix cache (one `BlockStored`)."""
        self._pool.cache(
            req._blocks,
            req._digests,
            req._tokens,
            lora_id=req.lora_id,
            lora_name=req.lora_name,
            cache_salt=req.cache_salt,
            start=req._num_cached_blocks,
            end=full,
        )
        req._num_cached_blocks = full

    def _preempt(self, req: EngineRequest) -> None:
        """Recompute-mode preemption: free the blocks, back to the front of the waiting queue."""
        self._pool.free(req._blocks)
        req._blocks = []
        req._num_computed = 0
        req._num_cached_blocks = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        if self._preempted_log is not None:
            self._preempted_log.append(req.request_id)
        req._state = _WAITING
        self._waiting.appendleft(req)

    def _release(self, req: EngineRequest) -> None:
        """A finished or aborted request lets go of its blocks and its per-request state."""
        self._pool.free(req._blocks)
        req._blocks = []
        req._digests = []
        req._state = _DONE
        req.finished = True

    # --- debugging ----------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The engine's state as vLLM's /metrics and scheduler logs would show it."""
        return {
            "name": self.name,
            "profile": self.profile.name,
            "running": self.num_running,
            "waiting": self.num_waiting,
            "kv_usage": self.kv_usage,
            "free_blocks": self.num_free_blocks,
            "cached_blocks": self.num_cached_blocks,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "preemptions": self.num_preemptions,
            "steps": self.num_steps,
        }

    def __repr__(self) -> str:
        s = self.snapshot()
        return (
            f"Engine({self.name or self.profile.name!r}, running={s['running']}, waiting={s['waiting']}, "
            f"kv={s['kv_usage']:.0%}, free={s['free_blocks']}, preempted={s['preemptions']})"
        )
