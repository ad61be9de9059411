"""Sending prefix pre-warms to model servers (the scheduler plans them: epp.scheduling.prewarm).

`Sender.send` posts `{"model", "prompt": [token ids], "max_tokens": 1}` to the endpoint's
`/v1/completions`, in the background. Token ids, not text: the blocks computed are those of the ids
the planning request itself sends (epp tokenizes as vLLM does: docs/tokenization.md), whatever its
API and template, and ids given to vLLM are taken as they are (no special tokens added). The
request's `cache_salt` and model name (a LoRA adapter's included) go with it: both enter vLLM's
block hashes; so does its `Authorization` header, for pods that require an API key.

Bounded: one pre-warm at a time per endpoint and `max_inflight` in all, each within `timeout`
seconds, none to an endpoint for `backoff` seconds after one failed there; the rest are skipped.
Past the first two bounds their requests stay on their holders (`wait`); at an endpoint where
pre-warms fail, the Director moves them instead, as without pre-warms (`refuse`). Nothing a
pre-warm meets reaches the request that planned it: every outcome is counted
(`epp_prewarm_requests_total{outcome}`) and failures are logged at debug level, at most once a
second.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Literal

import aiohttp

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.observability import metrics
from epp.observability.logs import Throttle

log = logging.getLogger("epp.prewarm")

__all__ = ["Sender"]


class Sender:
    """Pre-warms over HTTP: implements the Director's `Prewarmer`. Lives on one event loop."""

    def __init__(
        self,
        *,
        scheme: str = "http",
        verify: bool = False,
        max_inflight: int = 16,
        timeout: float = 30.0,
        backoff: float = 30.0,
    ) -> None:
        """`verify`: check an https pod's certificate (GIE's and llm-d's default is not to: model
        servers' certificates are often self-signed, as for their /metrics)."""
        if scheme not in ("http", "https"):
            raise ValueError(f"scheme must be http or https, got {scheme!r}")
        self._scheme = scheme
        self._ssl = verify  # aiohttp: True checks, False does not
        self._max = max_inflight
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._running: dict[str, asyncio.Task[None]] = {}  # endpoint name -> its pre-warm
        self._failed: dict[str, float] = {}  # endpoint name -> time.monotonic() of its last failure
        self._backoff = backoff
        self._throttle = Throttle(1.0)
        for outcome in ("ok", "failed", "skipped"):  # every series from the start, at 0
            metrics.prewarm_requests.labels(outcome)

    @property
    def running(self) -> int:
        """Pre-warms sent and not yet answered."""
        return len(self._running)

    def verdict(self, endpoint: Endpoint) -> Literal["send", "wait", "refuse"]:
        """`refuse` (counted as skipped) for `backoff` seconds after one failed at `endpoint` (a
        pod that refuses them, e.g. a network policy that lets only the gateway in: the Director
        then moves the requests, as without pre-warms) or with `max_inflight` 0; `wait` (skipped
        too) while `endpoint` has a pre-warm running or `max_inflight` are running in all."""
        name = endpoint.name
        if self._max <= 0 or self._failed.get(name, -math.inf) > time.monotonic() - self._backoff:
            metrics.prewarm_requests.labels("skipped").inc()
            return "refuse"
        if name in self._running or len(self._running) >= self._max:
            metrics.prewarm_requests.labels("skipped").inc()
            return "wait"
        return "send"

    def send(self, endpoint: Endpoint, request: InferenceRequest, tokens: int) -> None:
        """Start computing `request`'s first `tokens` token ids on `endpoint`; returns at once."""
        ids = request.token_ids
        name = endpoint.name
        if not ids or tokens <= 0 or name in self._running:
            return
        body: dict[str, Any] = {
            "model": request.target_model or request.model,
            "prompt": ids[:tokens],
            "max_tokens": 1,
            "temperature": 0.0,
        }
        if request.cache_salt:
            body["cache_salt"] = request.cache_salt
        url = f"{self._scheme}://{endpoint.hostport}/v1/completions"
        # The client's credentials, as the gateway passes them to the pod it picks: a pod started
        # with an API key (vLLM's --api-key) accepts the pre-warm as it accepts the request.
        auth = request.headers.get("authorization")
        headers = {"Authorization": auth} if auth else None
        task = asyncio.get_running_loop().create_task(self._post(name, url, body, headers))
        self._running[name] = task
        task.add_done_callback(lambda _t: self._running.pop(name, None))

    async def _post(self, name: str, url: str, body: dict[str, Any], headers: dict[str, str] | None) -> None:
        started = time.perf_counter()
        outcome = "failed"
        try:
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=self._timeout)
            async with self._session.post(url, json=body, headers=headers, ssl=self._ssl) as resp:
                await resp.read()
                if resp.status == 200:
                    outcome = "ok"
                else:
                    self._throttle.log(log, logging.DEBUG, "pre-warm of %s answered %d", url, resp.status)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._throttle.log(log, logging.DEBUG, "pre-warm of %s failed: %r", url, exc)
        finally:
            if outcome == "ok":
                self._failed.pop(name, None)
            else:
                self._failed[name] = time.monotonic()
            metrics.prewarm_requests.labels(outcome).inc()
            log.debug("pre-warm of %s: %s in %.3f s", url, outcome, time.perf_counter() - started)

    async def idle(self) -> None:
        """Return once every pre-warm sent so far is answered (or failed)."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def close(self) -> None:
        """Cancel the pre-warms still running and close the connections."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
