"""A sample of the fuzz corpus through real processes: Envoy 1.40 with the generated config, `epp
serve` with KV events on (precise routing, the shipped tokenizer), and simulated vLLM pods.

No answer of Envoy's or epp's is a 5xx and epp logs no ERROR; a body that stops arriving is
answered 408 at epp's --request-body-timeout and its stream freed."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from e2e.harness import (
    Cleanup,
    StackOptions,
    parse_prometheus,
    start_stack,
    wait_routable,
)
from tests.fuzz.corpus import corpus
from tests.fuzz.headers import header_cases

pytestmark = pytest.mark.e2e

_ERROR_LINE = re.compile(r'\bERROR\b|"level": ?"error"|Traceback')


def _sample() -> list[tuple[str, str, bytes]]:
    """Every hand-made body and every 8th generated one, without the multi-MiB ones (~170)."""
    bodies = corpus()
    raw = [c for c in bodies if not c[0].startswith(("chat ", "message ", "part ", "tool"))]
    return [c for c in raw + bodies[len(raw) :: 8] if len(c[2]) < 1 << 20]


async def test_corpus_sample_through_envoy_gets_no_5xx_and_no_error_log(
    tmp_path: Path, cleanup: Cleanup, session: aiohttp.ClientSession
) -> None:
    stack = start_stack(tmp_path, cleanup, StackOptions(kv_events="connect"))
    await wait_routable(session, stack.url)
    failures: list[str] = []
    semaphore = asyncio.Semaphore(8)

    async def send(name: str, path: str, body: bytes) -> None:
        async with semaphore:
            headers = {"content-type": "application/json"}
            async with session.post(stack.url + path, data=body, headers=headers) as resp:
                text = await resp.text(errors="replace")
                # a pod's own answer (the simulator's) is not epp's to judge
                if resp.status >= 500 and "x-sim-server" not in resp.headers:
                    failures.append(f"{name} ({path}): {resp.status} {text[:200]}")

    await asyncio.gather(*(send(*case) for case in _sample()))
    assert not failures, "\n".join(failures)
    log = stack.epp.process.log_path.read_text(errors="replace")
    errors = [line for line in log.splitlines() if _ERROR_LINE.search(line)]
    assert not errors, "\n".join(errors[:20])


async def test_a_body_that_stops_arriving_is_408_and_released(
    tmp_path: Path, cleanup: Cleanup, session: aiohttp.ClientSession
) -> None:
    stack = start_stack(tmp_path, cleanup, StackOptions(epp_args=["--request-body-timeout", "1s"]))
    await wait_routable(session, stack.url)
    host, port = stack.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        "content-length: 100000\r\n\r\n"
    )
    writer.write(head.encode() + b'{"model":"sim-model","messages":[')
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 15)
    writer.close()
    assert status_line.startswith(b"HTTP/1.1 408"), status_line
    for _ in range(50):  # the stream is closed, not held
        if parse_prometheus(stack.epp.metrics_text(), "epp_extproc_active_streams") == {"": 0.0}:
            break
        await asyncio.sleep(0.1)
    assert parse_prometheus(stack.epp.metrics_text(), "epp_extproc_active_streams") == {"": 0.0}


async def _raw_request(host: str, port: int, headers: list[tuple[str, str]], body: bytes) -> int:
    """One HTTP/1.1 request written byte for byte (header values as UTF-8); Envoy's status."""
    method = next((v for k, v in headers if k == ":method"), "POST")
    path = next((v for k, v in headers if k == ":path"), "/")
    lines = [f"{method} {path} HTTP/1.1", "host: gw", f"content-length: {len(body)}"]
    skip = ("content-length", "host")
    lines += [f"{k}: {v}" for k, v in headers if not k.startswith(":") and k not in skip]
    head = "\r\n".join(lines).encode("utf-8", "surrogatepass") + b"\r\n\r\n"
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head + body)
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 20)
    except ConnectionResetError:  # Envoy refused what it read (headers past its limits)
        return REFUSED
    finally:
        writer.close()
    if not status:  # closed without an answer: Envoy refused what it read
        return REFUSED
    return int(status.split()[1]) if status.startswith(b"HTTP/1.1 ") else 0


REFUSED = 1  # no status: Envoy closed the connection


async def test_header_abuse_through_envoy_gets_no_5xx_and_no_error_log(
    tmp_path: Path, cleanup: Cleanup, session: aiohttp.ClientSession
) -> None:
    """The header cases (tests/fuzz/headers.py) an HTTP/1.1 client can send, through the default
    generated Envoy (mode override) to epp with KV events: Envoy refuses some itself (400, 431),
    epp answers the rest; no 5xx from either, no ERROR line from epp."""
    stack = start_stack(tmp_path, cleanup, StackOptions(kv_events="connect", mode_override=True))
    await wait_routable(session, stack.url)
    host, port = stack.url.removeprefix("http://").split(":")
    bad = re.compile(r"[\x00-\x08\x0a-\x1f\r\n]")  # what no HTTP/1.1 header line can carry
    failures: list[str] = []
    semaphore = asyncio.Semaphore(8)

    async def send(name: str, headers: list[tuple[str, str]], body: bytes) -> None:
        headers = [(k, v) for k, v in headers if k and not bad.search(k + v)]
        async with semaphore:
            status = await _raw_request(host, int(port), headers, body)
        if status >= 500 or status == 0:
            failures.append(f"{name}: {status}")

    await asyncio.gather(*(send(*case) for case in header_cases()))
    assert not failures, "\n".join(failures[:30])
    log = stack.epp.process.log_path.read_text(errors="replace")
    errors = [line for line in log.splitlines() if _ERROR_LINE.search(line)]
    assert not errors, "\n".join(errors[:20])
