"""The per-stream state machine of the EPP ext-proc protocol.

One gRPC stream carries one HTTP request. Supported body modes (from Envoy's protocol_config,
sent on the first message; FULL_DUPLEX_STREAMED is assumed when a proxy does not send it):

FULL_DUPLEX_STREAMED (GIE's mode)              BUFFERED
  request_headers      -> (nothing yet)          request_headers    -> continue (off-sample, with
                                                                       --response-sample-headers=
                                                                       sampled: and skip the response)
  request_body* (eos)  -> route, then:           request_body       -> route: header mutation +
                          headers response +                           metadata on the body answer
                          body in <=62000 B chunks
  response_headers     -> headers response (content-length dropped if the model name is rewritten);
                          off-sample (`RequestContext.sampled`), where Envoy allows it: a
                          mode_override that stops the response body (see `_can_skip_body`)
  response_body*       -> each chunk echoed at once (duplex) or continued/replaced (other modes)

A header-only request (request_headers with end_of_stream) is routed at once. Errors become an
ImmediateResponse with the HTTP status and an OpenAI-style JSON error body, and end the stream.
Whatever ends the stream, `close()` releases the request's booking exactly once.

Flow control (epp.flowcontrol) may hold a request: the routing answer is then simply not sent
yet. In the modes where Envoy's `message_timeout` applies (all but FULL_DUPLEX_STREAMED), the
stream first tells Envoy to wait up to the longest hold (`override_message_timeout`; the
gateway's `max_message_timeout` must allow it, as `epp envoy-config` sets it).

Flow control's eviction (`enableEviction`) may cut a routed sheddable request while its response
flows: the stream then answers 429 `x-llm-d-request-dropped-reason: evicted` at once, whatever
message it was waiting for (the server reads with `read_or_evicted`), and ends. A response whose
body skips epp (off-sample, mode override) cannot be cut: Envoy no longer expects an answer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from epp import clock
from epp.api import errors
from epp.extproc import _join
from epp.extproc import messages as m
from epp.extproc.limits import StreamGuard
from epp.flowcontrol.outcomes import evicted_error
from epp.observability import metrics
from epp.observability.logs import Throttle
from epp.requestcontrol.context import RequestContext
from epp.requestcontrol.director import Director

log = logging.getLogger("epp.extproc")

_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
_BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
_NONE = processing_mode_pb2.ProcessingMode.NONE

# A body chunk larger than this cost the loop a few ms to read and copy: the stream yields once.
_YIELD_AFTER_BYTES = 1 << 20
_JOIN_IN_THREAD_BYTES = 1 << 20  # a smaller body's copy costs less than the thread's hop

EVICTED = object()  # what `read_or_evicted` returns for a cut request

# A held request asks Envoy to wait for its answer this much past flow control's longest hold
# (its own answer comes at the hold's end).
HOLD_MARGIN = 5.0
HOLD_LONGEST = 3600.0  # Envoy's largest max_message_timeout: a longer or unlimited hold asks this

# A stream holding a large-body lane whose next body message has not come for this long gives
# the lane back (`Stream.read_body`).
LANE_IDLE_S = 1.0

# While a limit of epp.extproc.limits holds, every request is answered 503: one warning per 5 s
# per limit (with the count it swallowed) rather than one per request. Per process.
OVER_LIMIT_LOGS = {
    "streams": Throttle(5.0),
    "bytes": Throttle(5.0),
    "connection": Throttle(5.0),
    "bug": Throttle(10.0),
}


class Stream:
    """State of one ext-proc stream. `handle()` returns the responses to send, in order."""

    __slots__ = (
        "_admitted",
        "_body_open",
        "_body_parts",
        "_body_size",
        "_connection",
        "_director",
        "_guard",
        "_lane",
        "_paced",
        "_received",
        "_request_mode",
        "_reserved",
        "_response_mode",
        "_skip_response",
        "_started",
        "_write",
        "closed",
        "ctx",
        "evicted",
        "headers",
        "response_complete",
        "response_started",
    )

    def __init__(
        self,
        director: Director,
        guard: StreamGuard | None = None,
        write: Callable[[m.ProcessingResponse], Awaitable[None]] | None = None,
    ) -> None:
        self._director = director
        self._write = write  # sends a message out of turn (the hold's timeout override)
        self._guard = guard  # epp.extproc.limits: shared bounds on streams and buffered bytes
        self._admitted = False
        self._connection: float | None = None  # the client connection, when the gateway names it
        self._body_open = False  # counted among its connection's unfinished bodies
        self._reserved = 0
        self._lane = False  # holds one of the guard's large-body lanes
        self._paced = False  # a large body: its lane taken once, each later chunk waits for the rate
        self._started = 0.0
        self._received = 0.0  # epp.clock time of the request headers (llm-d's series start there)
        self._request_mode = _FULL_DUPLEX
        self._response_mode = _FULL_DUPLEX
        self._skip_response = False  # off-sample from the request headers on (no response messages)
        self._body_parts: list[bytes | memoryview] = []
        self._body_size = 0
        self.headers: dict[str, str] = {}
        self.ctx: RequestContext | None = None
        self.evicted: asyncio.Future[None] | None = None  # set: flow control cut the request
        self.closed = False  # an immediate response was sent: nothing more to do
        self.response_complete = False
        self.response_started = False  # response headers seen

    async def handle(self, msg: m.ProcessingRequest) -> Iterable[m.ProcessingResponse]:
        kind = msg.WhichOneof("request")
        if kind == "request_headers":
            if msg.HasField("protocol_config"):
                self._request_mode = msg.protocol_config.request_body_mode
                self._response_mode = msg.protocol_config.response_body_mode
            return await self._on_request_headers(msg)
        if kind == "request_body":
            return await self.request_body(msg, msg.request_body.body)
        if kind == "response_headers":
            return self._on_response_headers(msg)
        if kind == "response_body":
            # One way to answer them: `response_body`, already serialized, as the server writes it.
            raise ValueError("response bodies are answered by Stream.response_body, not Stream.handle")
        if kind == "request_trailers":
            return await self._on_request_trailers(msg)
        if kind == "response_trailers":
            self.response_complete = True
            return [m.CONTINUE_RESPONSE_TRAILERS]
        # An empty or unknown message: nothing to answer; Envoy never sends one.
        metrics.extproc_stream_errors.labels("protocol").inc()
        return []

    async def _on_request_headers(self, msg: m.ProcessingRequest) -> Iterable[m.ProcessingResponse]:
        self._received = clock.now()
        self.headers = m.header_map(msg.request_headers)
        guard = self._guard
        if guard is not None:
            self._started = asyncio.get_running_loop().time()
            if not guard.admit():
                return self._fail(
                    errors.ServiceUnavailable(
                        "epp is at its limit of concurrent requests (--max-concurrent-streams)"
                    ),
                    throttle=OVER_LIMIT_LOGS["streams"],
                )
            self._admitted = True
            # A declared size takes no lane (lanes go to bytes that arrive: a stalled upload that
            # declared 2 MiB held one for the whole body timeout); one over the limit is refused
            # before any byte is sent.
            limit = self._director.settings.max_body_bytes
            if _content_length(self.headers) > limit:
                return self._fail(errors.PayloadTooLarge(f"request body exceeds the limit of {limit} bytes"))
            connection = m.connection_id(msg)
            if (
                connection is not None
                and not msg.request_headers.end_of_stream
                and self._request_mode == _FULL_DUPLEX
            ):
                # The body streams into epp as it arrives: one client connection may hold only
                # so many unfinished bodies (in BUFFERED mode Envoy holds them).
                if not guard.open_body(connection):
                    return self._fail(
                        errors.NoCapacity(
                            "too many request bodies still arriving on this client connection "
                            f"({guard.limits.max_unfinished_bodies_per_connection})"
                        ),
                        throttle=OVER_LIMIT_LOGS["connection"],
                    )
                self._connection, self._body_open = connection, True
        if msg.request_headers.end_of_stream:
            return await self._route(msg, body=None, reply="headers")
        if self._request_mode == _FULL_DUPLEX:
            return []  # deferred until the body is complete
        if self._request_mode == _BUFFERED:
            if self._can_skip_body() and self._director.skips_response(self.headers):
                self._skip_response = True  # one ext-proc round trip less (off-sample)
                return [m.request_headers_skip_response(self._request_mode)]
            return [m.CONTINUE_REQUEST_HEADERS]
        # STREAMED / BUFFERED_PARTIAL: headers must be answered before any body arrives, so the
        # body cannot inform the decision. Route on headers alone rather than fail the request.
        return await self._route(msg, body=None, reply="headers")

    async def request_body(
        self, msg: m.ProcessingRequest, chunk: bytes | memoryview
    ) -> Iterable[m.ProcessingResponse]:
        """A request-body message; `chunk` is its body, read from `msg` or, for a large one, a
        view of the bytes gRPC delivered (`epp.extproc.wire`: `msg` then has an empty body)."""
        if len(chunk) > _YIELD_AFTER_BYTES:
            await asyncio.sleep(0)  # let other streams run between the copies and the parse
        if self.ctx is not None:  # routed already (non-buffering modes): pass through
            if self._request_mode == _FULL_DUPLEX:
                return m.streamed_request_body_wire(chunk) if msg.request_body.end_of_stream else []
            return [m.CONTINUE_REQUEST_BODY]
        self._body_size += len(chunk)
        limit = self._director.settings.max_body_bytes
        if self._body_size > limit:
            return self._fail(errors.PayloadTooLarge(f"request body exceeds the limit of {limit} bytes"))
        if chunk:
            guard = self._guard
            if guard is not None:
                if not self._lane and guard.is_large(self._body_size):
                    # A large body (by the bytes arrived) takes a lane, and the rate for what
                    # arrived; or again after it gave its lane back (`read_body`), for this chunk.
                    size = len(chunk) if self._paced else self._body_size
                    self._paced = True
                    if not await self._take_lane(size):
                        return self.timed_out(paced=True)
                elif self._paced and not await guard.pace(self._started, len(chunk)):
                    return self.timed_out(paced=True)
                refused = guard.reserve(len(chunk), self._connection)
                if refused == "bytes":
                    return self._fail(
                        errors.ServiceUnavailable(
                            "epp is buffering its limit of request-body bytes (--max-buffered-body-bytes)"
                        ),
                        throttle=OVER_LIMIT_LOGS["bytes"],
                    )
                if refused is not None:
                    return self._fail(
                        errors.NoCapacity(
                            "the request bodies arriving on this client connection hold "
                            "epp's limit of bytes (--max-buffered-body-bytes-per-connection)"
                        ),
                        throttle=OVER_LIMIT_LOGS["connection"],
                    )
                self._reserved += len(chunk)
            self._body_parts.append(chunk)
        # BUFFERED: Envoy sends the body once, whole; with end_of_stream false when the request
        # has trailers, which the generated config does not send (waiting cost a 504).
        if not msg.request_body.end_of_stream and self._request_mode != _BUFFERED:
            return []
        return await self._route(msg, body=await self._take_body(), reply=self._reply_kind())

    async def _on_request_trailers(self, msg: m.ProcessingRequest) -> Iterable[m.ProcessingResponse]:
        # Trailers end the request body when the client sent them.
        if self.ctx is None and not self.closed:
            body = await self._take_body()
            out = await self._route(msg, body=body, reply=self._reply_kind(), body_eos=False)
            return itertools.chain(out, (m.CONTINUE_REQUEST_TRAILERS,)) if not self.closed else out
        return [m.CONTINUE_REQUEST_TRAILERS]

    def _reply_kind(self) -> str:
        return "duplex" if self._request_mode == _FULL_DUPLEX else "buffered"

    async def _take_body(self) -> bytes:
        """The body, whole: the one copy of it epp makes (views become bytes here)."""
        parts = self._body_parts
        self._body_parts = []
        if len(parts) == 1 and type(parts[0]) is bytes:
            return parts[0]
        if self._body_size >= _JOIN_IN_THREAD_BYTES:
            # b"".join of a 16 MiB body held the loop 3 ms (its pages mapped) to 11 ms (fresh
            # ones); _join copies without the GIL, so in a worker thread the loop loses nothing.
            return await asyncio.to_thread(_join.join, parts)
        return b"".join(parts)

    async def _route(
        self, msg: m.ProcessingRequest, *, body: bytes | None, reply: str, body_eos: bool = True
    ) -> Iterable[m.ProcessingResponse]:
        t0 = time.perf_counter()
        try:
            ctx = await self._director.route(
                path=self.headers.get(":path", "/"),
                headers=self.headers,
                body=body,
                subset=m.subset_hint(msg),
                on_hold=self._on_hold,
                received_at=self._received or None,
                response_skipped=self._skip_response,
            )
        except errors.RequestError as exc:
            return self._fail(exc, counted=True)  # the director counted it, with the model
        except Exception:
            # An epp bug that a client's request may trigger at will: counted, one line per 10 s.
            OVER_LIMIT_LOGS["bug"].log(log, logging.ERROR, "routing failed unexpectedly", exc_info=True)
            metrics.extproc_stream_errors.labels("internal").inc()
            return self._fail(errors.RequestError("internal error while routing the request"))
        self.ctx = ctx
        if ctx.inflight is not None:  # flow control may cut it (enableEviction)
            self.evicted = asyncio.get_running_loop().create_future()
            ctx.evict_hook = self._evict
        dest = ctx.destination
        metrics.decision_duration.observe(time.perf_counter() - t0)
        # The P/D stage headers (x-prefiller-host-port, ...) epp sets, and the ones a client sent
        # that epp did not: a decode pod's sidecar would prefill wherever they point.
        stage_headers, remove = ctx.headers, ctx.remove_headers
        scores = ctx.endpoint_scores()  # None unless --emit-endpoint-scores
        if reply == "headers":
            return [m.routed_headers(dest, stage_headers, remove=remove, scores=scores)]
        out_body = ctx.body
        extra = {**stage_headers, "content-length": str(len(out_body))}
        if reply == "buffered":
            replaced = out_body if out_body is not body else None
            return [m.routed_body_buffered(dest, extra, replaced, remove=remove, scores=scores)]
        # The body's chunks are serialized as they are written (a generator): not one long step.
        return itertools.chain(
            (m.routed_headers(dest, extra, remove=remove, scores=scores),),
            m.streamed_request_body_wire(out_body, body_eos),
        )

    def _evict(self) -> bool:
        ctx, evicted = self.ctx, self.evicted
        if ctx is None or evicted is None or evicted.done() or self.closed or self.response_complete:
            return False
        if ctx.response_skipped:
            return False  # the body skips epp: Envoy expects no answer it could act on
        evicted.set_result(None)
        return True

    async def read_or_evicted(self, read: Any) -> Any:
        """`read()`, or EVICTED as soon as flow control cuts the request (`evicted_answer`)."""
        assert self.evicted is not None
        if self.evicted.done():
            return EVICTED
        reading = asyncio.ensure_future(read())
        await asyncio.wait((reading, self.evicted), return_when=asyncio.FIRST_COMPLETED)
        if reading.done():
            return reading.result()
        # The stream ends right after the answer: the read is left to end with it.
        reading.add_done_callback(lambda t: t.cancelled() or t.exception())
        return EVICTED

    def evicted_answer(self) -> Iterable[m.ProcessingResponse]:
        """The answer to a cut request: 429 with the reason, and the stream ends."""
        return self._fail(evicted_error())

    async def _on_hold(self, max_wait: float) -> None:
        """Flow control holds the request: make Envoy wait for the answer (see the module doc)."""
        if self._write is not None and self._request_mode != _FULL_DUPLEX:
            await self._write(
                m.override_message_timeout(min((max_wait or HOLD_LONGEST) + HOLD_MARGIN, HOLD_LONGEST))
            )

    def _fail(
        self, exc: errors.RequestError, *, counted: bool = False, throttle: Throttle | None = None
    ) -> Iterable[m.ProcessingResponse]:
        self.closed = True
        extra = {"path": self.headers.get(":path")}
        if throttle is not None:
            throttle.log(log, logging.WARNING, "answering %d: %s", exc.status, exc.reason, extra=extra)
        elif exc.status >= 500:
            log.warning("answering %d: %s", exc.status, exc.reason, extra=extra)
        else:
            log.info("answering %d: %s", exc.status, exc.reason, extra=extra)
        if not counted:  # answered before (or instead of) parsing: no trustworthy model name
            self._director.accounting.error_before_parse(exc.status, self.headers)
        return [m.immediate(exc.status, exc.body(), headers=exc.headers)]

    def _on_response_headers(self, msg: m.ProcessingRequest) -> Iterable[m.ProcessingResponse]:
        self.response_started = True
        ctx = self.ctx
        if ctx is None:
            return [m.CONTINUE_RESPONSE_HEADERS]
        headers = m.header_map(msg.response_headers)
        added = ctx.on_response_headers(headers, m.metadata_string(msg, m.LB_NAMESPACE, m.SERVED_KEY))
        if msg.response_headers.end_of_stream:
            self.response_complete = True
        if not ctx.sampled and not self.response_complete and self._can_skip_body():
            # Off-sample: the body need not pass through epp. The booking is still released
            # when Envoy ends this stream, which it does at the end of the HTTP stream.
            ctx.response_skipped = True
            return [m.response_headers_skip_body(self._request_mode, add=added)]
        # A rewritten model name changes the body length: let Envoy re-frame the response.
        if ctx.rewrites_response and "content-length" in headers:
            return [m.response_headers(remove=("content-length",), add=added)]
        return [m.response_headers(add=added)]

    def _can_skip_body(self) -> bool:
        """Whether a mode override can stop the response body here: Envoy 1.40 ignores the
        override whenever either body mode is FULL_DUPLEX_STREAMED (GIE's standard config, and
        what is assumed when Envoy sends no protocol_config), so it is not even sent then."""
        return self._request_mode != _FULL_DUPLEX and self._response_mode not in (_FULL_DUPLEX, _NONE)

    def response_body(self, msg: m.ProcessingRequest) -> list[bytes]:
        """The answers to one response-body message, serialized. The server calls this directly
        for every streamed chunk (one per token): no coroutine and no message objects on the path
        that runs most often."""
        started = time.perf_counter()
        body = msg.response_body
        chunk = body.body
        eos = body.end_of_stream
        ctx = self.ctx
        out = ctx.on_response_body(chunk, eos) if ctx is not None else chunk
        if eos:
            self.response_complete = True
        if self._response_mode == _FULL_DUPLEX:
            answer = m.streamed_response_body_wire(out, eos)
        else:
            answer = [m.replaced_response_body(out if out is not chunk else None).SerializeToString()]
        if ctx is not None:  # llm-d's response processing time: epp's own time on the chunks
            ctx.response_time += time.perf_counter() - started
        return answer

    @property
    def abandoned(self) -> bool:
        """The stream ended with work in progress: the request not yet answered (the client left
        while epp was deciding), or the response cut between its headers and its end. Not
        abandoned: a stream Envoy resets after the response's end (it ends every stream so), or
        after the decision when responses are not sent to epp (or not yet started)."""
        if self.ctx is None:
            return bool(self.headers) and not self.closed
        if self.ctx.response_skipped:
            return False  # its end looks the same as a reset: not counted either way
        return self.response_started and not self.response_complete

    @property
    def awaiting_body(self) -> bool:
        """Request headers seen, body still arriving, under a body deadline (`read_body`)."""
        return self._admitted and self.ctx is None and not self.closed

    async def read_body(self, read: Any) -> Any:
        """`read()`, or None once the request-body deadline has passed (then `timed_out`). A
        stream holding a large-body lane that waits more than LANE_IDLE_S for its next message
        gives the lane back (a stalled upload must not keep others waiting) and takes one again
        when the message comes (`request_body`)."""
        guard = self._guard
        assert guard is not None
        if not self._lane:
            return await guard.read_body(read, self._started)
        reading = asyncio.ensure_future(read())
        done, _ = await asyncio.wait((reading,), timeout=LANE_IDLE_S)
        if not done:
            self._give_lane()
            metrics.large_body_lanes_yielded.inc()
            return await guard.read_body(lambda: reading, self._started)
        return reading.result()

    def timed_out(self, *, paced: bool = False) -> Iterable[m.ProcessingResponse]:
        """408 at the body deadline; `paced`: the body was waiting for a large-body lane or rate."""
        assert self._guard is not None
        seconds = self._guard.limits.request_body_timeout
        why = (
            "a large request body waited for its turn (--max-concurrent-large-bodies, --large-body-rate) past"
            if paced
            else "the request body did not arrive within"
        )
        return self._fail(errors.RequestTimeout(f"{why} {seconds:g} s (--request-body-timeout)"))

    async def _take_lane(self, size: int) -> bool:
        guard = self._guard
        assert guard is not None
        if self._write is not None and self._request_mode != _FULL_DUPLEX and not guard.lane_free():
            # Envoy applies message_timeout (5 s) to the body it sent: tell it to wait, or a body
            # queued behind others' gets 504.
            left = self._started + guard.limits.request_body_timeout - asyncio.get_running_loop().time()
            await self._write(m.override_message_timeout(min(max(left, 0.0) + HOLD_MARGIN, HOLD_LONGEST)))
        self._lane = await guard.take_lane(self._started, size)
        return self._lane

    def _give_lane(self) -> None:
        if self._lane:
            self._lane = False
            assert self._guard is not None
            self._guard.give_lane()

    def answered(self) -> None:
        """The server has written the answers to a message. Once the routing answer is out the
        body is the gateway's to forward: epp drops its copy and gives the bytes back to
        `--max-buffered-body-bytes`, which then bounds bodies being buffered, not the prompts
        of responses in flight."""
        if self.ctx is not None or self.closed:
            self._give_lane()  # the routing answer (and the body sent back with it) is written
        if self.ctx is not None:
            if self._reserved:
                self.ctx.body_forwarded()
                assert self._guard is not None
                self._guard.release(self._reserved, self._connection)
                self._reserved = 0
            self._close_body()

    def _close_body(self) -> None:
        if self._body_open:
            self._body_open = False
            assert self._guard is not None and self._connection is not None
            self._guard.close_body(self._connection)

    def close(self) -> None:
        """The gRPC stream ended, however it ended: release the request's booking once."""
        guard = self._guard
        if guard is not None:
            # what `answered` has not given back: a body never routed (error, reset, timeout)
            guard.release(self._reserved, self._connection)
            self._reserved = 0
            self._close_body()
            self._give_lane()
            if self._admitted:
                guard.leave()
                self._admitted = False
        if self.ctx is not None:
            self.ctx.finish(complete=self.response_complete)


def _content_length(headers: dict[str, str]) -> int:
    """The request's Content-Length, 0 when absent or not a number (the body is then measured
    as it arrives)."""
    value = headers.get("content-length", "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 19 else 0
