"""What the Director counts per request: GIE's per-request series (prometheus_client objects, one
bound child per label set) and llm-d's (`epp.observability.llmd_metrics`, one `RequestSeries` per
label set), at the points each project counts them.

- routed: `inference_objective_request_total`, request sizes, running requests, the scheduling
  attempt; llm-d's `request_total`, `request_size_bytes`, `request_running` and the EPP's own
  processing time (headers received to the routing answer, queueing included);
- errors: `request_error_total` of both, with GIE's error codes;
- finished (however the stream ended): the latency, size and token histograms of both. GIE's time
  from the routing decision (epp's long-standing choice, docs/metrics.md), llm-d's from the
  request's arrival, as llm-d times its own.

Cost: bound children (a Prometheus `labels()` lookup is ~1.5 us, and a request needs a dozen) and
one `RequestSeries` lookup per request; a removed endpoint's children go with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.flowcontrol.controller import fairness_id, fairness_of
from epp.observability import llmd_metrics, metrics
from epp.scheduling.interfaces import RequestOutcome

if TYPE_CHECKING:
    from epp.requestcontrol.context import RequestContext


class Accounting:
    def __init__(self) -> None:
        self._children: dict[tuple[str, ...], Any] = {}
        # Model names and fairness IDs come from clients: capped, so junk cannot multiply series.
        self._labels = metrics.ModelLabels()
        self._sets = llmd_metrics.LabelSets()

    def labels(self, request: InferenceRequest) -> tuple[str, str]:
        """The request's (model_name, target_model_name) label values, capped."""
        return self._labels(request.model, request.target_model)

    def pin(self, *names: str) -> None:
        """Configured model names (InferenceModelRewrite's) always keep their label."""
        self._labels.pin(*names)

    def child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def forget(self, removed: list[Endpoint]) -> None:
        """Drop the children of removed endpoints (metrics.forget_endpoint drops their series)."""
        gone = {ep.name for ep in removed} | {ep.spec.pod for ep in removed if ep.spec.pod}
        self._children = {k: c for k, c in self._children.items() if gone.isdisjoint(k[1:])}

    def error(self, labels: tuple[str, str], status: int, fairness: str, priority: int) -> None:
        code = metrics.error_code(status)
        self.child(metrics.request_errors_total, *labels, code).inc()
        llmd_metrics.REQUESTS.series(self._sets(*labels, fairness, priority)).error(code)

    def error_before_parse(self, status: int, headers: Mapping[str, str]) -> None:
        self.error(("-", "-"), status, fairness_of(headers), 0)

    def attempt(self, request: InferenceRequest, primary: Endpoint | None) -> None:
        """GIE's scheduler_attempts_total: the primary endpoint's pod and port, or a failure. The
        target is the pair-capped one (`metrics.MAX_LABEL_PAIRS`): a series per target and pod."""
        target = self.labels(request)[1]
        if primary is None:
            self.child(metrics.scheduler_attempts, "failure", target, "", "", "").inc()
        else:
            spec = primary.spec
            pod = spec.pod or spec.name
            self.child(metrics.scheduler_attempts, "success", target, pod, "", str(spec.port)).inc()

    def routed(self, ctx: RequestContext, body_size: int) -> None:
        primary = ctx.booked
        request = ctx.request
        model, target = ctx.labels
        child = self.child
        self.attempt(request, primary)
        child(metrics.picks_total, primary.name).inc()
        child(metrics.inflight_requests, primary.name).set(primary.inflight_requests)
        child(metrics.requests_total, model, target, str(request.priority)).inc()
        child(metrics.request_sizes, model, target).observe(body_size)
        child(metrics.running_requests, model).inc()
        table = llmd_metrics.REQUESTS
        key = self._sets(model, target, fairness_id(request), request.priority)
        series = ctx.series = table.series(key)
        series.requests += 1
        series.running += 1
        series.request_size.observe(body_size)
        table.processing.observe(ctx.picked_at - ctx.received_at)

    def finished(self, ctx: RequestContext, outcome: RequestOutcome, *, complete: bool, now: float) -> None:
        """Both projects' per-request series, once the response stream has ended (however)."""
        self._finished_gie(ctx, outcome, complete=complete, now=now)
        self._finished_llmd(ctx, outcome, complete=complete, now=now)

    def _finished_gie(
        self, ctx: RequestContext, outcome: RequestOutcome, *, complete: bool, now: float
    ) -> None:
        labels = ctx.labels
        model = labels[0]
        tracker = ctx.tracker
        child = self.child
        child(metrics.running_requests, model).dec()
        if tracker.status and not 200 <= tracker.status < 300:
            child(metrics.request_errors_total, *labels, metrics.MODEL_SERVER_ERROR).inc()
        if outcome.ttft_s is not None:
            child(metrics.request_ttft, *labels).observe(outcome.ttft_s)
        if complete and not ctx.response_skipped:
            child(metrics.request_duration, *labels).observe(outcome.duration_s)
            child(metrics.response_sizes, *labels).observe(ctx.response_bytes)
        if tracker.usage is None:
            return
        prompt, completion, cached = outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens
        if prompt:
            child(metrics.input_tokens, *labels).observe(prompt)
        if completion:
            child(metrics.output_tokens, *labels).observe(completion)
        if cached is not None:
            child(metrics.cached_tokens, *labels).observe(cached)
        if complete and completion:
            child(metrics.ntpot, *labels).observe(outcome.duration_s / completion)
            first = tracker.first_chunk_at
            # Per-token pace needs tokens arriving over time: a streamed body, two tokens or more.
            if tracker.streaming and first is not None and completion > 1:
                child(metrics.request_tpot, *labels).observe((now - first) / (completion - 1))

    @staticmethod
    def _finished_llmd(ctx: RequestContext, outcome: RequestOutcome, *, complete: bool, now: float) -> None:
        """As GIE's, but timed from the request's arrival (llm-d's RequestReceivedTimestamp), TTFT
        by `streaming`, TPOT for streamed responses only, and the EPP's response time."""
        series = ctx.series
        if series is None:
            return
        tracker = ctx.tracker
        series.running -= 1
        if tracker.status and not 200 <= tracker.status < 300:
            series.error(metrics.MODEL_SERVER_ERROR)
        first = tracker.first_chunk_at
        if first is not None:
            series.observe_ttft(first - ctx.received_at, tracker.streaming)
        skipped = ctx.response_skipped
        if complete and not skipped:
            series.duration.observe(now - ctx.received_at)
            series.response_size.observe(ctx.response_bytes)
        if ctx.response_started_at and not skipped:
            # Streamed: epp's own time on the chunks; otherwise headers to completion.
            spent = ctx.response_time if tracker.streaming else now - ctx.response_started_at
            llmd_metrics.REQUESTS.response_processing.observe(spent)
        if tracker.usage is None:
            return
        prompt, completion, cached = outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens
        if prompt:
            series.input_tokens.observe(prompt)
        if completion:
            series.output_tokens.observe(completion)
        if cached is not None:
            series.cached_tokens.observe(cached)
        if complete and completion:
            series.ntpot.observe((now - ctx.received_at) / completion)
            if tracker.streaming and first is not None and completion > 1:
                series.tpot.observe((now - first) / (completion - 1))
