"""The Director owns one request's lifecycle, from the parsed body to the end of the response.

    route():   parse body, its InferenceModelRewrite (the model the pod is sent), priority of its
               InferenceObjective -> candidate endpoints (subset hint)
               -> admission: flow control holds the request until it may go (epp.flowcontrol,
               with `featureGates: [flowControl]`), else GIE's legacy admission (sheddable
               requests shed with 429 while saturated) -> token ids (when a plugin consumes
               them) -> scheduler -> pre-request hooks -> book in-flight load on the primary
               -> RequestContext
    context:   on_response_headers / on_response_body (usage, model name rewritten back)
               -> finish(): release the booking, run response-complete hooks, record metrics

Tokenization runs here, before the scheduler, because it is the one slow step of a decision
and the scheduler is synchronous (`epp.requestcontrol.prompt`); it happens only when a configured
plugin `consumes_tokens`. A body over the body parsers' size is parsed in their processes
(`epp.requestcontrol.offload`), never on the loop.

Response sampling (which responses still pass through epp where the gateway lets epp skip them)
is `epp.requestcontrol.sampling`'s; the ext-proc layer acts on its decision
(`RequestContext.sampled`, `response_skipped`).

`finish()` is idempotent and the ext-proc layer calls it from a `finally`, so every way a stream
can end (completion, model-server error, client reset, Envoy cancelling the stream, epp answering
with an error after booking) releases exactly once. That is what keeps in-flight counts honest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypedDict

import msgspec

from epp import clock
from epp.api import context_length, errors
from epp.api.limits import DEFAULT_LIMITS, RequestLimits
from epp.api.requests import (
    MODEL_REWRITE_HEADERS,
    InferenceRequest,
    header_only_request,
    retarget,
)
from epp.api.routes import DEFAULT as DEFAULT_PARSERS
from epp.api.routes import Parsers
from epp.datastore.endpoints import Datastore, Endpoint
from epp.datastore.model_rewrites import ModelRewriteStore
from epp.flowcontrol.controller import FlowController, fairness_id
from epp.observability import metrics
from epp.requestcontrol import admission
from epp.requestcontrol.accounting import Accounting
from epp.requestcontrol.context import RequestContext
from epp.requestcontrol.offload import BodyParsers, parse_here
from epp.requestcontrol.prompt import Prompts, PromptTokenizer
from epp.requestcontrol.sampling import ResponseSampler
from epp.scheduling import prewarm
from epp.scheduling.config import SchedulerConfig
from epp.scheduling.framework import Scheduler
from epp.scheduling.interfaces import (
    Admitter,
    PreRequest,
    RequestHeaderProcessor,
    RequestOutcome,
    RequestProducer,
    ResponseComplete,
    ResponseHeaders,
    SchedulingResult,
)
from epp.tokenize.render import Renderer

log = logging.getLogger("epp.director")


class PluginHooks(TypedDict):
    """The configured plugins of each of the Director's hooks, as its keyword arguments."""

    pre_request: Sequence[PreRequest]
    response_complete: Sequence[ResponseComplete]
    header_processors: Sequence[RequestHeaderProcessor]
    producers: Sequence[RequestProducer]
    admitters: Sequence[Admitter]
    response_headers: Sequence[ResponseHeaders]


def plugin_hooks(config: SchedulerConfig) -> PluginHooks:
    """Every hook's plugins from `config`: `epp serve` and the benchmarks build their Directors
    alike (fast mode once left out the response-header hook, which P/D's decode-pod pricing
    depends on)."""
    return PluginHooks(
        pre_request=config.pre_request,
        response_complete=config.response_complete,
        header_processors=config.header_processors,
        producers=config.producers,
        admitters=config.admitters,
        response_headers=config.response_headers,
    )


# From this many prompt tokens the scorers' work that needs no shared state (block keys: ~250 ns a
# block) is done in a worker thread before scheduling, not on the loop inside it.
PREPARE_AHEAD_TOKENS = 16384


@dataclasses.dataclass(frozen=True, slots=True)
class DirectorSettings:
    max_body_bytes: int = 16 << 20
    """Request bodies larger than this are answered 413 without being parsed."""
    limits: RequestLimits = DEFAULT_LIMITS
    """epp's limits on a body's messages, parts, tools and nesting (`epp.api.limits`)."""
    disable_subset_filter: bool = False
    """Ignore Envoy's subset hint (GIE's --disable-endpoint-subset-filter)."""
    response_sample_ratio: float = 1.0
    """Share of requests whose response body epp still reads where the gateway lets it skip the
    rest (Envoy `allow_mode_override`); the others report no usage, TTFT or cached tokens."""
    response_sample_min_interval: float = 0.0
    """Seconds: a request is sampled whatever the ratio when its endpoint has had no sampled
    response started for this long (0: the ratio alone), so every endpoint keeps feeding the
    learned rates. Costs at most endpoints / interval extra sampled streams a second."""
    response_sample_settled_interval: float | None = None
    """Seconds: the floor's interval once an endpoint has had `sampling.SETTLE_SAMPLES` sampled responses
    (None: `response_sample_min_interval` throughout). Not below the min interval."""
    response_sample_headers: str = "all"
    """"all": epp reads every response's headers (status, served endpoint, response-header
    plugins); "sampled": an off-sample request may skip its response's headers too, decided at
    its request headers (`ResponseSampler.early`): one ext-proc round trip less."""
    emit_endpoint_scores: bool = False
    """llm-d's --emit-endpoint-scores: the routing answer carries each scored endpoint's weighted
    score (`RequestContext.endpoint_scores`)."""
    trust_model_rewrite_header: bool = False
    """Honour x-llm-d-model-name-rewrite and GIE's x-gateway-model-name-rewrite (GIE and llm-d
    always do). Off: the headers are ignored, since a client can send them and the gateway in
    front may not strip them (docs/security.md). InferenceModelRewrites apply either way."""
    parsers: Parsers = DEFAULT_PARSERS
    """Which parser reads a request, by path (`requestHandler.parsers`; llm-d's default)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.response_sample_ratio <= 1.0:
            raise ValueError("response_sample_ratio must be between 0 and 1")
        if not 0.0 <= self.response_sample_min_interval < float("inf"):
            raise ValueError("response_sample_min_interval must be a finite number of seconds >= 0")
        settled = self.response_sample_settled_interval
        if settled is not None and not self.response_sample_min_interval <= settled < float("inf"):
            raise ValueError(
                "response_sample_settled_interval must be a finite number of seconds, "
                "at least response_sample_min_interval"
            )
        if self.response_sample_headers not in ("all", "sampled"):
            raise ValueError('response_sample_headers must be "all" or "sampled"')

    @property
    def settled_interval(self) -> float:
        """The floor's interval for an endpoint past `sampling.SETTLE_SAMPLES` samples."""
        settled = self.response_sample_settled_interval
        return self.response_sample_min_interval if settled is None else settled


class Director:
    def __init__(
        self,
        *,
        datastore: Datastore,
        scheduler: Scheduler,
        pre_request: Sequence[PreRequest] = (),
        response_complete: Sequence[ResponseComplete] = (),
        header_processors: Sequence[RequestHeaderProcessor] = (),
        producers: Sequence[RequestProducer] = (),
        admitters: Sequence[Admitter] = (),
        response_headers: Sequence[ResponseHeaders] = (),
        settings: DirectorSettings = DirectorSettings(),
        tokenizer: PromptTokenizer | None = None,
        admission_controller: admission.LegacyAdmissionController | None = None,
        objectives: admission.Objectives | None = None,
        context_limits: context_length.ContextLimits | None = None,
        body_parsers: BodyParsers | None = None,
        flow_control: FlowController | None = None,
        rewrites: ModelRewriteStore | None = None,
        renderer: Renderer | None = None,
        prewarmer: prewarm.Prewarmer | None = None,
    ) -> None:
        """`admission_controller` None admits every request; `objectives` None makes every
        request's priority 0 (no InferenceObjectives: standalone mode); `context_limits` None
        enforces no context length (the model servers do); `flow_control`, when given, replaces
        `admission_controller` (llm-d: one or the other); `rewrites` None (or empty) sends every
        request to the model it names (no InferenceModelRewrites: standalone mode)."""
        self.datastore = datastore
        self.scheduler = scheduler
        self.settings = settings
        self.tokenizer = tokenizer
        self._tokenizer = tokenizer if scheduler.consumes_tokens() else None  # None: skip the work
        self._pre_request = list(pre_request)
        self._response_complete = list(response_complete)
        self._header_processors = list(header_processors)
        self._producers = list(producers)
        self._admitters = list(admitters)
        self.response_header_plugins = list(response_headers)
        self.admission_controller = admission_controller
        self.flow_control = flow_control
        self.objectives = objectives
        self.rewrites = rewrites
        # Sends the pre-warms the scorers plan (epp.scheduling.prewarm), before the plugins book
        # anything: one held back at its bounds leaves the request on the holder; one refused (or
        # without a sender) becomes the move it replaced.
        self.prewarmer = prewarmer
        # Token ids and context-length rules; bodies over the parsers' size are parsed and
        # rendered in their processes (epp.requestcontrol.offload).
        self.prompts = Prompts(datastore, settings.limits, context_limits, body_parsers, renderer)
        # The per-request series of GIE and llm-d (epp.requestcontrol.accounting).
        self.accounting = Accounting()
        # A detector that counts prefill work (concurrency-detector's maxPrefillTokens) learns a
        # prefill ended from the answer's first byte: every response body must pass through epp.
        detector = admission_controller.detector if admission_controller is not None else None
        self._first_byte_required = bool(getattr(detector, "counts_prefill", False))
        # Removed endpoints' floors are forgotten with their metric children.
        self.sampler = ResponseSampler(
            datastore,
            ratio=settings.response_sample_ratio,
            min_interval=settings.response_sample_min_interval,
            settled_interval=settings.settled_interval,
        )
        # Whether a request may be off-sample from its headers on (`skips_response` also asks the
        # rewrites and the response-header plugins): never where a detector needs the answer's
        # first byte, nor under flow control's eviction, which may cut an off-sample response
        # until its headers go by.
        self._early_skip = (
            settings.response_sample_headers == "sampled"
            and settings.response_sample_ratio < 1.0
            and not self._first_byte_required
            and (flow_control is None or flow_control.reclaimer is None)
        )
        # A removed endpoint's series are dropped (metrics.forget_endpoint): so are their children.
        datastore.subscribe(self._forget_children)

    def model_labels(self, request: InferenceRequest) -> tuple[str, str]:
        """The request's (model_name, target_model_name) metric label values, capped."""
        return self.accounting.labels(request)

    def _forget_children(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        if added or removed:
            self.sampler.forget(removed)
        if removed:
            self.accounting.forget(removed)

    def skips_response(self, headers: Mapping[str, str]) -> bool:
        """Whether the request with these headers is off-sample from here on, response headers
        included (`--response-sample-headers=sampled`; `epp.requestcontrol.sampling`): then its
        share of the ratio is spent, and the caller must pass `response_skipped` to `route`. Not
        where a rewrite header may name another model, whose name is written back in the body."""
        if not self._early_skip or self.rewrites:
            return False
        splits = self.scheduler.splits
        if any(splits or not getattr(p, "split_responses_only", False) for p in self.response_header_plugins):
            return False
        if self.settings.trust_model_rewrite_header and any(h in headers for h in MODEL_REWRITE_HEADERS):
            return False
        return self.sampler.early()

    async def route(
        self,
        *,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        subset: list[str] | None,
        on_hold: Callable[[float], Awaitable[None]] | None = None,
        received_at: float | None = None,
        response_skipped: bool = False,
    ) -> RequestContext:
        """Decide where the request goes. Raises `errors.RequestError` for an HTTP error answer.

        `body` None means a header-only request (GET /v1/models): it is routed too. With flow
        control, the call may wait until the request may be scheduled; `on_hold(max_wait)` is
        awaited when it starts waiting (the gateway's message timeout must then be extended).
        `received_at`: when the request's headers arrived (`epp.clock`), where llm-d's series
        start; default now. `response_skipped`: `skips_response` said so at its headers.
        """
        received = clock.now() if received_at is None else received_at
        # Every error answer raised here is counted here, with the model once the body is parsed;
        # the ext-proc layer counts only the ones it raises itself.
        held = self.flow_control is not None
        try:
            request, candidates = await self._prepare(
                path=path, headers=headers, body=body, subset=subset, hold=held
            )
        except errors.RequestError as exc:
            self.accounting.error_before_parse(exc.status, headers)
            raise
        try:
            size = len(body) if body is not None else 0
            if self.flow_control is not None:
                await self.flow_control.admit(
                    request, size, labels=self.model_labels(request), on_hold=on_hold
                )
                candidates = self._candidates(request.subset_ips)  # the pool as it is now
            return await self._route(request, candidates, size, received, response_skipped)
        except errors.RequestError as exc:
            _shape(exc, request)
            labels = self.model_labels(request)
            self.accounting.error(labels, exc.status, fairness_id(request), request.priority)
            raise

    async def _route(
        self,
        request: InferenceRequest,
        candidates: list[Endpoint],
        body_size: int,
        received: float,
        response_skipped: bool,
    ) -> RequestContext:
        if self.admission_controller is not None and self.flow_control is None:
            self.admission_controller.admit(request, candidates)
        await self.prompts.fill(request, self._tokenizer)
        if not request.runs_engine:
            _no_engine(request)
        for producer in self._producers:  # llm-d's data producers: may wait (a burst window)
            await producer.produce(request, candidates)
        for admitter in self._admitters:
            refusal = admitter.admit(request, candidates)
            if refusal is not None:  # llm-d's director answers an admitter's refusal as internal
                raise errors.RequestError(f"request cannot be admitted: {refusal}")  # 500
        if len(request.token_ids or ()) >= PREPARE_AHEAD_TOKENS and self.scheduler.preparers:
            await asyncio.to_thread(self.scheduler.prepare, request, candidates)
        result = self.scheduler.schedule(request, candidates)
        if not result.targets:
            self.accounting.attempt(request, None)
            raise errors.NoCapacity("the scheduler found no endpoint for the request")
        warmup = prewarm.planned(result)
        if warmup is not None:
            verdict = "refuse" if self.prewarmer is None else self.prewarmer.verdict(warmup.endpoint)
            if verdict == "wait":
                prewarm.stay(result)
                warmup = None
            elif verdict == "refuse":
                prewarm.move(result, warmup)
                warmup = None
        for hook in self._pre_request:
            hook.pre_request(request, result)
        if warmup is not None and self.prewarmer is not None:
            self.prewarmer.send(warmup.endpoint, request, warmup.tokens)
        ctx = RequestContext(self, request, result)
        ctx.received_at = received
        primary = ctx.booked
        if response_skipped:  # off-sample from its headers on (`skips_response`)
            ctx.sampled = False
            ctx.response_skipped = ctx.headers_skipped = True
        else:
            ctx.sampled = self.sampler.sample(primary, ctx.rewrites_response or self._first_byte_required)
        if log.isEnabledFor(logging.DEBUG):
            self._log_decision(request, result)
        primary.book(request.prompt_tokens_estimate)
        ctx.prefilling = True
        for ep in ctx.helpers:
            ep.book(request.prompt_tokens_estimate)
        if self.flow_control is not None:
            self.flow_control.started(request)
            ctx.inflight = self.flow_control.track(request.priority, ctx.evict)
        self.accounting.routed(ctx, body_size)
        return ctx

    async def explain(
        self, *, path: str, headers: Mapping[str, str], body: bytes | None
    ) -> tuple[InferenceRequest, SchedulingResult]:
        """How the request would be routed now, with every scorer's score per endpoint.

        Nothing is booked and pre-request hooks do not run, so nothing is learned; pickers that
        keep a cursor (round-robin) and InferenceModelRewrite splits still advance (the rewrite is
        counted). Raises `errors.RequestError` like `route`.
        """
        request, candidates = await self._prepare(path=path, headers=headers, body=body, subset=None)
        try:
            await self.prompts.fill(request, self._tokenizer)
        except errors.RequestError as exc:
            _shape(exc, request)
            raise
        if not request.runs_engine:
            _no_engine(request)
        return request, self.scheduler.schedule(request, candidates, explain=True)

    async def tokenize(
        self, *, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[InferenceRequest, bool]:
        """The request with the token ids epp computes for it, and whether the configured plugins
        score them (`POST /debug/tokenize`; never for a route that runs no engine, whose ids are
        computed to refuse what vLLM refuses, then dropped). Raises `errors.RequestError` like
        `route`."""
        request, _ = await self._prepare(path=path, headers=headers, body=body, subset=None)
        try:
            await self.prompts.fill(request, self.tokenizer)
        except errors.RequestError as exc:
            _shape(exc, request)
            raise
        return request, self._tokenizer is not None and request.runs_engine

    def _log_decision(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """One debug line per decision: the pick, and what the explainers found, per request
        (`facts`: the rule that placed it, the miss penalty, pre-warms) and per endpoint
        (`endpoints`: every scorer's terms, as `POST /debug/score` shows them). Why a request went
        where it did under live traffic is read from these lines: explain answers for a request
        scored now, not for the state the live one met."""
        facts = self.scheduler.facts(result)
        matched = {
            name: fields.get("matched_blocks")
            for name, fields in facts["endpoints"].items()
            if fields.get("matched_blocks")
        }
        log.debug(
            "routed %s to %s",
            request.request_id,
            result.targets[0].hostport,
            extra={
                "request_id": request.request_id,
                "model": request.target_model,
                "pick": result.targets[0].name,
                "targets": ",".join(ep.hostport for ep in result.targets),
                "prompt_tokens": request.prompt_tokens_estimate,
                "request_blocks": facts["request"].get("request_blocks"),
                "matched_blocks": _json(matched),
                "facts": _json(facts["request"]),
                "endpoints": _json(facts["endpoints"]),
            },
        )

    async def _prepare(
        self,
        *,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        subset: list[str] | None,
        hold: bool = False,
    ) -> tuple[InferenceRequest, list[Endpoint]]:
        """Parse the request and find its candidate endpoints (`hold`: flow control will wait for
        them, so none is not an error yet)."""
        if not self.settings.trust_model_rewrite_header and any(h in headers for h in MODEL_REWRITE_HEADERS):
            headers = {k: v for k, v in headers.items() if k not in MODEL_REWRITE_HEADERS}
        request_id = headers.get("x-request-id") or uuid.uuid4().hex
        route = self.settings.parsers.resolve(path) if body is not None else None
        subset_ips = None
        if subset is not None and not self.settings.disable_subset_filter:
            # GIE restricts by IP only: the proxy's view of ports may differ from the pool's.
            subset_ips = frozenset(_host_of(s) for s in subset)
        if body is None:
            request = header_only_request(
                path=path, headers=headers, request_id=request_id, subset_ips=subset_ips
            )
        else:
            if len(body) > self.settings.max_body_bytes:
                raise errors.PayloadTooLarge(
                    f"request body of {len(body)} bytes exceeds the limit of {self.settings.max_body_bytes}"
                )
            parse = parse_here
            parsers = self.prompts.body_parsers
            if parsers is not None and parsers.wants(len(body)):
                parse = parsers.parse
            request = await parse(
                path=path,
                headers=headers,
                body=body,
                request_id=request_id,
                subset_ips=subset_ips,
                limits=self.settings.limits,
                route=route,
            )
            if self.rewrites and request.model:
                await self._rewrite(request)
        request.priority = admission.priority(self.objectives, admission.objective(headers))
        for processor in self._header_processors:  # before admission: flow control reads them
            processor.request_headers(request)
        if hold:
            return request, []
        return request, self._candidates(subset_ips)

    async def _rewrite(self, request: InferenceRequest) -> None:
        """Apply the InferenceModelRewrite rule for the request's model, if one matches (it wins
        over a rewrite header, as in llm-d). A large body is re-encoded in a body parser."""
        assert self.rewrites is not None
        decision = self.rewrites.decide(request.model)
        if decision is None:
            return
        target = decision.model
        if not target:
            raise errors.BadRequest(
                f"InferenceModelRewrite {decision.rewrite} has a rule for model {request.model!r} "
                "without targets"
            )
        if target != request.target_model:
            parsers = self.prompts.body_parsers
            if parsers is not None and parsers.wants(len(request.body_bytes)):
                request.body_bytes = await parsers.with_model(request.body_bytes, target)
                request.target_model = target
            else:
                retarget(request, target)
        # Configured names keep their label past the cap, as llm-d pins them (a rule for every
        # model pins its target only: the models it catches come from clients).
        self.accounting.pin(target, *((request.model,) if self.rewrites.names(request.model) else ()))
        model, target_label = self.model_labels(request)
        child = self.accounting.child
        child(metrics.model_rewrite_decisions, decision.rewrite, model, target_label).inc()
        child(metrics.llmd_model_rewrite_decisions, decision.rewrite, model, target_label).inc()

    def _candidates(self, subset_ips: frozenset[str] | None) -> list[Endpoint]:
        """The endpoints the request may go to; 503 when there are none."""
        # Every endpoint excluded for stale metrics: routed on what is known (degraded), not 503.
        candidates = self.datastore.pick_candidates(subset_ips)
        if subset_ips is not None:
            if not candidates:
                raise errors.ServiceUnavailable("no ready endpoint matches the proxy's subset hint")
        elif not candidates:
            why = self.datastore.unavailable_reason()
            raise errors.ServiceUnavailable(
                f"no ready endpoints in the pool: {why}" if why else "no ready endpoints in the pool"
            )
        return candidates

    def finish(self, ctx: RequestContext, *, complete: bool) -> None:
        request = ctx.request
        ep = ctx.booked
        ep.release(request.prompt_tokens_estimate)
        ctx.prefill_done()
        if self.datastore.get(ep.name) is ep:  # a removed endpoint's series stay dropped
            self.accounting.child(metrics.inflight_requests, ep.name).set(ep.inflight_requests)
        tracker = ctx.tracker
        now = clock.now()
        usage = tracker.usage
        if ctx.response_skipped:
            # Envoy ends the ext-proc stream alike for a finished response and a client reset
            # once the body no longer passes through epp: a success status counts as complete.
            complete = True
            self.accounting.child(metrics.response_bodies_skipped, "skipped").inc()
        status = tracker.status
        outcome = RequestOutcome(
            endpoint=ctx.served or ep,
            status=status,
            # No status seen (headers skipped): the end of a stream counts as a success.
            ok=complete and (200 <= status < 300 or (ctx.headers_skipped and not status)),
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            cached_tokens=usage.cached_tokens if usage else None,
            ttft_s=(tracker.first_chunk_at - ctx.picked_at) if tracker.first_chunk_at else None,
            duration_s=now - ctx.picked_at,
            headers=ctx.answer_headers,
            headers_s=(ctx.answered_at - ctx.picked_at) if ctx.answered_at is not None else None,
        )
        for hook in self._response_complete:
            try:
                hook.response_complete(request, outcome)
            except Exception:  # a plugin bug must not leak the booking or kill the stream
                log.exception("response-complete hook %s failed", hook.name)
        if self.flow_control is not None:
            self.flow_control.completed(request, outcome)
            if ctx.inflight is not None:
                self.flow_control.untrack(ctx.inflight)
        self.accounting.finished(ctx, outcome, complete=complete, now=now)


def _shape(exc: errors.RequestError, request: InferenceRequest) -> None:
    """Answer in Anthropic's error shape where vLLM would (`InferenceRequest.anthropic_errors`)."""
    if request.anthropic_errors and not exc.validation:
        exc.anthropic = True


def _no_engine(request: InferenceRequest) -> None:
    """A render, a token count, an unparsed body: its prompt never reaches an engine, so nothing
    is scored or booked for it (its ids, computed to refuse what vLLM refuses, are dropped)."""
    request.token_ids = None
    request.prompt_texts = []
    request.prompt_token_ids = []
    request.prompt_tokens_estimate = 0


def _json(value: Any) -> str:
    # enc_hook: a plugin's explain value JSON cannot hold is logged as its str(), never raised
    # into the request's routing (these are debug lines).
    return msgspec.json.encode(value, enc_hook=str).decode()


def _host_of(hostport: str) -> str:
    """'10.0.0.1:8000' -> '10.0.0.1'; '[::1]:8000' -> '::1'; a bare host stays as it is."""
    if hostport.startswith("["):
        return hostport[1 : hostport.find("]")]
    if hostport.count(":") == 1:
        return hostport.rsplit(":", 1)[0]
    return hostport
