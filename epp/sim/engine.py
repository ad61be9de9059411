"""A simulated vLLM replica's behaviour, without HTTP: what an endpoint picker can observe.

`epp.sim.server` serves this model over vLLM's OpenAI-compatible HTTP API; this module holds the
state and the timing it serves. What is modelled, and why:

* **Tokens.** A prompt is rendered as epp renders it before tokenizing (`epp.api.requests`:
  completions and embeddings their first prompt, chat and responses their texts joined by newlines;
  a completions prompt given as token ids is used as it is) and tokenized with BOS by the
  tokenizer epp ships (epp-tiny) or `SimConfig.tokenizer`. So the token ids epp computes for
  routing are the ids this server caches, which is what precise prefix routing relies on with a
  real vLLM (whose chat template epp does not apply yet). `usage.prompt_tokens` is their count.
* **Admission.** At most `max_num_seqs` requests run at once; the rest wait in FIFO order. So
  `vllm:num_requests_waiting` / `vllm:num_requests_running` move the way a load-aware scorer expects.
* **Prefix cache.** vLLM's block pool (`epp.sim.blocks`): `num_gpu_blocks` blocks of `block_size`
  tokens, chained hashes of full blocks (LoRA adapter and `cache_salt` mixed in), blocks held by
  running requests, free cached blocks evicted least recently freed first, only when a block is
  needed. A request's leading cached blocks cost no prefill time; vLLM always computes the last
  prompt token, so `usage.prompt_tokens_details.cached_tokens` is
  `min(hit blocks, (prompt_tokens - 1) // block_size) * block_size`. Blocks become cached when
  prefill starts, as vLLM caches them when it allocates them for the step computing them.
* **KV events.** With `kv_events` set, the pool's events go out on vLLM's ZMQ wire
  (`epp.sim.kvpublisher`), one batch per step that has any: the evictions a request's allocation
  causes and its `BlockStored` when it starts, further evictions as decode grows it,
  `AllBlocksCleared` on a prefix-cache reset.
* **Latency.** Time to first token = `base_latency + uncached_tokens * prefill cost per token`;
  later tokens come every `decode_per_token`. All delays are multiplied by `time_scale`, so tests
  can keep the relative numbers (a cold 4k-token prompt ~ 0.33 s at scale 1) and still run fast.
  `SimConfig.fixed(latency)` gives a constant-cost server for overhead measurements.
* **KV usage.** Pool blocks held by running requests over `num_gpu_blocks` (prompt blocks at
  prefill, one more each `block_size` generated tokens); idle cached blocks count as free, as in
  vLLM.
* **Metrics.** `render_metrics` writes the Prometheus text a picker scrapes, with vLLM's names.

Deliberately absent: chat templates, batching effects on speed, preemption, caching of blocks
filled by decode, real LoRA loading. A batch of prompts is served as its first prompt.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import math
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from epp.api.requests import Api, InferenceRequest, plain_prompt
from epp.sim.blocks import Block, BlockPool, Digest, block_digests
from epp.sim.kvpublisher import KVEventPublisher
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import Tokenizer, load_shipped

_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do")
# The simulator tokenizes whole prompts, as vLLM does (epp cuts long texts for routing only).
_NO_CUT = 1 << 62


@dataclasses.dataclass(frozen=True, slots=True)
class SimConfig:
    """Behaviour of one simulated replica. Times are seconds before `time_scale` applies."""

    name: str = ""  # value of x-sim-server; "" = "<host>:<port>"
    served_model: str = "sim-model"
    lora_adapters: tuple[str, ...] = ()
    max_loras: int = 4
    # Reject models other than served_model / lora_adapters with 404 (vLLM does); off by default
    # so tests can send any name and see it echoed (an unknown name is served as the base model).
    strict_models: bool = False
    max_num_seqs: int = 8
    block_size: int = 16  # tokens per KV block, as reported in vllm:cache_config_info
    num_gpu_blocks: int = 4096
    # tokenizer.json, or a directory holding it; None = epp-tiny, epp's default tokenizer.
    tokenizer: str | None = None
    base_latency: float = 0.01
    # Prefill seconds per uncached prompt token; None = prefill_per_char * chars_per_token (8e-5:
    # a cold 4k-token prompt takes 0.33 s with base_latency).
    prefill_per_token: float | None = None
    # The cost knob of the character model this simulator had; kept so callers that set it keep
    # their timing. chars_per_token only converts it: tokens are real now.
    prefill_per_char: float = 2.0e-5
    chars_per_token: int = 4
    decode_per_token: float = 0.02
    time_scale: float = 1.0
    default_max_tokens: int = 16
    max_output_tokens: int = 4096
    max_model_len: int = 32768
    embedding_dims: int = 16
    # Fault injection for gateway tests: answer inference requests with this status at once (0 =
    # off), or drop their connection without answering. Metrics and /health keep working.
    fault_status: int = 0
    fault_reset: bool = False
    # Added to the reported vllm:num_requests_waiting: makes this replica look busier to scorers.
    extra_waiting: int = 0
    # KV events (vLLM's --kv-events-config): the PUB endpoint, bound when it has a wildcard or port
    # 0 ("tcp://127.0.0.1:0": an ephemeral port), connected otherwise; None = no events. The
    # replay ROUTER endpoint (always bound; None = no replay). The topic; None =
    # "kv@<host>:<port>@<served_model>" with the HTTP address, llm-d's convention.
    kv_events: str | None = None
    kv_replay: str | None = None
    kv_topic: str | None = None

    @classmethod
    def fixed(cls, latency: float = 0.0, **overrides: Any) -> SimConfig:
        """Constant cost per request: `latency` before the answer, no prefill or decode time."""
        fields: dict[str, Any] = {
            "base_latency": latency,
            "prefill_per_token": 0.0,
            "prefill_per_char": 0.0,
            "decode_per_token": 0.0,
            "time_scale": 1.0,
        }
        fields.update(overrides)
        return cls(**fields)

    @property
    def prefill_cost(self) -> float:
        """Prefill seconds per uncached prompt token."""
        if self.prefill_per_token is not None:
            return self.prefill_per_token
        return self.prefill_per_char * self.chars_per_token

    def lora_id(self, model: str) -> int | None:
        """vLLM's int id of an adapter (1-based, in `lora_adapters` order); None for the base model."""
        try:
            return self.lora_adapters.index(model) + 1
        except ValueError:
            return None


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str | None) -> Tokenizer:
    """The tokenizer at `path` (epp-tiny for None), loaded once per process: replicas share it."""
    return load_shipped() if path is None else Tokenizer.load(path)


def output_tokens(n: int) -> list[str]:
    """The text of the `n` tokens every request generates (deterministic, for tests)."""
    return [f" {_WORDS[i % len(_WORDS)]}" for i in range(n)]


class Histogram:
    """Just enough of a Prometheus histogram to render realistic exposition text."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def render(self, name: str, labels: str) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        for bound, count in zip(self.buckets, self.counts, strict=True):
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(count)}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        lines.append(f"{name}_count{{{labels}}} {float(self.count)}")
        lines.append(f"{name}_sum{{{labels}}} {self.total}")
        return lines


_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)


@dataclasses.dataclass(slots=True)
class SimStats:
    requests: int = 0
    inference_requests: int = 0
    completed: int = 0
    aborted: int = 0
    errors: int = 0
    faults: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    # Per prefill, finished or not (vLLM counts a query when it schedules a request).
    cache_query_blocks: int = 0  # full prompt blocks looked up
    cache_hit_blocks: int = 0  # of those, found cached and used
    cache_query_tokens: int = 0
    cache_hit_tokens: int = 0
    max_running: int = 0
    max_waiting: int = 0
    by_path: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    destinations: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


class SimState:
    """Live state of one replica; reachable from the runner with `epp.sim.server.sim_state(runner)`.

    Call `close()` when done (the tokenizer's worker thread, the KV-event publisher's sockets).
    """

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.name = config.name
        self.sem = asyncio.Semaphore(config.max_num_seqs)
        self.running = 0
        self.waiting = 0
        self.lora_running: collections.Counter[str] = collections.Counter()
        self.lora_waiting: collections.Counter[str] = collections.Counter()
        self.pool = BlockPool(config.num_gpu_blocks, config.block_size)
        # One worker: long prompts are encoded off the loop (the encode releases the GIL), and a
        # fleet of replicas in one process should not start a pool of threads each.
        self.tokenizers = Tokenizers(default=load_tokenizer(config.tokenizer), max_chars=_NO_CUT, workers=1)
        self.publisher: KVEventPublisher | None = None
        self.kv_last_seq = -1  # sequence number of the last KV-event batch published
        self.stats = SimStats()
        self.success: collections.Counter[str] = collections.Counter()
        self.ttft = Histogram(_LATENCY_BUCKETS)
        self.e2e = Histogram(_LATENCY_BUCKETS)
        self.queue_time = Histogram(_LATENCY_BUCKETS)
        self.started = time.time()

    # --- KV events ------------------------------------------------------------------------------

    def start_kv_events(self, address: str) -> None:
        """Open the publisher `config.kv_events` asks for; `address` ("host:port", this replica's
        HTTP address) goes into the default topic. Nothing happens without `kv_events`."""
        cfg = self.config
        if cfg.kv_events is None or self.publisher is not None:
            return
        topic = cfg.kv_topic if cfg.kv_topic is not None else f"kv@{address}@{cfg.served_model}"
        self.publisher = KVEventPublisher(cfg.kv_events, replay_endpoint=cfg.kv_replay, topic=topic)
        self.pool.record_events = True

    @property
    def kv_endpoint(self) -> str | None:
        """The live KV-event endpoint as bound (port 0 resolved) or connected; None without events."""
        return None if self.publisher is None else self.publisher.endpoint

    @property
    def kv_replay_endpoint(self) -> str | None:
        return None if self.publisher is None else self.publisher.replay_endpoint

    def publish_events(self) -> None:
        """Send the pool's pending events as one batch (an engine step's worth), if there are any."""
        events = self.pool.take_events()
        if events and self.publisher is not None:
            self.kv_last_seq = self.publisher.publish(events)

    def close(self) -> None:
        self.tokenizers.close()
        if self.publisher is not None:
            self.publisher.close()

    # --- cache ----------------------------------------------------------------------------------

    def reset_prefix_cache(self, *, force: bool = False) -> bool:
        """vLLM's prefix-cache reset: refused while requests hold blocks, unless `force`."""
        done = self.pool.reset(force=force)
        self.publish_events()
        return done

    def cached_blocks(
        self, token_ids: Sequence[int], *, lora_name: str | None = None, cache_salt: str | None = None
    ) -> int:
        """How many leading full blocks of `token_ids` are cached now (nothing is touched)."""
        digests = block_digests(token_ids, self.config.block_size, lora_name=lora_name, cache_salt=cache_salt)
        return len(self.pool.lookup(digests))

    async def prompt_token_ids(
        self,
        req: InferenceRequest,
        *,
        body: Mapping[str, Any] | None = None,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """The token ids the engine runs for `req`: its given ids; for chat, the decoded `body`
        rendered with the chat template as vLLM's chat endpoint does (raises ChatTemplateError
        where vLLM answers 400); else its text tokenized."""
        if req.token_ids is not None:
            return req.token_ids
        if req.api is Api.CHAT and body is not None:
            ids = await self.tokenizers.encode_chat(req.model, body)
        else:
            ids = await self.tokenizers.encode(
                req.model, plain_prompt(req) or "", add_special_tokens=add_special_tokens
            )
        assert ids is not None  # a default tokenizer serves every model
        return ids

    # --- stats ----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Counters and histograms back to zero, and the prefix cache cleared (even under load)."""
        self.reset_prefix_cache(force=True)
        self.stats = SimStats()
        self.success.clear()
        self.ttft = Histogram(_LATENCY_BUCKETS)
        self.e2e = Histogram(_LATENCY_BUCKETS)
        self.queue_time = Histogram(_LATENCY_BUCKETS)

    def snapshot(self) -> dict[str, Any]:
        s = self.stats
        return {
            "name": self.name,
            "requests": s.requests,
            "inference_requests": s.inference_requests,
            "completed": s.completed,
            "aborted": s.aborted,
            "errors": s.errors,
            "faults": s.faults,
            "running": self.running,
            "waiting": self.waiting,
            "max_running": s.max_running,
            "max_waiting": s.max_waiting,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "generation_tokens": s.generation_tokens,
            "cache_query_blocks": s.cache_query_blocks,
            "cache_hit_blocks": s.cache_hit_blocks,
            "cache_blocks": self.pool.cached,
            "kv_blocks_held": self.pool.held + self.pool.outside,
            "kv_cache_usage_perc": self.kv_usage(),
            "kv_events_seq": self.kv_last_seq,
            "by_path": dict(s.by_path),
            "destinations": dict(s.destinations),
        }

    def kv_usage(self) -> float:
        return self.pool.usage()

    def delay(self, seconds: float) -> float:
        return max(0.0, seconds * self.config.time_scale)


class SimRequest:
    """One inference request while it is on the replica: bookkeeping for queue, blocks and events."""

    def __init__(
        self,
        state: SimState,
        api: str,
        body: Mapping[str, Any],
        token_ids: list[int],
        n_out: int,
        *,
        cache_salt: str | None = None,
    ) -> None:
        self.state = state
        self.api = api
        self.body = body
        self.token_ids = token_ids
        self.n_out = n_out
        self.cache_salt = cache_salt
        cfg = state.config
        self.model = body["model"] if isinstance(body.get("model"), str) else cfg.served_model
        self.lora = self.model if self.model in cfg.lora_adapters else ""
        self.prompt_tokens = len(token_ids)
        self.cached_tokens = 0
        self.generated = 0
        self.blocks: list[Block] = []  # block i holds tokens [i * block_size, (i + 1) * block_size)
        self._digests: list[Digest] = []
        self.id = uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _grow(self, tokens: int) -> None:
        """Hold enough blocks for the KV of `tokens` tokens (new ones may evict cached blocks)."""
        need = math.ceil(tokens / self.state.config.block_size)
        if need > len(self.blocks):
            self.blocks += self.state.pool.allocate(need - len(self.blocks))

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Wait for a running slot (FIFO), hold it for the body of the `async with`."""
        state = self.state
        state.waiting += 1
        if self.lora:
            state.lora_waiting[self.lora] += 1
        state.stats.max_waiting = max(state.stats.max_waiting, state.waiting)
        queued_at = time.monotonic()
        try:
            await state.sem.acquire()
        finally:
            state.waiting -= 1
            if self.lora:
                state.lora_waiting[self.lora] -= 1
                if not state.lora_waiting[self.lora]:
                    del state.lora_waiting[self.lora]
        state.queue_time.observe(time.monotonic() - queued_at)
        state.running += 1
        if self.lora:
            state.lora_running[self.lora] += 1
        state.stats.max_running = max(state.stats.max_running, state.running)
        try:
            yield
        finally:
            state.running -= 1
            if self.lora:
                state.lora_running[self.lora] -= 1
                if not state.lora_running[self.lora]:
                    del state.lora_running[self.lora]
            # Finished or aborted alike: blocks a cancelled prefill never computed stay uncached.
            state.pool.free(self.blocks)
            self.blocks = []
            state.sem.release()

    async def prefill(self) -> None:
        state, cfg, pool = self.state, self.state.config, self.state.pool
        n, bs = self.prompt_tokens, cfg.block_size
        lora = self.lora or None
        self._digests = block_digests(self.token_ids, bs, lora_name=lora, cache_salt=self.cache_salt)
        # vLLM computes at least the last prompt token, so a hit covers at most (n - 1) // bs blocks.
        hit = pool.lookup(self._digests)[: max(0, n - 1) // bs]
        pool.touch(hit)  # before allocating: allocation must not evict what this request uses
        self.blocks = list(hit)
        self.cached_tokens = len(hit) * bs
        self._grow(n)
        # vLLM caches a request's full blocks when it allocates them for the step that computes
        # them (KVCacheManager.allocate_slots), and publishes BlockStored with that step's events:
        # a request scheduled in a later step already hits them. There are no steps here, so the
        # blocks are cached as prefill starts (a sibling may then finish first, a small optimism).
        pool.cache(
            self.blocks,
            self._digests,
            self.token_ids,
            lora_id=cfg.lora_id(self.lora) if self.lora else None,
            lora_name=lora,
            cache_salt=self.cache_salt,
        )
        state.publish_events()
        state.stats.cache_query_blocks += len(self._digests)
        state.stats.cache_hit_blocks += len(hit)
        state.stats.cache_query_tokens += n
        state.stats.cache_hit_tokens += self.cached_tokens
        await asyncio.sleep(state.delay(cfg.base_latency + (n - self.cached_tokens) * cfg.prefill_cost))

    async def decode(self) -> AsyncIterator[str]:
        """Yields each output token; the first right after prefill, then one per decode step."""
        state = self.state
        for i, tok in enumerate(output_tokens(self.n_out)):
            if i:
                await asyncio.sleep(state.delay(state.config.decode_per_token))
                # This step computes the KV of the previous output token.
                self._grow(self.prompt_tokens + i)
                state.publish_events()
            self.generated += 1
            yield tok

    def usage(self) -> dict[str, Any]:
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


def render_metrics(state: SimState) -> str:
    """Prometheus text with vLLM's metric names for the series a picker scrapes."""
    cfg = state.config
    m = f'model_name="{cfg.served_model}"'
    s = state.stats
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{m}}} {float(state.running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{m}}} {float(state.waiting + cfg.extra_waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{m}}} {state.kv_usage()}",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{cfg.block_size}",cache_dtype="auto",enable_prefix_caching="True",'
        f'num_gpu_blocks="{cfg.num_gpu_blocks}",num_cpu_blocks="0"}} 1.0',
        "# HELP vllm:lora_requests_info Running stats on lora requests.",
        "# TYPE vllm:lora_requests_info gauge",
        f'vllm:lora_requests_info{{max_lora="{cfg.max_loras}",running_lora_adapters="{",".join(sorted(state.lora_running))}",'
        f'waiting_lora_adapters="{",".join(sorted(state.lora_waiting))}"}} {time.time()}',
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{m}}} {float(s.prompt_tokens)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{m}}} {float(s.generation_tokens)}",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{m}}} {float(s.cache_query_tokens)}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{m}}} {float(s.cache_hit_tokens)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
    ]
    for reason in ("length", "stop"):
        lines.append(
            f'vllm:request_success_total{{finished_reason="{reason}",{m}}} {float(state.success[reason])}'
        )
    lines += state.ttft.render("vllm:time_to_first_token_seconds", m)
    lines += state.e2e.render("vllm:e2e_request_latency_seconds", m)
    lines += state.queue_time.render("vllm:request_queue_time_seconds", m)
    return "\n".join(lines) + "\n"
