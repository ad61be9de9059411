"""Token ids from the model servers themselves: vLLM's /render routes, as llm-d's `token-producer`
with a `vllm` backend asks them.

vLLM 0.32 renders and tokenizes a request without running it on `POST /v1/chat/completions/render`
(and `/v1/completions/render`, `/v1/messages/render`, `/v1/responses/render`; a server started
with `--enable-scale-out`, or `vllm launch render`): the ids its engine would be fed, from the
model's own tokenizer and template, with nothing to install beside epp. `Renderer` asks, for each
model it serves (`specs`):

- the spec's `url` (llm-d's `vllm.url`: a render sidecar or Service), with the spec's
  `model_name` stamped into the body as llm-d stamps it (`vllm launch render` knows only its base
  model); or, without a url, the pool's own pods (`pods()`: their host:port), round robin, each
  request as it is;
- within the spec's `timeout` (a request with content parts: `mm_timeout`; llm-d's 5 s / 30 s);
- through a bounded cache (`cache_tokens` ids in all, least recently used out), keyed by the
  route and the body as sent, and with concurrent identical requests sharing one call;
- batched: completions prompts (a string each) whose bodies differ only in the prompt, arriving
  while a call for such a body is in flight, go in the next call as one batch (vLLM's completions
  render takes a list and answers one item per prompt). An idle renderer adds no wait.

Whatever goes wrong - a timeout, a refused connection, a non-2xx answer (vLLM's own refusal of the
request included: the pod answers that itself), an answer without ids - yields None: the caller
routes without token ids, on load, as llm-d does when its producer fails. A pod that answers 403
or 404 on /render (vLLM without `--enable-scale-out`, or not vLLM) is not asked again for
`BACKOFF` seconds, and that is logged once per pod. Every outcome is counted (`outcomes`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

log = logging.getLogger("epp.tokenize.render")

DEFAULT_TIMEOUT = 5.0  # llm-d's vllm.timeout
DEFAULT_MM_TIMEOUT = 30.0  # llm-d's vllm.mmTimeout: requests with content parts
DEFAULT_CACHE_TOKENS = 4_000_000  # ids kept (~36 MB of Python ints at most; shared small ints less)
BACKOFF = 30.0  # seconds a pod that answers 403/404 on /render is not asked
MAX_BATCH = 32
CHAT, COMPLETIONS, MESSAGES, RESPONSES = (
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/messages/render",
    "/v1/responses/render",
)
ROUTES = (CHAT, COMPLETIONS, MESSAGES, RESPONSES)
OUTCOMES = ("rendered", "cached", "timeout", "error", "refused", "unavailable")


@dataclasses.dataclass(frozen=True, slots=True)
class RenderSpec:
    """Where a model's renders come from (llm-d's token-producer `vllm` parameters)."""

    url: str | None = None  # None: the pool's pods
    model_name: str = ""  # stamped into the body as the model (with a url); "" keeps the request's
    timeout: float = DEFAULT_TIMEOUT
    mm_timeout: float = DEFAULT_MM_TIMEOUT


class _Unavailable(Exception):
    """No server to ask (no pod, every pod backing off)."""


class Renderer:
    """Token ids from vLLM's render routes for the models in `specs` ("" for every model)."""

    def __init__(
        self,
        specs: Mapping[str, RenderSpec],
        pods: Callable[[], list[str]],
        *,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
    ) -> None:
        self.specs = dict(specs)
        self._pods = pods
        self._cursor = itertools.count()
        self._backoff: dict[str, float] = {}  # base url -> monotonic time it may be asked again
        self._cache: collections.OrderedDict[bytes, tuple[int, ...]] = collections.OrderedDict()
        self._cached_tokens = 0
        self.cache_tokens = cache_tokens
        self._inflight: dict[bytes, asyncio.Future[tuple[int, ...] | None]] = {}
        self._batches: dict[bytes, _Batch] = {}
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.batched = 0  # prompts that rode in another request's call
        self._session: aiohttp.ClientSession | None = None

    def serves(self, model: str) -> bool:
        return model in self.specs or "" in self.specs

    def spec_for(self, model: str) -> RenderSpec:
        found = self.specs.get(model) or self.specs.get("")
        assert found is not None, "call serves() first"
        return found

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def render(
        self, model: str, route: str, body: Mapping[str, Any], *, multimodal: bool = False
    ) -> list[int] | None:
        """The ids vLLM renders for `body` on `route` (one of ROUTES; completions: the first
        prompt's), or None (see the module docstring)."""
        spec = self.spec_for(model)
        if spec.url is not None and spec.model_name:
            body = {**body, "model": spec.model_name}
        sent = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
        key = hashlib.blake2b(f"{spec.url}\n{route}\n".encode() + sent, digest_size=16).digest()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self.outcomes["cached"] += 1
            return list(hit)
        shared = self._inflight.get(key)
        if shared is not None:
            self.outcomes["cached"] += 1
            found = await asyncio.shield(shared)
            return None if found is None else list(found)
        future: asyncio.Future[tuple[int, ...] | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            ids = await self._fetch(spec, route, body, sent, multimodal)
            if ids is not None:
                self._remember(key, ids)
            future.set_result(ids)
        except BaseException:
            future.set_result(None)
            raise
        finally:
            del self._inflight[key]
        return None if ids is None else list(ids)

    async def _fetch(
        self, spec: RenderSpec, route: str, body: Mapping[str, Any], sent: bytes, multimodal: bool
    ) -> tuple[int, ...] | None:
        seconds = spec.mm_timeout if multimodal else spec.timeout
        try:
            if route == COMPLETIONS and isinstance(body.get("prompt"), str):
                return await self._batched(spec, body, seconds)
            answer = await self._post(spec, route, sent, seconds)
            return _ids(answer[0] if isinstance(answer, list) and answer else answer)
        except TimeoutError:
            self.outcomes["timeout"] += 1
        except _Unavailable:
            self.outcomes["unavailable"] += 1
        except _Refused:
            self.outcomes["refused"] += 1
        except (aiohttp.ClientError, OSError, ValueError, KeyError, TypeError) as exc:
            self.outcomes["error"] += 1
            log.debug("render failed: %s", exc)
        return None

    async def _batched(
        self, spec: RenderSpec, body: Mapping[str, Any], seconds: float
    ) -> tuple[int, ...] | None:
        rest = json.dumps({k: v for k, v in body.items() if k != "prompt"}, sort_keys=True).encode()
        key = hashlib.blake2b(f"{spec.url}\n".encode() + rest, digest_size=16).digest()
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = _Batch()
        slot: asyncio.Future[tuple[int, ...] | None] = asyncio.get_running_loop().create_future()
        batch.waiting.append((body["prompt"], slot))
        if not batch.running:
            batch.running = True
            asyncio.get_running_loop().create_task(self._drain(spec, body, key, batch, seconds))
        return await slot

    async def _drain(
        self, spec: RenderSpec, body: Mapping[str, Any], key: bytes, batch: _Batch, seconds: float
    ) -> None:
        """Send the waiting prompts, MAX_BATCH at a time, until none waits."""
        try:
            while batch.waiting:
                taken, batch.waiting = batch.waiting[:MAX_BATCH], batch.waiting[MAX_BATCH:]
                prompts = [p for p, _ in taken]
                self.batched += len(taken) - 1
                sent = json.dumps({**body, "prompt": prompts if len(prompts) > 1 else prompts[0]}).encode()
                try:
                    answer = await self._post(spec, COMPLETIONS, sent, seconds)
                    results = [_ids(item) for item in answer] if isinstance(answer, list) else []
                except BaseException as exc:
                    for _, slot in taken:
                        if not slot.done():
                            slot.set_exception(
                                exc if isinstance(exc, Exception) else RuntimeError("cancelled")
                            )
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for i, (_, slot) in enumerate(taken):
                    if not slot.done():
                        slot.set_result(results[i] if i < len(results) else None)
        finally:
            batch.running = False
            if not batch.waiting:
                self._batches.pop(key, None)

    async def _post(self, spec: RenderSpec, route: str, sent: bytes, seconds: float) -> Any:
        base = spec.url.rstrip("/") if spec.url is not None else self._next_pod()
        session = self._session
        if session is None:
            session = self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit_per_host=16),
                headers={"content-type": "application/json"},
            )
        started = time.monotonic()
        async with asyncio.timeout(seconds), session.post(base + route, data=sent) as resp:
            if resp.status in (403, 404):
                self._back_off(base, resp.status, route)
                raise _Refused(f"{resp.status}")
            if resp.status >= 400:
                raise _Refused(f"{resp.status}")  # vLLM refuses the request: the pod will answer it
            answer = await resp.json(content_type=None)
        self.outcomes["rendered"] += 1
        log.debug("rendered at %s in %.1f ms", base, (time.monotonic() - started) * 1e3)
        return answer

    def _next_pod(self) -> str:
        pods = self._pods()
        now = time.monotonic()
        for _ in range(len(pods)):
            pod = pods[next(self._cursor) % len(pods)]
            base = f"http://{pod}"
            if self._backoff.get(base, 0.0) <= now:
                return base
        raise _Unavailable("no pod to render at")

    def _back_off(self, base: str, status: int, route: str) -> None:
        first = base not in self._backoff
        self._backoff[base] = time.monotonic() + BACKOFF
        if first:
            log.warning(
                "%s answers %d on %s: token ids come from it only when it renders (vLLM 0.32 with "
                "--enable-scale-out); meanwhile requests route on load, and it is asked again in %.0f s",
                base,
                status,
                route,
                BACKOFF,
            )

    def _remember(self, key: bytes, ids: tuple[int, ...]) -> None:
        if len(ids) > self.cache_tokens:
            return
        self._cache[key] = ids
        self._cached_tokens += len(ids)
        while self._cached_tokens > self.cache_tokens:
            _, dropped = self._cache.popitem(last=False)
            self._cached_tokens -= len(dropped)


class _Refused(Exception):
    """The server answered an error status."""


@dataclasses.dataclass
class _Batch:
    waiting: list[tuple[str, asyncio.Future[tuple[int, ...] | None]]] = dataclasses.field(
        default_factory=list
    )
    running: bool = False


def _ids(answer: Any) -> tuple[int, ...] | None:
    ids = answer.get("token_ids") if isinstance(answer, dict) else None
    if not isinstance(ids, list) or not ids or not all(type(i) is int and i >= 0 for i in ids):
        return None
    return tuple(ids)
