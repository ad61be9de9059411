"""Large request bodies parsed in other processes, so one client's body never holds the loop.

msgspec decodes a body in one C call that holds the GIL throughout (~10 ms for 16 MiB here), and
rendering a 10,000-message chat is ~60 ms of Python. In a thread either one still takes the GIL
from the event loop, a switch interval (5 ms) or a whole decode at a time: with eight clients
sending 16 MiB chat bodies, other requests' routing p99 went from 3 ms to ~500 ms (issue 19,
`tests/api/bench_big_bodies.py`). Here a body over `min_bytes` is parsed by a small pool of
worker processes instead, in up to three steps:

1. `parse`: the request's fields (`epp.api.requests.parse_request`: limits, model, prompt texts);
   its target model, and so the chat template, is known only after this step;
2. `prepare_chat`: a chat body decoded whole, depth-checked and rendered with the template of the
   model it is routed to (`epp.tokenize.chat.prepare_chat`); also for a small body whose chat has
   more messages than the loop renders inline.
3. `with_model`: the body re-encoded with another top-level "model", for an InferenceModelRewrite
   decided after step 1 (a rewrite header's is done within step 1).

A large body crosses without being pickled: the parent writes it to a memfd in a worker thread
(`os.write` releases the GIL; pickling copied it with the GIL held, 2-5 ms per 16 MiB, in the
executor's feeder thread, and the loop waited for that thread) and the worker reads it through
/proc/<parent>/fd. Where that cannot work (no memfd; /proc not readable) bodies are pickled.

A chat body crosses once: the worker that parsed it keeps it (a few, under a key epp makes for
each parse: never the client's x-request-id, which another client may send too) for the render
that follows, so the 16 MiB pickle, pipe write and decode are not paid twice; a render
that lands on another worker, or after the body was dropped, is sent the body again.

What crosses back is small: the parsed request without its body (the director keeps its own
copy) and with its prompt texts cut at TEXT_CHARS, and the rendered prompt cut just past what the
tokenizer reads (`Tokenizers.max_chars`). Tokenizing stays in the parent, where the prefix cache
lives; `tokenizers` releases the GIL while it encodes.

The workers run at a lower CPU priority (nice +10): when a core is contended the loop that routes
everyone wins over the bodies of a few. A worker that dies (an out-of-memory kill) fails the
requests it held with 503 and the pool is replaced. Token-id prompts (`"prompt": [ids]`) still
cost the parent their unpickling, as they cost it their decode before.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from epp.api import errors
from epp.api.limits import KnownStrings, RequestLimits, decode_body
from epp.api.requests import Api, InferenceRequest, parse_request, with_model
from epp.api.routes import Route
from epp.observability import metrics
from epp.tokenize.chat import ChatPrompt, ChatTemplated, add_special_tokens, forwards_ids, prepare_chat

log = logging.getLogger("epp.offload")

DEFAULT_MIN_BYTES = 256 << 10  # ~0.3 ms to decode on the loop: less than the round trip costs it
# Prompt texts kept on an offloaded request: what the text prefix scorer, the popularity plugin
# and the tokenizer (`Tokenizers.max_chars`, 400,000 by default) read is far less.
TEXT_CHARS = 1 << 20
NICE = 10


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedChat:
    """A chat body rendered in a worker: the prompt, and the body's facts the director reads."""

    prompt: ChatPrompt
    forwards_ids: bool
    add_special_tokens: bool


class BodyParsers:
    """A pool of `processes` worker processes for bodies over `min_bytes` (see the module doc)."""

    def __init__(self, processes: int = 1, *, min_bytes: int = DEFAULT_MIN_BYTES) -> None:
        if processes < 1:
            raise ValueError("processes must be at least 1")
        self.processes = processes
        self.min_bytes = min_bytes
        self.restarts = 0  # pools replaced after a worker died
        self._pool = self._new_pool()
        self._closed = False
        self._memfd = hasattr(os, "memfd_create")  # large bodies cross as memfds (see above)
        self._keys = itertools.count()
        self._jobs = 0  # submitted to the pool and not finished

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        # spawn, never fork: the parent runs gRPC's and the tokenizers' threads.
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=self.processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_child_init,
        )

    def start(self) -> None:
        """Start every worker now, not on the first large body (a spawned worker takes ~1 s to
        import); the caller does not wait for them, and a body that comes first waits for one."""
        for _ in range(self.processes):
            self._pool.submit(os.getpid)

    def wants(self, body_size: int) -> bool:
        return body_size > self.min_bytes

    async def parse(
        self,
        *,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        request_id: str,
        subset_ips: frozenset[str] | None,
        limits: RequestLimits,
        route: Route | None = None,
    ) -> InferenceRequest:
        """`parse_request` (as `parse_here`) in a worker. Raises `errors.BadRequest` as it does,
        and `errors.ServiceUnavailable` if the worker died."""
        key = str(next(self._keys))  # unique per parse, for the render (`kept`)
        args: dict[str, Any] = {"path": path, "headers": dict(headers), "body": body, "keep_as": key}
        args.update(request_id=request_id, subset_ips=subset_ips, limits=limits, route=route)
        request: InferenceRequest
        rewritten: bool
        shared = await self._share(body)
        if shared is None:
            request, rewritten = await self._run(_parse_job, args)
        else:
            try:
                request, rewritten = await self._run(_parse_job, {**args, "body": shared})
            except _Unshared as exc:  # the worker could not open it: pickled from now on
                log.warning("body parsers cannot read epp's memfds (%s); bodies are pickled", exc)
                self._memfd = False
                request, rewritten = await self._run(_parse_job, args)
            finally:
                _close_soon(shared.fd)
        if not rewritten:
            request.body_bytes = body
        if request.api is Api.CHAT:
            request.kept_body_key = key
        return request

    async def with_model(self, body: bytes, target: str) -> bytes:
        """`body` with its top-level "model" set to `target` (`epp.api.requests.with_model`, the
        InferenceModelRewrite of a large body), in a worker. Raises `errors.ServiceUnavailable` if
        the worker died."""
        shared = await self._share(body)
        if shared is not None:
            try:
                rewritten: bytes = await self._run(_model_job, shared, target)
                return rewritten
            except _Unshared as exc:
                log.warning("body parsers cannot read epp's memfds (%s); bodies are pickled", exc)
                self._memfd = False
            finally:
                _close_soon(shared.fd)
        pickled: bytes = await self._run(_model_job, body, target)
        return pickled

    async def _share(self, body: bytes) -> SharedBody | None:
        """`body` in a memfd the workers can open, or None (small, or memfds unavailable)."""
        if not self._memfd or len(body) < SHARE_MIN_BYTES:
            return None
        written = asyncio.get_running_loop().run_in_executor(None, _write_memfd, body)
        try:
            fd = await asyncio.shield(written)
        except asyncio.CancelledError:  # the stream went away: the memfd is closed when written
            written.add_done_callback(_close_written)
            raise
        except OSError as exc:
            log.warning("cannot write a request body to a memfd (%s); bodies are pickled", exc)
            self._memfd = False
            return None
        return SharedBody(os.getpid(), fd, len(body))

    async def prepare_chat(
        self,
        template: ChatTemplated,
        body: bytes,
        limits: RequestLimits,
        max_chars: int,
        *,
        kept: str | None = None,
    ) -> PreparedChat:
        """The chat `body` decoded (limits checked) and rendered with `template` in a worker; the
        text cut after `max_chars` + 1 characters. With `kept`, the `kept_body_key` `parse` set on
        the request, the body the parsing worker kept is used when this lands on it. Raises
        `errors.BadRequest`,
        the template's `ChatTemplateError` / `UnsupportedChat`, and `errors.ServiceUnavailable`
        if the worker died."""
        source = ChatTemplateSource(template.name, template.chat_template, dict(template.special_tokens))
        if kept is not None:
            rendered: PreparedChat | None = await self._run(_chat_job, source, None, limits, max_chars, kept)
            if rendered is not None:
                return rendered
        prepared: PreparedChat = await self._run(_chat_job, source, body, limits, max_chars)
        return prepared

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._closed:
            raise errors.ServiceUnavailable("epp is shutting down")
        if self._jobs >= self.processes * JOBS_PER_PROCESS:
            # Overload: answered now, with the reason, rather than queued behind everything.
            metrics.body_parsers_saturated.inc()
            raise errors.ServiceUnavailable(
                f"epp's body parsers have {self._jobs} requests queued (--body-parser-processes): retry"
            )
        pool = self._pool
        self._jobs += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenProcessPool:
            self._replace(pool)
            raise errors.ServiceUnavailable("the process parsing this request's body exited") from None
        finally:
            self._jobs -= 1

    def _replace(self, broken: concurrent.futures.ProcessPoolExecutor) -> None:
        if self._pool is not broken or self._closed:
            return  # another request replaced it already
        self.restarts += 1
        metrics.body_parser_restarts.inc()
        log.warning("a body parser process exited; starting a new pool (restart %d)", self.restarts)
        broken.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()

    def close(self) -> None:
        """Stop the workers; requests still waiting on one get 503."""
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)


# Jobs a body-parser process may have queued or running: ~0.2-1 s of parsing and rendering at
# the sizes that come here; past it a request is answered 503 at once.
JOBS_PER_PROCESS = 32

SHARE_MIN_BYTES = 1 << 20  # smaller bodies are pickled: a memfd's system calls cost more


@dataclasses.dataclass(frozen=True, slots=True)
class SharedBody:
    """A body in the parent's memfd `fd` (of `size` bytes), open until the job returns."""

    pid: int
    fd: int
    size: int

    def read(self) -> bytes:
        try:
            fd = os.open(f"/proc/{self.pid}/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _Unshared(str(exc)) from None
        try:
            parts = []
            got = 0
            while got < self.size:
                part = os.pread(fd, self.size - got, got)
                if not part:
                    raise _Unshared(f"the body ended at {got} of {self.size} bytes")
                parts.append(part)
                got += len(part)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            os.close(fd)


class _Unshared(Exception):
    """A worker could not read a SharedBody."""


def _close_written(written: asyncio.Future[int]) -> None:
    if not written.cancelled() and written.exception() is None:
        _close_soon(written.result())


def _close_soon(fd: int) -> None:
    """Close a body's memfd in a worker thread. The last close frees the memfd's pages: 2.2 ms
    of kernel time per 16 MiB here, which the loop would spend with every other request waiting
    (os.close releases the GIL, so in a thread it costs the loop nothing)."""
    try:
        closing = asyncio.get_running_loop().run_in_executor(None, os.close, fd)
    except RuntimeError:  # no running loop, or its executor already shut down
        os.close(fd)
        return
    closing.add_done_callback(_closed)


def _closed(closing: asyncio.Future[None]) -> None:
    if not closing.cancelled() and (exc := closing.exception()) is not None:
        log.warning("closing a request body's memfd failed: %s", exc)


def _write_memfd(body: bytes) -> int:
    fd = os.memfd_create("epp-request-body", os.MFD_CLOEXEC)
    try:
        view = memoryview(body)
        while view:  # the GIL released in each call; tmpfs takes it whole at once
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclasses.dataclass(frozen=True, slots=True)
class ChatTemplateSource:
    """What rendering reads of a tokenizer (`epp.tokenize.chat.ChatTemplated`), picklable."""

    name: str
    chat_template: str | None
    special_tokens: Mapping[str, str | list[str]]


# --- In the worker processes ---------------------------------------------------------------------


def _child_init() -> None:
    with contextlib.suppress(OSError):
        os.nice(NICE)
    # Ctrl-C reaches the whole process group: the parent shuts the pool down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: a parent killed outright (SIGKILL, OOM) must not leave workers behind."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the call queue's EOF ends the worker anyway
        pass


async def parse_here(
    *,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    request_id: str,
    subset_ips: frozenset[str] | None,
    limits: RequestLimits,
    route: Route | None = None,
) -> InferenceRequest:
    """`parse_request` on the caller's loop: `BodyParsers.parse`'s twin for small bodies."""
    return parse_request(
        path=path,
        headers=headers,
        body=body,
        request_id=request_id,
        subset_ips=subset_ips,
        limits=limits,
        route=route,
    )


# Chat bodies this worker parsed, by the parent's key for the parse, for the render that follows
# (`_chat_job`), with the long contents the parse decoded (`KnownStrings`: the render skips them)
# and the bytes both hold (a decoded string takes 1-4 bytes a character: counted as held).
_KEPT: collections.OrderedDict[str, tuple[bytes, KnownStrings | None, int]] = collections.OrderedDict()
KEPT_BODIES = 4  # two large-body lanes by default: room for both, and for a request or two that
KEPT_BYTES = 64 << 20  # ended before its render (those are dropped oldest first)


def _keep(key: str, body: bytes, known: KnownStrings | None) -> None:
    held = len(body) + (sum(sys.getsizeof(text) for *_, text in known.spans) if known is not None else 0)
    _KEPT[key] = (body, known, held)
    while len(_KEPT) > KEPT_BODIES or sum(kept[2] for kept in _KEPT.values()) > KEPT_BYTES:
        _KEPT.popitem(last=False)


def _parse_job(args: dict[str, Any]) -> tuple[InferenceRequest, bool]:
    if isinstance(args["body"], SharedBody):
        args = {**args, "body": args["body"].read()}
    key = args.pop("keep_as")
    body = args["body"]
    request = parse_request(**args)
    if request.api is Api.CHAT:
        _keep(key, request.body_bytes, request.known_strings)  # the rewritten body, if it was
    request.known_strings = None  # the body and its texts stay here
    rewritten = request.body_bytes is not body
    if not rewritten:
        request.body_bytes = b""  # the parent has it
    request.prompt_texts = _cut_texts(request.prompt_texts, TEXT_CHARS)
    return request, rewritten


def _model_job(body: bytes | SharedBody, target: str) -> bytes:
    return with_model(body.read() if isinstance(body, SharedBody) else body, target)


def _cut_texts(texts: list[str], limit: int) -> list[str]:
    """The texts up to `limit` characters in all (the last one cut)."""
    out: list[str] = []
    n = 0
    for text in texts:
        if n + len(text) >= limit:
            out.append(text[: limit - n])
            break
        out.append(text)
        n += len(text)
    return out


def _chat_job(
    source: ChatTemplateSource,
    body: bytes | None,
    limits: RequestLimits,
    max_chars: int,
    kept: str | None = None,
) -> PreparedChat | None:
    """The chat rendered; `body` None: the one kept under `kept`, or None if not kept here."""
    known = None
    if body is None:
        held = _KEPT.pop(kept, None) if kept is not None else None
        if held is None:
            return None
        body, known, _ = held
    decoded = decode_body(body, limits, known)
    prompt = prepare_chat(source, decoded)
    if len(prompt.text) > max_chars + 1:
        prompt = dataclasses.replace(prompt, text=prompt.text[: max_chars + 1])
    return PreparedChat(prompt, forwards_ids(decoded), add_special_tokens(decoded))
