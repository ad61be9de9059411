"""A simulated vLLM replica's behaviour, without HTTP: what an endpoint picker can observe.

`epp.sim.server` serves this model over vLLM's OpenAI-compatible HTTP API; this module holds the
state and the timing it serves. What is modelled, and why:

* **Admission.** At most `max_num_seqs` requests run at once; the rest wait in FIFO order. So
  `vllm:num_requests_waiting` / `vllm:num_requests_running` move the way a load-aware scorer expects.
* **Prefix cache.** The prompt text (completions prompt, chat message contents, responses input,
  embeddings input) is cut into blocks of `block_size * chars_per_token` characters; each full
  block gets a hash chained on the previous one (seeded by the model name), kept in an LRU of
  `num_gpu_blocks` entries. Leading blocks already in the LRU are "cached": they cost no prefill
  time and are reported in `usage.prompt_tokens_details.cached_tokens`. Blocks enter the LRU when
  prefill ends, so two identical requests that overlap both miss, as on a real server.
* **Latency.** Time to first token = `base_latency + uncached_chars * prefill_per_char`; later
  tokens come every `decode_per_token`. All delays are multiplied by `time_scale`, so tests can
  keep the relative numbers (a cold 4k-token prompt ~ 0.3 s at scale 1) and still run fast.
  `SimConfig.fixed(latency)` gives a constant-cost server for overhead measurements.
* **KV usage.** Blocks held by running requests (prompt + generated tokens) over
  `num_gpu_blocks`; idle cached blocks count as free, as in vLLM.
* **Metrics.** `render_metrics` writes the Prometheus text a picker scrapes, with vLLM's names.

Deliberately absent: tokenization (4 characters = 1 token), batching effects on speed, preemption,
real LoRA loading. A later simulator can grow those behind the same HTTP surface.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import math
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do")


@dataclasses.dataclass(frozen=True, slots=True)
class SimConfig:
    """Behaviour of one simulated replica. Times are seconds before `time_scale` applies."""

    name: str = ""  # value of x-sim-server; "" = "<host>:<port>"
    served_model: str = "sim-model"
    lora_adapters: tuple[str, ...] = ()
    max_loras: int = 4
    # Reject models other than served_model / lora_adapters with 404 (vLLM does); off by default
    # so tests can send any name and see it echoed.
    strict_models: bool = False
    max_num_seqs: int = 8
    block_size: int = 16  # tokens per KV block, as reported in vllm:cache_config_info
    num_gpu_blocks: int = 4096
    chars_per_token: int = 4
    base_latency: float = 0.01
    prefill_per_char: float = 2.0e-5  # 4k tokens = 16k chars cold -> 0.32 s
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

    @classmethod
    def fixed(cls, latency: float = 0.0, **overrides: Any) -> SimConfig:
        """Constant cost per request: `latency` before the answer, no prefill or decode time."""
        fields: dict[str, Any] = {
            "base_latency": latency,
            "prefill_per_char": 0.0,
            "decode_per_token": 0.0,
            "time_scale": 1.0,
        }
        fields.update(overrides)
        return cls(**fields)

    @property
    def block_chars(self) -> int:
        return self.block_size * self.chars_per_token


def output_tokens(n: int) -> list[str]:
    """The text of the `n` tokens every request generates (deterministic, for tests)."""
    return [f" {_WORDS[i % len(_WORDS)]}" for i in range(n)]


class PrefixCache:
    """LRU of chained block hashes; only full blocks are cached, as in vLLM."""

    def __init__(self, capacity_blocks: int, block_chars: int) -> None:
        self.capacity = capacity_blocks
        self.block_chars = block_chars
        self._lru: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def block_hashes(self, text: str, seed: str) -> list[bytes]:
        data = text.encode("utf-8", "surrogatepass")
        prev = hashlib.blake2b(seed.encode(), digest_size=16).digest()
        out: list[bytes] = []
        # Blocks are cut on characters (the picker's estimate is per character, too), hashed as bytes.
        n_full = len(text) // self.block_chars
        if len(data) == len(text):  # ASCII fast path: byte offsets equal character offsets
            chunks: Iterable[bytes] = (
                data[i * self.block_chars : (i + 1) * self.block_chars] for i in range(n_full)
            )
        else:
            chunks = (
                text[i * self.block_chars : (i + 1) * self.block_chars].encode("utf-8", "surrogatepass")
                for i in range(n_full)
            )
        for chunk in chunks:
            prev = hashlib.blake2b(prev + chunk, digest_size=16).digest()
            out.append(prev)
        return out

    def match(self, hashes: Sequence[bytes]) -> int:
        """Number of leading blocks cached; those blocks become most recently used."""
        hit = 0
        for h in hashes:
            if h not in self._lru:
                break
            self._lru.move_to_end(h)
            hit += 1
        return hit

    def insert(self, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            self._lru[h] = None
            self._lru.move_to_end(h)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    def clear(self) -> None:
        self._lru.clear()


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
    cache_query_blocks: int = 0
    cache_hit_blocks: int = 0
    max_running: int = 0
    max_waiting: int = 0
    by_path: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    destinations: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


class SimState:
    """Live state of one replica; reachable from the runner with `epp.sim.server.sim_state(runner)`."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.name = config.name
        self.sem = asyncio.Semaphore(config.max_num_seqs)
        self.running = 0
        self.waiting = 0
        self.kv_blocks = 0
        self.lora_running: collections.Counter[str] = collections.Counter()
        self.lora_waiting: collections.Counter[str] = collections.Counter()
        self.cache = PrefixCache(config.num_gpu_blocks, config.block_chars)
        self.stats = SimStats()
        self.success: collections.Counter[str] = collections.Counter()
        self.ttft = Histogram(_LATENCY_BUCKETS)
        self.e2e = Histogram(_LATENCY_BUCKETS)
        self.queue_time = Histogram(_LATENCY_BUCKETS)
        self.started = time.time()

    def reset(self) -> None:
        self.cache.clear()
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
            "cache_blocks": len(self.cache),
            "kv_cache_usage_perc": self.kv_usage(),
            "by_path": dict(s.by_path),
            "destinations": dict(s.destinations),
        }

    def kv_usage(self) -> float:
        return min(1.0, self.kv_blocks / self.config.num_gpu_blocks) if self.config.num_gpu_blocks else 0.0

    def delay(self, seconds: float) -> float:
        return max(0.0, seconds * self.config.time_scale)


class SimRequest:
    """One inference request while it is on the replica: bookkeeping for queue, cache and KV."""

    def __init__(self, state: SimState, api: str, body: Mapping[str, Any], text: str, n_out: int) -> None:
        self.state = state
        self.api = api
        self.body = body
        self.text = text
        self.n_out = n_out
        cfg = state.config
        self.model = body["model"] if isinstance(body.get("model"), str) else cfg.served_model
        self.lora = self.model if self.model in cfg.lora_adapters else ""
        self.prompt_tokens = max(1, math.ceil(len(text) / cfg.chars_per_token)) if text else 0
        self.cached_tokens = 0
        self.generated = 0
        self._blocks = 0
        self.id = uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _set_blocks(self) -> None:
        bs = self.state.config.block_size
        blocks = math.ceil((self.prompt_tokens + self.generated) / bs)
        self.state.kv_blocks += blocks - self._blocks
        self._blocks = blocks

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
            state.kv_blocks -= self._blocks
            self._blocks = 0
            state.sem.release()

    async def prefill(self) -> None:
        state, cfg = self.state, self.state.config
        hashes = state.cache.block_hashes(self.text, self.model)
        hit = state.cache.match(hashes)
        cached_chars = hit * cfg.block_chars
        self.cached_tokens = min(self.prompt_tokens, hit * cfg.block_size)
        state.stats.cache_query_blocks += len(hashes)
        state.stats.cache_hit_blocks += hit
        self._set_blocks()
        await asyncio.sleep(
            state.delay(cfg.base_latency + (len(self.text) - cached_chars) * cfg.prefill_per_char)
        )
        state.cache.insert(hashes)

    async def decode(self) -> AsyncIterator[str]:
        """Yields each output token; the first right after prefill, then one per decode step."""
        state = self.state
        for i, tok in enumerate(output_tokens(self.n_out)):
            if i:
                await asyncio.sleep(state.delay(state.config.decode_per_token))
            self.generated += 1
            self._set_blocks()
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
        f"vllm:prefix_cache_queries_total{{{m}}} {float(s.cache_query_blocks * cfg.block_size)}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{m}}} {float(s.cache_hit_blocks * cfg.block_size)}",
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
