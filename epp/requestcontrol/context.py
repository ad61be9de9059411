"""One routed request's state, from the routing decision to the end of its response stream
(`RequestContext`): the booking it holds, its response's tracking (usage, first byte, the model
name rewritten back), the other stages' pods of a split request, and how flow control may cut it.
The Director makes one per routed request and ends it (`Director.finish`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from epp import clock
from epp.api.requests import InferenceRequest
from epp.api.responses import ResponseTracker
from epp.datastore.endpoints import Endpoint
from epp.observability import llmd_metrics, metrics
from epp.scheduling.interfaces import SchedulingResult
from epp.sidecar.protocol import ENCODER_HEADER, PREFILL_HEADER

if TYPE_CHECKING:
    from epp.requestcontrol.director import Director

STAGE_HEADERS = (PREFILL_HEADER, ENCODER_HEADER)


class RequestContext:
    """One routed request, from the decision to the end of its response stream."""

    __slots__ = (
        "_director",
        "_finished",
        "answer_headers",
        "answered_at",
        "booked",
        "destination",
        "evict_hook",
        "headers",
        "headers_skipped",
        "helpers",
        "inflight",
        "labels",
        "last_chunk_at",
        "picked_at",
        "prefilling",
        "received_at",
        "remove_headers",
        "request",
        "response_bytes",
        "response_skipped",
        "response_started_at",
        "response_time",
        "result",
        "sampled",
        "series",
        "served",
        "tracker",
    )

    def __init__(self, director: Director, request: InferenceRequest, result: SchedulingResult) -> None:
        self._director = director
        self._finished = False
        self.request = request
        self.result = result
        targets = result.targets
        self.destination = ",".join(ep.hostport for ep in targets)
        self.booked: Endpoint = targets[0]
        # Disaggregation: the headers naming the other stages' pods to the decode pod's sidecar,
        # the client's own copies of them to drop, and those pods, booked until the first byte.
        self.headers = result.headers
        self.remove_headers = tuple(
            h for h in STAGE_HEADERS if h in request.headers and h not in result.headers
        )
        self.helpers: list[Endpoint] = [ep for pods in result.stages.values() for ep in pods]
        # Booked as prefill work on `booked` until the answer's first byte (`prefill_done`).
        self.prefilling = False
        self.served: Endpoint | None = None
        # The model server's response headers and when they came (RequestOutcome.headers).
        self.answer_headers: Mapping[str, str] = {}
        self.answered_at: float | None = None
        self.picked_at = clock.now()
        # When epp had the request's headers (llm-d's series time from there); the decision's
        # time when the caller does not say.
        self.received_at = self.picked_at
        self.tracker = ResponseTracker(incoming_model=request.model, target_model=request.target_model)
        self.labels = director.model_labels(request)  # (model_name, target_model_name) for metrics
        # llm-d's per-request series for the request's labels (set when it is counted as routed).
        self.series: llmd_metrics.RequestSeries | None = None
        self.response_bytes = 0
        self.response_started_at = 0.0
        self.response_time = 0.0  # seconds the ext-proc layer spent on the response's chunks
        self.last_chunk_at = 0.0
        # Whether the response body must pass through epp: the sampled share (usage, TTFT) and
        # every request whose model name is rewritten back in it. The ext-proc layer may skip
        # the body of the others (`response_skipped`) where the gateway allows it.
        self.sampled = True
        self.response_skipped = False
        # Off-sample from the request's headers on: the response's headers skip epp too (no
        # status, no served endpoint; `Director.skips_response`), unless they come anyway.
        self.headers_skipped = False
        # Flow control's eviction (enableEviction): its tracking entry, and how the ext-proc
        # layer cuts the stream (None until set; returns False where it cannot).
        self.inflight: Any = None
        self.evict_hook: Callable[[], bool] | None = None

    def evict(self) -> bool:
        """Cut this request's stream (flow control frees its capacity for a higher priority)."""
        hook = self.evict_hook
        return hook is not None and not self._finished and hook()

    @property
    def body(self) -> bytes:
        """The body to forward: the client's, or re-encoded when the model name was rewritten."""
        return self.request.body_bytes

    def endpoint_scores(self) -> dict[str, float] | None:
        """With `emit_endpoint_scores`: the primary profile's weighted score of every endpoint it
        scored (the picked ones and the others), by `ip:port`, as llm-d emits them; else None."""
        if not self._director.settings.emit_endpoint_scores:
            return None
        scored = self.result.profiles[self.result.primary].scored
        return {s.endpoint.hostport: s.score for s in scored} or None

    @property
    def rewrites_response(self) -> bool:
        return self.request.model != self.request.target_model and bool(self.request.model)

    def body_forwarded(self) -> None:
        """The gateway holds the body to forward: drop epp's copies (raw and decoded) for the
        rest of the response. Nothing after routing reads them; the prompt's text and token ids
        stay for the hooks."""
        request = self.request
        request.body_bytes = b""
        request.body = None

    def on_response_headers(self, headers: Mapping[str, str], served_hostport: str | None) -> dict[str, str]:
        """Take the model server's response headers; returns the headers the configured plugins
        add to the response to the client (session tokens, ...)."""
        self.response_started_at = clock.now()
        self.headers_skipped = False  # the gateway sent them all the same
        self.tracker.on_headers(headers)
        if self.answered_at is None:
            self.answered_at = clock.now()
            self.answer_headers = headers
        if served_hostport:
            self.served = self._director.datastore.by_hostport(served_hostport)
        added: dict[str, str] = {}
        for plugin in self._director.response_header_plugins:
            added.update(plugin.response_headers(self.request, self.result, served_hostport, headers))
        return added

    def prefill_done(self) -> None:
        """The answer's first byte arrived, or the stream ended: the prefill work is over, the
        decode pod's and the other stages' (their bookings go). Safe to call more than once."""
        if self.prefilling:
            self.prefilling = False
            self.booked.prefilled(self.request.prompt_tokens_estimate)
        self.release_helpers()

    def release_helpers(self) -> None:
        """Release the other stages' bookings (prefill, encode): their work is done once the first
        byte of the answer arrives, or the stream ended. Safe to call more than once."""
        helpers = self.helpers
        if helpers:
            self.helpers = []
            tokens = self.request.prompt_tokens_estimate
            for ep in helpers:
                ep.release(tokens)

    def on_response_body(self, chunk: bytes, end_of_stream: bool) -> bytes:
        if chunk and (self.prefilling or self.helpers):
            self.prefill_done()
        if self.response_skipped:  # the gateway ignored the skip: account as usual
            self.response_skipped = False
            metrics.response_bodies_skipped.labels("ignored").inc()
        self.response_bytes += len(chunk)
        if chunk:
            # llm-d's inter-token latency: the time between a streamed response's chunks.
            now = clock.now()
            last, self.last_chunk_at = self.last_chunk_at, now
            series = self.series
            if last and series is not None and self.tracker.streaming:
                series.itl.observe(now - last)
        return self.tracker.on_chunk(chunk, end_of_stream)

    def finish(self, *, complete: bool) -> None:
        """Release the booking and report the outcome. Safe to call more than once."""
        if self._finished:
            return
        self._finished = True
        self._director.finish(self, complete=complete)
