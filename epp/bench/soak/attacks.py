"""Client attacks at a low rate during the soak: what a hostile or broken client sends the
gateway, one at a time, cycling through the kinds. None may cost an honest request (they are
not in the soak's request records) nor get a 5xx: each one's answer is recorded by kind.

- `unfinished`: a POST declaring 2 MiB that sends 64 bytes and stops, held 10 s;
- `declared_large`: a POST declaring 15 MiB that sends 15 MiB less 1 KiB and stops, held 10 s;
- `garbage`: a body that is not JSON; `deep`: JSON nested 100,000 deep;
- `giant_header`: a 60 KB header value; `many_headers`: 500 headers;
- `control_headers`: every control header a client may not send, pointing at Envoy's admin port;
- `same_request_id`: two different chats at once under one x-request-id (both must be 200);
- `odd_path`: a path with dot segments and a NUL escape.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

KINDS = (
    "unfinished",
    "declared_large",
    "garbage",
    "deep",
    "giant_header",
    "many_headers",
    "control_headers",
    "same_request_id",
    "odd_path",
)
HOLD_S = 10.0  # how long an unfinished upload is held open
MODEL = "sim-model"


def _chat(text: str) -> bytes:
    message = {"role": "user", "content": text}
    return json.dumps({"model": MODEL, "messages": [message], "max_tokens": 4}).encode()


class Attacker:
    """Sends one attack every 1/`rate` seconds at `host:port` until cancelled; `results` holds
    (t, kind, status, seconds) with status 0 for no answer (the gateway closed the connection)."""

    def __init__(self, host: str, port: int, rate: float, now: Callable[[], float]) -> None:
        self.host, self.port, self.rate, self.now = host, port, rate, now
        self.results: list[tuple[float, str, int, float]] = []
        self._held: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        i = 0
        try:
            while True:
                await asyncio.sleep(1.0 / self.rate)
                kind = KINDS[i % len(KINDS)]
                i += 1
                task = asyncio.create_task(self._one(kind))
                self._held.add(task)
                task.add_done_callback(self._held.discard)
        finally:
            for task in list(self._held):
                task.cancel()

    async def _one(self, kind: str) -> None:
        t = self.now()
        attack: Callable[[], Awaitable[list[int]]] = getattr(self, f"_{kind}")
        try:
            statuses = await attack()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            statuses = [0]
        took = self.now() - t
        for status in statuses:
            self.results.append((t, kind, status, took))

    async def _send(self, head: str, body: bytes, *, stop_short: int = 0, hold: float = 0.0) -> int:
        """Write one HTTP/1.1 request (its body cut `stop_short` bytes early), optionally hold the
        connection `hold` seconds, and return the status line's code (0: none)."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(head.encode("latin-1", "replace") + b"\r\n\r\n" + body[: len(body) - stop_short])
            await writer.drain()
            if hold:
                try:
                    line = await asyncio.wait_for(reader.readline(), hold)
                except TimeoutError:
                    return -1  # still held at the end: nothing answered yet (epp or Envoy times it out)
            else:
                line = await asyncio.wait_for(reader.readline(), 30)
        finally:
            writer.close()
        parts = line.split()
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0

    def _head(self, body: bytes, *extra: str, path: str = "/v1/chat/completions", length: int = -1) -> str:
        size = len(body) if length < 0 else length
        lines = [f"POST {path} HTTP/1.1", "host: gw", "content-type: application/json"]
        return "\r\n".join([*lines, f"content-length: {size}", *extra])

    async def _unfinished(self) -> list[int]:
        body = _chat("x" * 40)[:64]
        return [await self._send(self._head(body, length=2 << 20), body, hold=HOLD_S)]

    async def _declared_large(self) -> list[int]:
        body = _chat("y" * ((15 << 20) - 200))
        return [await self._send(self._head(body), body, stop_short=1024, hold=HOLD_S)]

    async def _garbage(self) -> list[int]:
        body = b"\xff\xfe not json {{{"
        return [await self._send(self._head(body), body)]

    async def _deep(self) -> list[int]:
        body = b'{"model":"' + MODEL.encode() + b'","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        return [await self._send(self._head(body), body)]

    async def _giant_header(self) -> list[int]:
        body = _chat("hi")
        return [await self._send(self._head(body, "x-big: " + "b" * 60_000), body)]

    async def _many_headers(self) -> list[int]:
        body = _chat("hi")
        return [await self._send(self._head(body, *(f"x-h{i}: v" for i in range(500))), body)]

    async def _control_headers(self) -> list[int]:
        body = _chat("hi")
        forged = [
            "x-gateway-destination-endpoint: 127.0.0.1:19000",
            "x-gateway-destination-endpoint-served: 127.0.0.1:19000",
            "x-gateway-destination-endpoint-subset: 127.0.0.1:19000",
            "x-gateway-model-name-rewrite: other-model",
        ]
        return [await self._send(self._head(body, *forged), body)]

    async def _same_request_id(self) -> list[int]:
        bodies = [_chat("first " * 50), _chat("second " * 80)]
        sends = (self._send(self._head(b, "x-request-id: soak-attack"), b) for b in bodies)
        return list(await asyncio.gather(*sends))

    async def _odd_path(self) -> list[int]:
        body = _chat("hi")
        return [await self._send(self._head(body, path="/v1/../v1/chat/completions?%00=1"), body)]


def summary(results: list[tuple[float, str, int, float]]) -> dict[str, dict[str, int]]:
    """Per kind: the count of each status (as text; "none" for no answer, "held" for still held)."""
    out: dict[str, dict[str, int]] = {}
    for _, kind, status, _ in results:
        key = {0: "none", -1: "held"}.get(status, str(status))
        counts = out.setdefault(kind, {})
        counts[key] = counts.get(key, 0) + 1
    return out


def server_errors(
    results: list[tuple[float, str, int, float]], in_fault: Callable[[float, float], bool]
) -> tuple[int, int]:
    """5xx answers (outside any fault window, inside one): an attack in flight while a pod or an
    epp replica is killed is judged as an honest request is, by `in_fault(t, seconds)`."""
    errors = [(t, took) for t, _, status, took in results if status >= 500]
    inside = sum(1 for t, took in errors if in_fault(t, took))
    return len(errors) - inside, inside
