"""Large bodies parsed and rendered in body-parser processes (epp.requestcontrol.offload) give the
same requests, prompts, token ids and errors as in-process, and a dead worker costs a 503, not
the service."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from epp.api import errors
from epp.api.limits import KnownStrings, RequestLimits, decode_body
from epp.api.requests import InferenceRequest, parse_request
from epp.requestcontrol import offload
from epp.requestcontrol.offload import BodyParsers
from epp.tokenize.chat import ChatTemplateError, prepare_chat
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import load_shipped
from tests.requestcontrol.test_director_tokens import director

LIMITS = RequestLimits()


@pytest.fixture(scope="module")
def parsers() -> Iterator[BodyParsers]:
    p = BodyParsers(1, min_bytes=1024)
    yield p
    p.close()


@pytest.fixture
async def tokenizers() -> AsyncIterator[Tokenizers]:
    toks = Tokenizers(default=load_shipped(), workers=1)
    yield toks
    toks.close()


def _chat(messages: int, size: int = 40, **extra: object) -> bytes:
    msgs = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "w " * (size // 2)}
        for i in range(messages)
    ]
    return json.dumps({"model": "m", "messages": msgs, **extra}).encode()


async def _parse(
    parsers: BodyParsers, body: bytes, limits: RequestLimits = LIMITS, path: str = "/v1/chat/completions"
) -> InferenceRequest:
    return await parsers.parse(
        path=path, headers={}, body=body, request_id="r", subset_ips=None, limits=limits
    )


BODIES = [
    ("/v1/chat/completions", _chat(300, max_tokens=7, stream=True)),
    ("/v1/completions", json.dumps({"model": "m", "prompt": "p " * 3000, "max_tokens": 3}).encode()),
    ("/v1/completions", json.dumps({"model": "m", "prompt": [[1, 2, 3] * 500, [4]]}).encode()),
    ("/v1/responses", json.dumps({"model": "m", "input": [{"content": "x " * 900}] * 3}).encode()),
]


@pytest.mark.parametrize(("path", "body"), BODIES)
async def test_a_body_parsed_in_a_worker_is_the_request_parsed_here(
    parsers: BodyParsers, path: str, body: bytes
) -> None:
    headers = {":path": path, "x-request-id": "r1"}
    here = parse_request(path=path, headers=headers, body=body, request_id="r1", limits=LIMITS)
    there = await parsers.parse(
        path=path, headers=headers, body=body, request_id="r1", subset_ips=None, limits=LIMITS
    )
    assert there.body_bytes is body  # the parent's copy, not one sent back
    assert there == here


async def test_prompt_texts_past_the_cap_are_cut_after_the_estimate(parsers: BodyParsers) -> None:
    body = _chat(300, size=4000)  # 1.2 M characters of text
    here = parse_request(path="/v1/chat/completions", headers={}, body=body, request_id="r", limits=LIMITS)
    there = await _parse(parsers, body, LIMITS)
    assert there.prompt_tokens_estimate == here.prompt_tokens_estimate
    assert sum(map(len, here.prompt_texts)) > offload.TEXT_CHARS
    assert "".join(there.prompt_texts) == "".join(here.prompt_texts)[: offload.TEXT_CHARS]
    assert offload._cut_texts(["abc", "defg", "h"], 5) == ["abc", "de"]
    assert offload._cut_texts(["abc"], 3) == ["abc"]


async def test_client_errors_come_back_as_the_same_400(parsers: BodyParsers) -> None:
    tight = RequestLimits(max_messages=10)
    for body, limits in [
        (b'{"model": "m", "messages": 7' + b" " * 2000 + b"}", LIMITS),
        (_chat(11), tight),
        (b"[" * 70 + b"]" * 70 + b" " * 2000, LIMITS),
    ]:
        with pytest.raises(errors.BadRequest) as here:
            parse_request(path="/v1/chat/completions", headers={}, body=body, request_id="r", limits=limits)
        with pytest.raises(errors.BadRequest) as there:
            await _parse(parsers, body, limits)
        assert there.value.reason == here.value.reason


async def test_a_chat_rendered_in_a_worker_is_the_prompt_rendered_here(parsers: BodyParsers) -> None:
    tok = load_shipped()
    for body in [_chat(300), _chat(3, add_generation_prompt=False, continue_final_message=True)]:
        here = prepare_chat(tok, decode_body(body, LIMITS))
        there = await parsers.prepare_chat(tok, body, LIMITS, max_chars=10**9)
        assert there.prompt == here
        assert (there.forwards_ids, there.add_special_tokens) == (False, False)
    cut = await parsers.prepare_chat(tok, _chat(300), LIMITS, max_chars=1000)
    assert cut.prompt.text == prepare_chat(tok, decode_body(_chat(300), LIMITS)).text[:1001]
    with pytest.raises(ChatTemplateError):
        await parsers.prepare_chat(tok, b'{"model": "m", "messages": []}', LIMITS, max_chars=100)
    with pytest.raises(errors.BadRequest, match="nest"):
        deep = b'{"model": "m", "messages": [], "x": ' + b"[" * 100 + b"]" * 100 + b"}"
        await parsers.prepare_chat(tok, deep, LIMITS, max_chars=100)


async def test_a_chat_body_crosses_once_the_worker_keeps_it_for_the_render(parsers: BodyParsers) -> None:
    """The render after a parse uses the body the worker kept (here the body passed to the render
    is a decoy, so a render of it would differ); a render of a request the worker does not hold,
    or holds no more, is given the body."""
    tok = load_shipped()
    body = _chat(300)
    decoy = _chat(2)
    expected = prepare_chat(tok, decode_body(body, LIMITS))

    async def parse(request_id: str, body: bytes = body) -> str:
        request = await parsers.parse(
            path="/v1/chat/completions",
            headers={},
            body=body,
            request_id=request_id,
            subset_ips=None,
            limits=LIMITS,
        )
        assert request.kept_body_key
        return request.kept_body_key

    kept = await parse("kept")
    there = await parsers.prepare_chat(tok, decoy, LIMITS, max_chars=10**9, kept=kept)
    assert there.prompt == expected
    # Taken once: a second render of the same key is given the body it is passed.
    again = await parsers.prepare_chat(tok, decoy, LIMITS, max_chars=10**9, kept=kept)
    assert again.prompt == prepare_chat(tok, decode_body(decoy, LIMITS))
    # Kept few: the oldest of more than KEPT_BODIES parsed chats is gone.
    keys = [await parse(f"k{i}") for i in range(offload.KEPT_BODIES + 1)]
    oldest = await parsers.prepare_chat(tok, decoy, LIMITS, max_chars=10**9, kept=keys[0])
    assert oldest.prompt == prepare_chat(tok, decode_body(decoy, LIMITS))
    newest = await parsers.prepare_chat(tok, decoy, LIMITS, max_chars=10**9, kept=keys[-1])
    assert newest.prompt == expected
    # A body that failed to parse is not kept (its key would be the next one).
    with pytest.raises(errors.BadRequest):
        await parse("bad", b"{" + b" " * 2000)
    unknown = str(int(keys[-1]) + 1)
    bad = await parsers.prepare_chat(tok, decoy, LIMITS, max_chars=10**9, kept=unknown)
    assert bad.prompt == prepare_chat(tok, decode_body(decoy, LIMITS))


async def test_a_kept_chats_long_contents_are_not_decoded_again_for_its_render(parsers: BodyParsers) -> None:
    """The worker keeps what its parse decoded of a chat's long contents with the body, and the
    render skips decoding them (`KnownStrings`): the prompt is the one rendered here."""
    tok = load_shipped()
    body = _chat(3, size=20_000, tools=[{"type": "function", "function": {"name": "f"}}])
    request = await parsers.parse(
        path="/v1/chat/completions", headers={}, body=body, request_id="long", subset_ips=None, limits=LIMITS
    )
    assert request.known_strings is None  # held in the worker, not sent back
    there = await parsers.prepare_chat(tok, _chat(2), LIMITS, max_chars=10**9, kept=request.kept_body_key)
    assert there.prompt == prepare_chat(tok, decode_body(body, LIMITS))


async def test_a_large_body_crosses_as_a_memfd_and_parses_the_same(
    parsers: BodyParsers, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[int] = []
    real = offload._write_memfd

    def counting(body: bytes) -> int:
        written.append(len(body))
        return real(body)

    monkeypatch.setattr(offload, "_write_memfd", counting)
    large = _chat(2500, size=400)  # over SHARE_MIN_BYTES, its text under TEXT_CHARS
    assert len(large) > offload.SHARE_MIN_BYTES
    here = parse_request(path="/v1/chat/completions", headers={}, body=large, request_id="r", limits=LIMITS)
    there = await _parse(parsers, large)
    assert written == [len(large)]
    assert there.body_bytes is large
    assert there == here
    await _parse(parsers, _chat(30))  # small: pickled
    assert written == [len(large)]


async def test_a_bodys_memfd_is_closed_off_the_loop_thread(
    parsers: BodyParsers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last close of a 16 MiB memfd frees its pages (~2 ms of kernel time): a worker thread
    pays it, not the loop every other request waits on; and the memfd is closed, not leaked."""
    memfds: list[int] = []
    closed_in: dict[int, str] = {}
    real_write, real_close = offload._write_memfd, os.close

    def writing(body: bytes) -> int:
        memfds.append(real_write(body))
        return memfds[-1]

    def closing(fd: int) -> None:
        closed_in[fd] = threading.current_thread().name
        real_close(fd)

    monkeypatch.setattr(offload, "_write_memfd", writing)
    monkeypatch.setattr(os, "close", closing)
    before = len(os.listdir("/proc/self/fd"))
    await _parse(parsers, _chat(2500, size=400))
    for _ in range(200):
        if memfds and memfds[0] in closed_in:
            break
        await asyncio.sleep(0.01)
    assert memfds and memfds[0] in closed_in, "the memfd was not closed"
    assert closed_in[memfds[0]] != threading.main_thread().name
    assert len(os.listdir("/proc/self/fd")) <= before


async def test_a_parse_cancelled_while_its_body_is_written_leaks_no_memfd(
    parsers: BodyParsers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client went away (the stream is cancelled) while the body was being written to its
    memfd in a thread: the memfd is closed once written, not left open."""
    started, release, written = threading.Event(), threading.Event(), threading.Event()
    real = offload._write_memfd

    def slow(body: bytes) -> int:
        started.set()
        release.wait(10)
        try:
            return real(body)
        finally:
            written.set()

    monkeypatch.setattr(offload, "_write_memfd", slow)
    before = len(os.listdir("/proc/self/fd"))
    task = asyncio.create_task(_parse(parsers, _chat(2500, size=400)))
    assert await asyncio.to_thread(started.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert await asyncio.to_thread(written.wait, 10)
    for _ in range(200):
        if len(os.listdir("/proc/self/fd")) <= before:
            break
        await asyncio.sleep(0.01)
    assert len(os.listdir("/proc/self/fd")) == before, "a memfd was left open"


async def test_a_worker_that_cannot_read_the_memfd_gets_the_body_pickled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/proc/<epp>/fd unreadable for the worker (here: the "memfd" is /dev/null, so it reads
    nothing): the request is parsed from the pickled body, and later bodies are pickled."""
    parsers = BodyParsers(1, min_bytes=1024)
    try:
        opened: list[int] = []

        def devnull(body: bytes) -> int:
            opened.append(len(body))
            return os.open(os.devnull, os.O_RDONLY)

        monkeypatch.setattr(offload, "_write_memfd", devnull)
        large = _chat(2500, size=400)  # over SHARE_MIN_BYTES, its text under TEXT_CHARS
        here = parse_request(
            path="/v1/chat/completions", headers={}, body=large, request_id="r", limits=LIMITS
        )
        assert await _parse(parsers, large) == here
        assert await _parse(parsers, large) == here
        assert opened == [len(large)]  # tried once, then pickled
    finally:
        parsers.close()


async def test_a_dead_worker_costs_its_request_a_503_and_the_pool_is_replaced() -> None:
    parsers = BodyParsers(1, min_bytes=0)
    try:
        parsers.start()
        await _parse(parsers, _chat(5), LIMITS)  # the worker is up
        (pid,) = [p.pid for p in parsers._pool._processes.values()]  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)
        body = _chat(5)
        with pytest.raises(errors.ServiceUnavailable):
            for _ in range(50):  # the pool notices the death on its next use
                await _parse(parsers, body, LIMITS)
        assert parsers.restarts == 1
        req = await _parse(parsers, body, LIMITS)
        assert req.model == "m"
    finally:
        parsers.close()
    with pytest.raises(errors.ServiceUnavailable, match="shutting down"):
        await _parse(parsers, b"{}", LIMITS)


async def test_the_director_routes_a_large_chat_with_the_token_ids_it_computes_in_process(
    tokenizers: Tokenizers, parsers: BodyParsers, monkeypatch: pytest.MonkeyPatch
) -> None:
    large = _chat(400)  # over min_bytes (1 KiB)
    small = _chat(100, size=2)  # ~3 KB, under the min_bytes set below, but over 64 messages
    for b in (large, small):
        if b is small:
            monkeypatch.setattr(parsers, "min_bytes", 1 << 20)
        plain = director(tokenizers)
        ctx = await plain.route(path="/v1/chat/completions", headers={}, body=b, subset=None)
        offloaded = director(tokenizers)
        offloaded.prompts.body_parsers = parsers
        ctx2 = await offloaded.route(path="/v1/chat/completions", headers={}, body=b, subset=None)
        assert ctx2.request.token_ids == ctx.request.token_ids
        assert ctx2.request.token_ids
        assert ctx2.request.chat_flags == (False, False)
        assert ctx2.body == b
        ctx.finish(complete=True)  # the running-requests gauge is the process's
        ctx2.finish(complete=True)


async def test_two_requests_with_one_x_request_id_each_get_their_own_prompt(
    tokenizers: Tokenizers, parsers: BodyParsers
) -> None:
    """A client's x-request-id is not unique: another client may send the same one at once. The
    body a worker keeps for the render must be this request's, not the last one parsed under
    that id (every request sharing an id got the other's prompt, or a wrong 400)."""
    bodies = [_chat(300, size=40), _chat(200, size=60)]
    expected = []
    for b in bodies:
        ctx = await director(tokenizers).route(path="/v1/chat/completions", headers={}, body=b, subset=None)
        expected.append(ctx.request.token_ids)
        ctx.finish(complete=True)
    offloaded = director(tokenizers)
    offloaded.prompts.body_parsers = parsers
    headers = {"x-request-id": "same"}
    for _ in range(3):
        ctxs = await asyncio.gather(
            *(
                offloaded.route(path="/v1/chat/completions", headers=headers, body=b, subset=None)
                for b in bodies
            )
        )
        assert [c.request.token_ids for c in ctxs] == expected
        assert [c.request.request_id for c in ctxs] == ["same", "same"]
        for c in ctxs:
            c.finish(complete=True)


async def test_a_burst_past_what_the_parsers_can_queue_is_503_at_once(tokenizers: Tokenizers) -> None:
    """An unbounded queue in front of the body parsers made a burst wait for all of it; past
    --body-parser-processes x JOBS_PER_PROCESS jobs a request is answered 503 with the reason."""
    parsers = BodyParsers(1, min_bytes=0)
    try:
        parsers.start()
        d = director(tokenizers)
        d.prompts.body_parsers = parsers
        body = _chat(100)
        results = await asyncio.gather(
            *(d.route(path="/v1/chat/completions", headers={}, body=body, subset=None) for _ in range(120)),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, errors.ServiceUnavailable)]
        routed = [r for r in results if not isinstance(r, BaseException)]
        assert len(refused) + len(routed) == len(results), [r for r in results if isinstance(r, Exception)]
        assert refused and routed
        assert all("body parsers" in r.reason for r in refused)
        for ctx in routed:
            ctx.finish(complete=True)
    finally:
        parsers.close()


def test_kept_chats_count_the_strings_their_parse_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept chat holds its body and its long contents decoded (up to 4 bytes a character): the
    bound on what a parser process keeps counts both."""
    monkeypatch.setattr(offload, "_KEPT", collections.OrderedDict())
    monkeypatch.setattr(offload, "KEPT_BYTES", 1 << 20)
    for key in ("a", "b"):
        body = b'{"messages": [{"role": "user", "content": "..."}]}'
        offload._keep(key, body, KnownStrings(body, ((0, 40, 45, "é" * 600_000),)))
    assert list(offload._KEPT) == ["b"]  # 2 x ~600 KB of strings: the oldest goes
