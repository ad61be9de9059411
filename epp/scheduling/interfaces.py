"""The scheduling contract: every extension point in one page.

Call order for one request, per profile: each Filter in config order (an empty result stops the
profile: "no endpoints available", 429), then every Scorer, then the profile's one Picker.

- Scores are in [0, 1], higher is better. The framework clamps whatever a scorer returns to
  [0, 1], multiplies it by the scorer's configured weight (default 1.0) and sums: there is no
  normalisation by the sum of weights.
- Filters and scorers are pure decisions over (request, endpoints): no I/O, no mutation of shared
  state. Effects (booking load, learning from a decision) belong in `PreRequest` hooks.
- `CycleState` is a per-request scratch dict shared by the plugins of one scheduling cycle, keyed
  by plugin name, for work a scorer does that a later plugin reuses.
- A plugin that needs the prompt's token ids says so with a class attribute `consumes_tokens =
  True`; the request then arrives with `InferenceRequest.token_ids` filled when a tokenizer is
  known for its model (tokenizing costs milliseconds, so it is skipped when nothing consumes it).
- A plugin may also be an `Explainer`: what it found for a request (matched blocks, ...) then
  appears in the explain API and the per-decision debug log.
- Request control around scheduling (llm-d's): a `RequestHeaderProcessor` reads a request's headers
  into its attributes before admission (agent identity), an `Admitter` may refuse it after
  admission and flow control, just before scheduling (probabilistic shedding), and
  `ResponseHeaders` add headers to the response (session tokens, conformance checks).
- A `SaturationDetector` is consulted before scheduling, by admission (`epp.requestcontrol`):
  sheddable requests (priority < 0) are refused with 429 while the pool's saturation is >= 1.0.
  The config's `saturationDetector.pluginRef` names it (default: `utilization-detector`).
- A plugin is created by a factory `(name, parameters, handle) -> plugin`. Parameters are decoded
  into the plugin's msgspec `Params` struct with unknown fields forbidden, so a misspelt parameter
  is a startup error naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Datastore, Endpoint
from epp.kvcache.index import KVIndexView

CycleState = dict[str, Any]


@dataclasses.dataclass(slots=True)
class ScoredEndpoint:
    endpoint: Endpoint
    score: float  # weighted sum over the profile's scorers


@dataclasses.dataclass(slots=True)
class ProfileResult:
    """The outcome of one profile: endpoints in order (primary first, then fallbacks)."""

    profile: str
    targets: list[Endpoint]
    # Per-endpoint breakdown for explain/debug: {endpoint name: {scorer name: raw clamped score}}.
    scores: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    # Explainers' findings, merged (explain only): {"request": {...}, "endpoints": {name: {...}}}.
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Every endpoint the scorers scored (after the filters), with its weighted sum: the picked
    # ones and the others (llm-d's ScoredCandidates, for --emit-endpoint-scores).
    scored: list[ScoredEndpoint] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class SchedulingResult:
    primary: str  # the name of the profile whose targets are sent to the proxy
    profiles: dict[str, ProfileResult]
    cycle: CycleState = dataclasses.field(default_factory=dict)  # the plugins' scratch, for explainers
    # Disaggregation (epp.scheduling.disagg): the endpoint that runs each earlier stage of the
    # request ("prefill", "encode") before the primary decodes it, and the request headers that
    # name them to the primary's sidecar (x-prefiller-host-port, x-encoder-hosts-ports).
    stages: dict[str, list[Endpoint]] = dataclasses.field(default_factory=dict)
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def targets(self) -> list[Endpoint]:
        return self.profiles[self.primary].targets


@runtime_checkable
class Plugin(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def name(self) -> str: ...


@runtime_checkable
class Filter(Plugin, Protocol):
    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        """Return the endpoints that may serve the request (a subset, order kept)."""
        ...


@runtime_checkable
class Scorer(Plugin, Protocol):
    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Sequence[float]:
        """One score per endpoint, aligned with `endpoints`; in [0, 1], higher is better."""
        ...


@runtime_checkable
class Picker(Plugin, Protocol):
    def pick(
        self, cycle: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]
    ) -> list[Endpoint]:
        """Choose the targets, best first; at most the picker's `maxNumOfEndpoints`."""
        ...


@runtime_checkable
class Explainer(Plugin, Protocol):
    def explain(self, cycle: CycleState) -> Mapping[str, Any]:
        """What this plugin found for the request scored in `cycle`: request-level facts under
        "request", per-endpoint facts under "endpoints" as {endpoint name: {field: value}}.
        Called only for the explain API and debug logs, never on the routing hot path."""
        ...


@runtime_checkable
class Preparer(Plugin, Protocol):
    def prepare(self, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        """Work `score` would do for this request that reads no state the loop changes (a long
        prompt's block keys), done ahead in a worker thread so that the loop does not hold it
        (the Director calls it only for long prompts). It must be safe to run off the event loop
        while other requests are routed, and `score` must answer the same whether it ran or not."""
        ...


@runtime_checkable
class PreRequest(Plugin, Protocol):
    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """Called once the decision is final, before the request goes to the proxy."""
        ...


@runtime_checkable
class ResponseComplete(Plugin, Protocol):
    def response_complete(self, request: InferenceRequest, outcome: RequestOutcome) -> None:
        """Called exactly once per scheduled request when its stream ends, however it ends."""
        ...


@runtime_checkable
class SaturationDetector(Plugin, Protocol):
    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        """How saturated the pool of `endpoints` is: 0.0 idle, >= 1.0 saturated (no endpoints: 1.0).
        Called by admission on the request path for every request: pure, no I/O, O(endpoints)."""
        ...


@runtime_checkable
class RequestHeaderProcessor(Plugin, Protocol):
    def request_headers(self, request: InferenceRequest) -> None:
        """Called once the request is parsed, before admission and flow control: reads its
        headers into `request.attributes` (llm-d's RequestHeaderProcessor, e.g. agent identity)."""
        ...


@runtime_checkable
class RequestProducer(Plugin, Protocol):
    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        """Called after admission, before scheduling, with the candidates: data a scorer reads
        later, which may take a wait (llm-d's burst producer holds requests for a window)."""
        ...


@runtime_checkable
class Admitter(Plugin, Protocol):
    def admit(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> str | None:
        """Called after admission and flow control, before scheduling: None admits, a reason
        refuses the request (llm-d answers 500 with it, and so does epp)."""
        ...


@runtime_checkable
class ResponseHeaders(Plugin, Protocol):
    def response_headers(
        self,
        request: InferenceRequest,
        result: SchedulingResult,
        served: str | None,
        headers: Mapping[str, str],
    ) -> Mapping[str, str]:
        """Called when the model server's response headers arrive: headers to add to the response
        to the client. `served` is the endpoint Envoy reports it sent the request to (its
        `x-gateway-destination-endpoint-served` metadata), None when Envoy reported none;
        `headers` the response's own (lower-case names).

        A plugin whose hook matters only for split requests (`SchedulingResult.stages`, P/D)
        says so with a true `split_responses_only` attribute: where the scheduler never splits
        (`Scheduler.splits`), an off-sample request may then skip its response's headers
        (`--response-sample-headers=sampled`)."""
        ...


@dataclasses.dataclass(slots=True)
class RequestOutcome:
    """How a scheduled request ended, as seen on the response path."""

    endpoint: Endpoint | None  # the one that served (x-gateway-destination-endpoint-served), else primary
    status: int = 0  # HTTP status from the model server, 0 if none arrived
    ok: bool = False  # a complete response was relayed
    prompt_tokens: int | None = None  # from usage, when the server reported it
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None  # seconds from pick to the first response body byte
    duration_s: float = 0.0  # seconds from pick to the end of the stream
    # The model server's response headers (lower-case names; empty if none arrived) and when they
    # did: a P/D decode pod's sidecar answers only once the prefill stage has (epp.sidecar adds
    # x-epp-prefill and x-epp-prefill-seconds), so P/D deciders learn the prefill pods from them.
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    headers_s: float | None = None  # seconds from pick to the response headers


@dataclasses.dataclass(slots=True)
class Handle:
    """What a plugin factory may use: shared services, passed explicitly."""

    datastore: Datastore
    # Where vLLM's KV-cache events land (None when KV events are off): precise prefix scoring.
    kv_index: KVIndexView | None = None
    extras: Mapping[str, Any] = dataclasses.field(default_factory=dict)


Factory = Callable[[str, Mapping[str, Any], Handle], Plugin]
"""(name, raw parameters from the config, handle) -> plugin. Raises ConfigError on bad parameters."""
