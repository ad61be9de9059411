"""A simulated vLLM replica in real time, without HTTP: the step engine on an asyncio loop.

`epp.sim.server` serves this over vLLM's OpenAI-compatible HTTP API; this module holds the state
behind it. The engine itself is `epp.sim.core` (vLLM V1's scheduler and block pool: continuous
batching, chunked prefill, the prefix cache, preemption; docs/simulator.md); here it runs against
the wall clock:

* **One step loop per replica.** An asyncio task takes the requests that have arrived, runs
  `Engine.step(now)`, sleeps the step's duration x `time_scale`, publishes the step's KV events as
  one batch (vLLM publishes when it processes the step's output), then hands the tokens the step
  produced to the waiting HTTP handlers. So concurrent requests share steps: a cold prefill slows
  every request batched with it, and a hit's first token comes after one short step.
* **The clock.** Simulated seconds = wall seconds / `time_scale`. While busy, steps run back to
  back in simulated time; if the loop falls behind the wall clock (a slow machine, steps shorter
  than the loop's own overhead) it catches up by not sleeping, up to `_MAX_LAG` of wall time, then
  drops the debt. An idle engine starts its next step at the current time.
* **Tokens.** A prompt is rendered as epp renders it before tokenizing (`epp.api.requests`:
  completions and embeddings their first prompt, chat its messages through the chat template as
  vLLM's chat endpoint does; a completions prompt given as token ids is used as it is) and
  tokenized with BOS by the tokenizer epp ships (epp-tiny) or `SimConfig.tokenizer`. So the ids
  epp computes for routing are the ids this replica caches. Generated tokens are filler words
  (`output_tokens`); their ids are `core.default_output_token`.
* **Costs.** `SimConfig.profile` (a calibrated `epp.sim.profiles.Profile`) or, without one, the
  per-token knobs mapped onto a profile (`SimConfig.engine_profile`): every step costs at least
  `decode_per_token` (reading the weights: a lone decode step) and `prefill_cost` per token
  computed. `base_latency` is added before a request reaches the engine (API server work); it does
  not occupy the engine. `SimConfig.fixed(latency)` is a zero-cost engine behind a fixed latency.
* **Answers.** `cached_tokens` is the prefix-cache hit at the request's first admission; a prompt
  plus `max_tokens` over `max_model_len` is refused (`core.RequestRejected`, vLLM's message); a
  client that goes away aborts the request (its computed blocks stay cached).
* **Metrics.** `epp.sim.metrics_page` writes the Prometheus text a picker scrapes, with vLLM's
  names.

Absent: chat templates beyond epp's, sampling (every request generates `max_tokens` filler
tokens), real LoRA loading (an adapter is a cache key and a metric label), embeddings as a pooling
model (an embedding request is a one-token generation here), a batch of prompts (served as its
first prompt), `vllm:num_requests_waiting_by_reason`, iteration-token histograms.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from epp.api.requests import InferenceRequest, plain_prompt
from epp.sim import core
from epp.sim.blocks import BlockHasher
from epp.sim.config import SimConfig as SimConfig
from epp.sim.kvpublisher import KVEventPublisher
from epp.sim.metrics_page import (
    LATENCY_BUCKETS,
    REQUEST_TIME_BUCKETS,
    TOKEN_COUNT_BUCKETS,
    TOKEN_TIME_BUCKETS,
    Histogram,
)
from epp.tokenize import dialects
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import Tokenizer, load_shipped

log = logging.getLogger(__name__)

_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do")
# The simulator tokenizes whole prompts, as vLLM does (epp cuts long texts for routing only).
_NO_CUT = 1 << 62
# Wall seconds the step loop may fall behind before it stops catching up (see the docstring).
_MAX_LAG = 0.05


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str | None) -> Tokenizer:
    """The tokenizer at `path` (epp-tiny for None), loaded once per process: replicas share it."""
    return load_shipped() if path is None else Tokenizer.load(path)


def output_tokens(n: int) -> list[str]:
    """The text of the `n` tokens every request generates (deterministic, for tests)."""
    return [_word(i) for i in range(n)]


def _word(i: int) -> str:
    return f" {_WORDS[i % len(_WORDS)]}"


@dataclasses.dataclass(slots=True)
class SimStats:
    requests: int = 0
    inference_requests: int = 0
    render_requests: int = 0  # /render routes (no engine)
    completed: int = 0
    aborted: int = 0
    errors: int = 0
    faults: int = 0
    prompt_tokens: int = 0  # of completed requests
    cached_tokens: int = 0
    generation_tokens: int = 0
    max_running: int = 0
    max_waiting: int = 0
    # Wall seconds the step loop fell behind real time and gave up catching up on: > 0 means this
    # machine could not run the pod at its time scale (its steps then took longer than modelled).
    lag_dropped_s: float = 0.0
    by_path: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    destinations: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    models: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # as received


class SimRequest:
    """One inference request on the replica: the engine's request and what has reached the handler."""

    def __init__(
        self,
        state: SimState,
        api: str,
        body: Mapping[str, Any],
        token_ids: list[int],
        max_tokens: int,
        *,
        cache_salt: str | None = None,
        output_token_ids: list[int] | None = None,
        remote_tokens: int = 0,
    ) -> None:
        self.state = state
        self.api = api
        # P/D: the kv_transfer_params answered to a prefill asking for remote decode.
        self.kv_transfer_params: dict[str, Any] | None = None
        self.body = body
        self.token_ids = token_ids
        cfg = state.config
        self.model = body["model"] if isinstance(body.get("model"), str) else cfg.served_model
        lora = self.model if self.model in cfg.lora_adapters else None
        self.id = uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.engine_request = core.EngineRequest(
            self.id,
            token_ids,
            max_tokens,
            lora_name=lora,
            cache_salt=cache_salt,
            lora_id=cfg.lora_id(lora) if lora else None,
            output_token_ids=output_token_ids,
            remote_tokens=remote_tokens,
        )
        self.ready = 0  # tokens whose step has ended (the handler may send them)
        self.done = False
        self.error: BaseException | None = None
        self._wake = asyncio.Event()

    @property
    def prompt_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def cached_tokens(self) -> int:
        return self.engine_request.num_cached_tokens

    @property
    def generated(self) -> int:
        return self.ready

    def _deliver(self) -> None:
        """Called by the step loop once a step has ended: expose what it produced."""
        e = self.engine_request
        self.ready = e.num_output_tokens
        self.done = e.finished
        self._wake.set()

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self.done = True
        self._wake.set()

    async def decode(self) -> AsyncIterator[str]:
        """Yields each output token as the step producing it ends; the first after prefill."""
        sent = 0
        while True:
            while sent < self.ready:
                yield _word(sent)
                sent += 1
            if self.error is not None:
                raise RuntimeError("the simulated engine failed") from self.error
            if self.done:
                return
            self._wake.clear()
            await self._wake.wait()

    def output_ids(self) -> list[int]:
        """The ids of the tokens generated so far (vLLM's tokens-in API answers these)."""
        return list(self.engine_request.output_token_ids[: self.ready])

    def usage(self) -> dict[str, Any]:
        if self.api == "messages":
            # Anthropic's: input_tokens excludes what the cache served (vLLM's _build_anthropic_usage)
            return {
                "input_tokens": self.prompt_tokens - self.cached_tokens,
                "output_tokens": self.generated,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": self.cached_tokens,
            }
        if self.api == "responses":
            return {
                "input_tokens": self.prompt_tokens,
                "output_tokens": self.generated,
                "total_tokens": self.prompt_tokens + self.generated,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
            }
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.generated,
            "total_tokens": self.prompt_tokens + self.generated,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


ENGINES: dict[str, SimState] = {}
"""Live replicas of this process by engine id: where a P/D decode pulls KV from."""
MAX_KEPT = 4096


class SimState:
    """Live state of one replica; reachable from the runner with `epp.sim.server.sim_state(runner)`.

    Create it on the event loop that serves it (the step loop starts with the first request).
    `await aclose()` when done (the step loop, the tokenizer's worker thread, the KV-event
    publisher's sockets).
    """

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.name = config.name
        self.profile = config.engine_profile()
        self.engine = core.Engine(
            self.profile,
            name=config.name,
            record_events=config.kv_events is not None,
            hasher=BlockHasher(config.hash_algo, seed=config.hash_seed),
            keep_digests=not config.kv_int_hashes,
        )
        # One worker: long prompts are encoded off the loop (the encode releases the GIL), and a
        # fleet of replicas in one process should not start a pool of threads each.
        self.tokenizers = Tokenizers(default=load_tokenizer(config.tokenizer), max_chars=_NO_CUT, workers=1)
        self.publisher: KVEventPublisher | None = None
        self.kv_last_seq = -1  # sequence number of the last KV-event batch published
        self.stats = SimStats()
        self.success: collections.Counter[str] = collections.Counter()
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)
        self.queue_time = Histogram(LATENCY_BUCKETS)
        self.prefill_time = Histogram(REQUEST_TIME_BUCKETS)
        self.decode_time = Histogram(REQUEST_TIME_BUCKETS)
        self.token_time = Histogram(TOKEN_TIME_BUCKETS)
        self.prefill_computed = Histogram(TOKEN_COUNT_BUCKETS)
        self.started = time.time()
        self._active: dict[str, SimRequest] = {}  # in the engine, not yet finished or aborted
        self.in_flight = 0  # requests on the inference routes, arrival to answer (GET /load)
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0  # loop time at simulated time 0
        self._end = 0.0  # simulated time the last step ended
        # P/D: prompts this replica prefilled for a remote decode, until one pulls them (NIXL's
        # role); the pods of one process find each other here by engine id.
        self.engine_id = uuid.uuid4().hex
        self.kept: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        ENGINES[self.engine_id] = self

    # --- KV events ------------------------------------------------------------------------------

    def start_kv_events(self, address: str) -> None:
        """Open the publisher `config.kv_events` asks for; `address` ("host:port", this replica's
        HTTP address) goes into the default topic. Nothing happens without `kv_events`."""
        cfg = self.config
        if cfg.kv_events is None or self.publisher is not None:
            return
        topic = cfg.kv_topic.format(address=address, model=cfg.served_model)
        self.publisher = KVEventPublisher(
            cfg.kv_events,
            replay_endpoint=cfg.kv_replay,
            topic=topic,
            encoding=cfg.kv_encoding,
            hash_form="int" if cfg.kv_int_hashes else "bytes",
            digest_of=None if cfg.kv_int_hashes else self.engine.digest_for,
        )

    @property
    def kv_endpoint(self) -> str | None:
        """The live KV-event endpoint as bound (port 0 resolved) or connected; None without events."""
        return None if self.publisher is None else self.publisher.endpoint

    @property
    def kv_replay_endpoint(self) -> str | None:
        return None if self.publisher is None else self.publisher.replay_endpoint

    def publish_events(self) -> None:
        """Send the engine's pending events as one batch, if there are any."""
        events = self.engine.take_events()
        if events and self.publisher is not None:
            self.kv_last_seq = self.publisher.publish(events)

    def keep_for_decode(self, request_id: str, token_ids: list[int]) -> None:
        """Hold a prefilled prompt's KV for a decode pod's pull (vLLM frees it after a lease; here
        the oldest go past `MAX_KEPT`)."""
        self.kept[request_id] = token_ids
        while len(self.kept) > MAX_KEPT:
            self.kept.popitem(last=False)

    def pull(self, engine_id: str, request_id: str, token_ids: list[int]) -> float | None:
        """A decode's pull of the KV another replica kept: the simulated seconds the transfer
        takes (the blocks this replica lacks, over `kv_link_bytes_per_s`), or None when that
        replica or its kept prompt is gone (vLLM then fails the request)."""
        source = ENGINES.get(engine_id)
        kept = source.kept.pop(request_id, None) if source is not None else None
        if kept is None or kept != token_ids:
            return None
        held = self.engine.cached_prefix_blocks(token_ids) * self.profile.block_size
        moved = max(len(token_ids) - held, 0)
        return moved * self.config.kv_bytes_per_token / self.config.kv_link_bytes_per_s

    async def aclose(self) -> None:
        ENGINES.pop(self.engine_id, None)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for req in self._active.values():
            req._fail(RuntimeError("replica stopped"))
        self._active.clear()
        self.tokenizers.close()
        if self.publisher is not None:
            self.publisher.close()

    # --- requests -------------------------------------------------------------------------------

    def submit(self, req: SimRequest) -> None:
        """Queue `req` in the engine now.

        Raises:
            core.RequestRejected: what vLLM answers 400 to (e.g. longer than max_model_len).
        """
        if self._task is not None and self._task.done():
            raise RuntimeError(f"the simulated engine {self.name!r} stopped")
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._t0 = loop.time()
            self._task = loop.create_task(self._run(), name=f"sim-engine-{self.name}")
        self.engine.add_request(req.engine_request, max(self._end, self._wall_now()))
        self._active[req.id] = req
        self._work.set()

    def cancel(self, req: SimRequest) -> None:
        """The client went away: vLLM aborts the request (no-op once it finished)."""
        if self._active.pop(req.id, None) is not None:
            self.engine.abort(req.id)

    async def delay(self, seconds: float) -> None:
        """Sleep `seconds` of simulated time."""
        if seconds > 0 and self.config.time_scale > 0:
            await asyncio.sleep(seconds * self.config.time_scale)

    def _wall_now(self) -> float:
        scale = self.config.time_scale
        if scale <= 0 or self._task is None:
            return self._end
        return (asyncio.get_running_loop().time() - self._t0) / scale

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine, scale = self.engine, self.config.time_scale
        busy = False
        while True:
            if not engine.has_unfinished():
                busy = False
                self._work.clear()
                await self._work.wait()
                continue
            now = self._end if busy else max(self._end, self._wall_now())
            later = engine.later_tokens_total
            try:
                result = engine.step(now)
            except Exception as exc:  # a bug: fail the requests rather than hang them
                log.exception("simulated engine %s failed", self.name)
                for req in self._active.values():
                    req._fail(exc)
                self._active.clear()
                raise
            busy = True
            self._end = now + result.duration
            stats = self.stats
            stats.max_running = max(stats.max_running, engine.num_running)
            stats.max_waiting = max(stats.max_waiting, engine.num_waiting)
            if scale > 0:
                wait = self._t0 + self._end * scale - loop.time()
                if wait < -_MAX_LAG:  # too far behind: drop the debt
                    self._t0 -= wait
                    stats.lag_dropped_s -= wait
                    wait = 0.0
                await asyncio.sleep(max(0.0, wait))
            else:
                await asyncio.sleep(0)  # let the handlers run
            self.publish_events()
            wall = max(scale, 0.0)
            for first in result.first_tokens:
                if first.first_scheduled_time is not None:  # always, for a request with a token
                    queued = first.first_scheduled_time - first.arrival_time
                    self.queue_time.observe(max(0.0, queued) * wall)
            if engine.later_tokens_total > later:
                self.token_time.observe(result.duration * wall, engine.later_tokens_total - later)
            for done in result.finished:  # vLLM observes a request's phases when it finishes
                scheduled, first_token = done.first_scheduled_time, done.first_token_time
                if scheduled is not None and first_token is not None and done.finish_time is not None:
                    self.prefill_time.observe((first_token - scheduled) * wall)
                    self.decode_time.observe((done.finish_time - first_token) * wall)
                    held = max(done.num_cached_tokens, done.remote_tokens)
                    self.prefill_computed.observe(max(done.num_prompt_tokens - held, 0))
            # Only running or just-finished requests can have new tokens (O(running), not O(queue)).
            for e_req in (*engine.running_requests(), *result.finished):
                sim_req = self._active.get(e_req.request_id)
                if sim_req is None:  # aborted while the step ran
                    continue
                if e_req.num_output_tokens != sim_req.ready or e_req.finished:
                    sim_req._deliver()
                    if e_req.finished:
                        del self._active[e_req.request_id]

    # --- cache ----------------------------------------------------------------------------------

    def reset_prefix_cache(self, *, force: bool = False) -> bool:
        """vLLM's prefix-cache reset: refused while requests hold blocks, unless `force` (which
        preempts the running requests first). `AllBlocksCleared` goes out with the next step's
        events, as vLLM publishes it."""
        return self.engine.reset_prefix_cache(reset_running_requests=force)

    def cached_blocks(
        self, token_ids: Sequence[int], *, lora_name: str | None = None, cache_salt: str | None = None
    ) -> int:
        """How many leading full blocks of `token_ids` are cached now (nothing is touched)."""
        return self.engine.cached_prefix_blocks(token_ids, lora_name=lora_name, cache_salt=cache_salt)

    async def prompt_token_ids(
        self,
        req: InferenceRequest,
        *,
        body: Mapping[str, Any] | None = None,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """The token ids the engine runs for `req`: its given ids; for the APIs vLLM renders with
        the chat template (chat, Anthropic's Messages, Responses and their /render routes), the
        decoded `body` rendered as vLLM does (raises ChatTemplateError where vLLM answers 400);
        else its text tokenized."""
        if req.token_ids is not None:
            return req.token_ids
        dialect = dialects.for_route(req.api.value, req.render)
        if dialect is not None and body is not None:
            found = await self.tokenizers.encode_dialect(req.model, dialect, body)
            assert found is not None  # a default tokenizer serves every model
            return found[0]
        ids = await self.tokenizers.encode(
            req.model, plain_prompt(req) or "", add_special_tokens=add_special_tokens
        )
        assert ids is not None  # a default tokenizer serves every model
        return ids

    # --- stats ----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Counters and histograms back to zero, and the prefix cache cleared even under load
        (running requests are preempted); with KV events, `AllBlocksCleared` goes out at once."""
        self.reset_prefix_cache(force=True)
        self.publish_events()
        self.stats = SimStats()
        self.success.clear()
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)
        self.queue_time = Histogram(LATENCY_BUCKETS)
        self.prefill_time = Histogram(REQUEST_TIME_BUCKETS)
        self.decode_time = Histogram(REQUEST_TIME_BUCKETS)
        self.token_time = Histogram(TOKEN_TIME_BUCKETS)
        self.prefill_computed = Histogram(TOKEN_COUNT_BUCKETS)

    def lora_adapters(self) -> tuple[list[str], list[str]]:
        """The adapters of the running and of the waiting requests, sorted, each once."""
        running = {r.lora_name for r in self.engine.running_requests() if r.lora_name}
        waiting = {r.lora_name for r in self.engine.waiting_requests() if r.lora_name}
        return sorted(running), sorted(waiting)

    def snapshot(self) -> dict[str, Any]:
        s, e = self.stats, self.engine
        return {
            "name": self.name,
            "profile": self.profile.name,
            "requests": s.requests,
            "inference_requests": s.inference_requests,
            "completed": s.completed,
            "aborted": s.aborted,
            "errors": s.errors,
            "faults": s.faults,
            "running": e.num_running,
            "waiting": e.num_waiting,
            "max_running": s.max_running,
            "max_waiting": s.max_waiting,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "generation_tokens": s.generation_tokens,
            "prefix_cache_queries": e.prefix_cache_queries,
            "prefix_cache_hits": e.prefix_cache_hits,
            "cache_hit_blocks": e.prefix_cache_hits // self.profile.block_size,
            "cache_blocks": e.num_cached_blocks,
            "free_blocks": e.num_free_blocks,
            "kv_cache_usage_perc": e.kv_usage,
            "preemptions": e.num_preemptions,
            "lag_dropped_s": s.lag_dropped_s,
            "steps": e.num_steps,
            "kv_events_seq": self.kv_last_seq,
            "by_path": dict(s.by_path),
            "destinations": dict(s.destinations),
            "models": dict(s.models),
        }
