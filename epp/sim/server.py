"""A small simulated vLLM replica (aiohttp) with the behaviour an endpoint picker can observe.

What is modelled, and why:

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

Every response carries `x-sim-server` (this replica's name, by default `host:port`) and
`x-sim-received-destination` (the `x-gateway-destination-endpoint` request header it got, or ""),
so a test can tell which backend served and what the gateway told it. GET /sim/stats returns
counters as JSON; POST /sim/reset clears them and the cache.

Deliberately absent: tokenization (4 characters = 1 token), batching effects on speed, preemption,
real LoRA loading. A later simulator can grow those behind the same HTTP surface.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from aiohttp import web

DESTINATION_HEADER = "x-gateway-destination-endpoint"
SERVER_HEADER = "x-sim-server"
RECEIVED_DESTINATION_HEADER = "x-sim-received-destination"

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
    """Live state of one replica; reachable from the runner with `sim_state(runner)`."""

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


SIM_STATE = web.AppKey("sim_state", SimState)


# --- request parsing -------------------------------------------------------------------------------


class _BadRequest(Exception):
    pass


def _text_of_content(content: Any) -> str:
    """Chat / responses content: a string, or a list of parts of which text parts count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "".join(parts)
    raise _BadRequest("content must be a string or a list of parts")


def _text_of_prompt(prompt: Any, field: str) -> str:
    """Completions prompt / embeddings input: string, list of strings, token ids, or lists of ids."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt)
        if all(isinstance(p, int) for p in prompt):
            # A token id stands for one token: give it chars_per_token-ish characters.
            return "".join(f"{p:>4}"[-4:] for p in prompt)
        if all(isinstance(p, list) for p in prompt):
            return "".join(_text_of_prompt(p, field) for p in prompt)
    raise _BadRequest(f"'{field}' must be a string, a list of strings or token ids")


def _prompt_text(api: str, body: Mapping[str, Any]) -> str:
    if api == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("'messages' is required and must be a non-empty list")
        texts: list[str] = []
        for m in messages:
            if not isinstance(m, Mapping):
                raise _BadRequest("each message must be an object")
            texts.append(_text_of_content(m.get("content")))
        return "".join(texts)
    if api == "completions":
        if "prompt" not in body:
            raise _BadRequest("'prompt' is required")
        return _text_of_prompt(body["prompt"], "prompt")
    if api == "embeddings":
        if "input" not in body:
            raise _BadRequest("'input' is required")
        return _text_of_prompt(body["input"], "input")
    # responses
    if "input" not in body:
        raise _BadRequest("'input' is required")
    instructions = body.get("instructions")
    text = instructions if isinstance(instructions, str) else ""
    inp = body["input"]
    if isinstance(inp, str):
        return text + inp
    if isinstance(inp, list):
        return text + "".join(
            _text_of_content(i.get("content")) if isinstance(i, Mapping) else str(i) for i in inp
        )
    raise _BadRequest("'input' must be a string or a list of items")


def _max_tokens(api: str, body: Mapping[str, Any], config: SimConfig) -> int:
    if api == "embeddings":
        return 0
    keys = ("max_output_tokens",) if api == "responses" else ("max_completion_tokens", "max_tokens")
    for key in keys:
        value = body.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise _BadRequest(f"'{key}' must be a positive integer")
            return min(value, config.max_output_tokens)
    return config.default_max_tokens


def _error(status: int, message: str, err_type: str = "BadRequestError") -> web.Response:
    body = {"object": "error", "message": message, "type": err_type, "param": None, "code": status}
    return web.json_response(body, status=status)


# --- handlers --------------------------------------------------------------------------------------


def _sse(payload: Mapping[str, Any], event: str = "") -> bytes:
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class _Request:
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


async def _inference(request: web.Request, api: str) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    cfg = state.config
    state.stats.inference_requests += 1
    if cfg.fault_reset:
        state.stats.faults += 1
        if request.transport is not None:
            request.transport.abort()  # the proxy sees a reset before any response byte
        raise asyncio.CancelledError
    if cfg.fault_status:
        state.stats.faults += 1
        return _error(cfg.fault_status, "injected fault", "SimulatedFault")
    try:
        body = json.loads(await request.read())
        if not isinstance(body, dict):
            raise _BadRequest("request body must be a JSON object")
        if "model" in body and not isinstance(body["model"], str):
            raise _BadRequest("'model' must be a string")
        text = _prompt_text(api, body)
        n_out = _max_tokens(api, body, cfg)
    except (ValueError, _BadRequest) as exc:  # json.JSONDecodeError is a ValueError
        state.stats.errors += 1
        return _error(400, str(exc) if isinstance(exc, _BadRequest) else f"invalid JSON body: {exc}")
    req = _Request(state, api, body, text, n_out)
    if cfg.strict_models and req.model not in (cfg.served_model, *cfg.lora_adapters):
        state.stats.errors += 1
        return _error(404, f"The model `{req.model}` does not exist.", "NotFoundError")

    started = time.monotonic()
    try:
        async with req.admitted():
            await req.prefill()
            if body.get("stream") is True and api != "embeddings":
                resp = await _stream(request, req, started)
            else:
                resp = await _complete(req, started)
    except (asyncio.CancelledError, ConnectionResetError):
        # The client (or the proxy on its behalf) went away: vLLM aborts the request.
        state.stats.aborted += 1
        raise
    state.stats.completed += 1
    state.stats.prompt_tokens += req.prompt_tokens
    state.stats.cached_tokens += req.cached_tokens
    state.stats.generation_tokens += req.generated
    state.success["length" if req.n_out else "stop"] += 1
    state.e2e.observe(time.monotonic() - started)
    return resp


async def _complete(req: _Request, started: float) -> web.Response:
    tokens: list[str] = []
    async for tok in req.decode():
        if not tokens:
            req.state.ttft.observe(time.monotonic() - started)
        tokens.append(tok)
    text = "".join(tokens)
    head = {"id": f"{_ID_PREFIX[req.api]}{req.id}", "created": req.created, "model": req.model}
    if req.api == "embeddings":
        req.state.ttft.observe(time.monotonic() - started)
        digest = hashlib.blake2b(req.text.encode("utf-8", "surrogatepass"), digest_size=64).digest()
        vector = [round((digest[i % 64] - 127.5) / 127.5, 6) for i in range(req.state.config.embedding_dims)]
        payload: dict[str, Any] = {
            "object": "list",
            "model": req.model,
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "usage": {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens},
        }
    elif req.api == "chat":
        payload = head | {
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": req.usage(),
        }
    elif req.api == "completions":
        payload = head | {
            "object": "text_completion",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
            "usage": req.usage(),
        }
    else:
        payload = _response_object(req, text, "completed")
    return web.json_response(payload)


_ID_PREFIX = {"chat": "chatcmpl-", "completions": "cmpl-", "responses": "resp_", "embeddings": "embd-"}


def _response_object(req: _Request, text: str, status: str) -> dict[str, Any]:
    return {
        "id": f"resp_{req.id}",
        "object": "response",
        "created_at": req.created,
        "model": req.model,
        "status": status,
        "output": [
            {
                "type": "message",
                "id": f"msg_{req.id}",
                "role": "assistant",
                "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": req.usage() if status == "completed" else None,
    }


async def _stream(request: web.Request, req: _Request, started: float) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    head = {"id": f"{_ID_PREFIX[req.api]}{req.id}", "created": req.created, "model": req.model}
    opts = req.body.get("stream_options")
    include_usage = isinstance(opts, Mapping) and opts.get("include_usage") is True

    if req.api == "responses":
        await resp.write(
            _sse(
                {"type": "response.created", "response": _response_object(req, "", "in_progress")},
                "response.created",
            )
        )
        parts: list[str] = []
        async for tok in req.decode():
            if not parts:
                req.state.ttft.observe(time.monotonic() - started)
            parts.append(tok)
            await resp.write(
                _sse(
                    {
                        "type": "response.output_text.delta",
                        "item_id": f"msg_{req.id}",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": tok,
                    },
                    "response.output_text.delta",
                )
            )
        await resp.write(
            _sse(
                {
                    "type": "response.completed",
                    "response": _response_object(req, "".join(parts), "completed"),
                },
                "response.completed",
            )
        )
        await resp.write_eof()
        return resp

    chat = req.api == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"

    def choice(delta: str | None, finish: str | None) -> dict[str, Any]:
        if chat:
            d: dict[str, Any] = {} if delta is None else {"content": delta}
            return {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}

    if chat:
        first = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        await resp.write(_sse(head | {"object": obj, "choices": [first]}))
    first_token = True
    async for tok in req.decode():
        if first_token:
            req.state.ttft.observe(time.monotonic() - started)
            first_token = False
        await resp.write(_sse(head | {"object": obj, "choices": [choice(tok, None)]}))
    await resp.write(_sse(head | {"object": obj, "choices": [choice(None, "length")]}))
    if include_usage:
        await resp.write(_sse(head | {"object": obj, "choices": [], "usage": req.usage()}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _route(api: str) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _inference(request, api)

    return handler


async def _models(request: web.Request) -> web.Response:
    cfg = request.app[SIM_STATE].config
    created = int(request.app[SIM_STATE].started)
    data = [
        {
            "id": cfg.served_model,
            "object": "model",
            "created": created,
            "owned_by": "epp-sim",
            "root": cfg.served_model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }
    ]
    data += [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "epp-sim",
            "root": name,
            "parent": cfg.served_model,
            "max_model_len": cfg.max_model_len,
        }
        for name in cfg.lora_adapters
    ]
    return web.json_response({"object": "list", "data": data})


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


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


async def _metrics(request: web.Request) -> web.Response:
    text = render_metrics(request.app[SIM_STATE])
    return web.Response(
        text=text, content_type="text/plain", charset="utf-8", headers={"X-Content-Type-Options": "nosniff"}
    )


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[SIM_STATE].snapshot())


async def _reset(request: web.Request) -> web.Response:
    request.app[SIM_STATE].reset()
    return web.json_response({"ok": True})


@web.middleware
async def _count(request: web.Request, handler: Any) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    # Scrapes and probes are not routed traffic: keep them out of the routing counters.
    if not request.path.startswith("/sim/") and request.path not in ("/metrics", "/health"):
        state.stats.requests += 1
        state.stats.by_path[request.path] += 1
        state.stats.destinations[request.headers.get(DESTINATION_HEADER, "")] += 1
    resp: web.StreamResponse = await handler(request)
    return resp


async def _tag_response(request: web.Request, response: web.StreamResponse) -> None:
    # on_response_prepare runs before headers go out, for plain and streamed responses alike.
    response.headers[SERVER_HEADER] = request.app[SIM_STATE].name
    response.headers[RECEIVED_DESTINATION_HEADER] = request.headers.get(DESTINATION_HEADER, "")


def make_app(config: SimConfig) -> web.Application:
    app = web.Application(middlewares=[_count], client_max_size=64 * 1024 * 1024)
    app[SIM_STATE] = SimState(config)
    app.on_response_prepare.append(_tag_response)
    app.router.add_post("/v1/completions", _route("completions"))
    app.router.add_post("/v1/chat/completions", _route("chat"))
    app.router.add_post("/v1/responses", _route("responses"))
    app.router.add_post("/v1/embeddings", _route("embeddings"))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health)
    app.router.add_get("/sim/stats", _stats)
    app.router.add_post("/sim/reset", _reset)
    return app


async def start_sim_server(host: str, port: int, *, config: SimConfig | None = None) -> web.AppRunner:
    """Serve one simulated replica on host:port (port 0 = any free port); returns the runner.

    Stop it with `await runner.cleanup()`. `sim_state(runner)` gives the live state and
    `bound_address(runner)` the actual "host:port".
    """
    cfg = config or SimConfig()
    app = make_app(cfg)
    # handler_cancellation: a client disconnect aborts the request, freeing its slot (as vLLM).
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    if not cfg.name:
        app[SIM_STATE].name = bound_address(runner)
    return runner


def sim_state(runner: web.AppRunner) -> SimState:
    return runner.app[SIM_STATE]


def bound_address(runner: web.AppRunner) -> str:
    """'host:port' the runner listens on (the first, if several)."""
    addr = runner.addresses[0]
    host, port = str(addr[0]), int(addr[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
