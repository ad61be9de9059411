"""llm-d's disaggregation deciders: whether a stage runs on its own pod for one request.

- `prefix-based-pd-decider` (`nonCachedTokens`, `promptTokens`): split prefill from decode when the
  prompt's tokens the chosen decode pod does not hold are at least `nonCachedTokens` (0: never),
  and the prompt has at least `promptTokens` (0: any length). The held tokens come from the
  decode profile's prefix scorer (`prefix-cache-scorer`'s approximate match, or
  `precise-prefix-cache-scorer`'s), as llm-d reads `PrefixCacheMatchInfo`; a decode profile
  without one never splits (llm-d logs an error per request and does not split either; epp says
  so once, at start-up). The prompt's length is its token ids when a tokenizer is known, else
  epp's estimate (llm-d's `estimate` token producer).
- `always-disagg-pd-decider`: split every request.
- `dynamo-pd-decider` (epp's rendering of Dynamo's conditional disaggregation, for the benchmark's
  peer policies): split when more than `maxLocalPrefillLength` tokens are uncached on the decode
  pod and the prefill queue is short.
- `always-disagg-multimodal-decider`: an encode stage for chat requests carrying an image, video or
  audio part (`image_url`, `video_url`, `input_audio`, `audio_url`); text-only requests have none.

A decider answers `disaggregate(cycle, request, decode, prefill)`. llm-d's look at the decode pod
only (`prices_prefill` False: the prefill profile runs after a yes); epp's `pd-latency-decider`
prices the prefill profile's pick first (`prices_prefill` True).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, ClassVar, Protocol, runtime_checkable

import msgspec

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import precise_prefix_cache_scorer, prefix_cache_scorer, prefix_match_scorer
from epp.scheduling.plugins.predicted_ttft_terms import RemotePrefill
from epp.scheduling.plugins.role_filter import ROLE_LABEL, PrefillFilter

PREFILL_ROLES = PrefillFilter.roles


@runtime_checkable
class Decider(interfaces.Plugin, Protocol):
    prices_prefill: ClassVar[bool]

    def disaggregate(
        self,
        cycle: interfaces.CycleState,
        request: InferenceRequest,
        decode: Endpoint | None,
        prefill: interfaces.ProfileResult | None,
    ) -> bool:
        """Whether the stage runs apart for `request`, `decode` being the chosen decode pod (None
        in prefill-first order) and `prefill` the prefill profile's result when `prices_prefill`."""
        ...


@runtime_checkable
class ExpectsRemotePrefill(Protocol):
    """A prefill decider that can say, before the decode pod is chosen, how likely a request is to
    be split (`pd-latency-decider`): the decode profile's latency scorer then prices a decode pod
    for the prefill it is expected to run, not for one on itself."""

    def expected_remote(self, request: InferenceRequest) -> RemotePrefill | None: ...


def prompt_tokens(request: InferenceRequest) -> int:
    """The prompt's length in tokens: its token ids when tokenized, else epp's estimate."""
    return len(request.token_ids) if request.token_ids else request.prompt_tokens_estimate


def cached_tokens(
    cycle: interfaces.CycleState, scorers: Sequence[interfaces.Scorer], endpoint: Endpoint
) -> int | None:
    """The prompt tokens `endpoint` holds, as the first prefix scorer among `scorers` found when it
    scored the request in `cycle`; None when there is no prefix scorer."""
    for scorer in map(_producer_of, scorers):
        if isinstance(scorer, precise_prefix_cache_scorer.PrecisePrefixCacheScorer):
            found = cycle.get(scorer.name)
            if not isinstance(found, precise_prefix_cache_scorer.PrefixMatch):
                return 0
            held = found.matches.get(endpoint.name)
            size = found.block_sizes.get(endpoint.name, found.block_size)
            return held.blocks * size if held is not None else 0
        if isinstance(scorer, prefix_cache_scorer.PrefixCacheScorer):
            matches: Mapping[Endpoint, int] = cycle.get(prefix_cache_scorer.matches_key(scorer.name), {})
            return matches.get(endpoint, 0) * scorer.block_tokens
    return None


def prefix_scorer(scorers: Sequence[interfaces.Scorer]) -> interfaces.Scorer | None:
    """The first prefix scorer among `scorers` (the one `cached_tokens` reads), if any."""
    kinds = (precise_prefix_cache_scorer.PrecisePrefixCacheScorer, prefix_cache_scorer.PrefixCacheScorer)
    return next((s for s in map(_producer_of, scorers) if isinstance(s, kinds)), None)


def _producer_of(scorer: interfaces.Scorer) -> interfaces.Scorer:
    """llm-d v0.9+'s prefix-cache-scorer reads a producer (epp.scheduling.producers), which holds the
    match: the producer; any other scorer itself."""
    return scorer.source if isinstance(scorer, prefix_match_scorer.PrefixMatchScorer) else scorer


class _DeciderBase(registry.PluginBase):
    prices_prefill: ClassVar[bool] = False
    # Set by the scheduler: the decode profile's scorers (where the prefix match is read).
    decode_scorers: Sequence[interfaces.Scorer] = ()


@registry.register("prefix-based-pd-decider")
class PrefixBasedPDDecider(_DeciderBase):
    consumes_tokens: ClassVar[bool] = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        nonCachedTokens: Annotated[int, msgspec.Meta(ge=0)] = 0
        promptTokens: Annotated[int, msgspec.Meta(ge=0)] = 0

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self.non_cached = params.nonCachedTokens
        self.min_prompt = params.promptTokens
        self.config_notes: tuple[str, ...] = ()
        if not self.non_cached:
            self.config_notes = (f"plugin {name!r} (type {self.type!r}): nonCachedTokens 0 never splits",)

    def disaggregate(
        self,
        cycle: interfaces.CycleState,
        request: InferenceRequest,
        decode: Endpoint | None,
        prefill: interfaces.ProfileResult | None,
    ) -> bool:
        if not self.non_cached or decode is None:
            return False
        tokens = prompt_tokens(request)
        if tokens < self.min_prompt or tokens < self.non_cached:
            return False
        held = cached_tokens(cycle, self.decode_scorers, decode)
        if held is None:
            return False
        return tokens - held >= self.non_cached


@registry.register("always-disagg-pd-decider")
class AlwaysDisaggPDDecider(_DeciderBase):
    def disaggregate(
        self,
        cycle: interfaces.CycleState,
        request: InferenceRequest,
        decode: Endpoint | None,
        prefill: interfaces.ProfileResult | None,
    ) -> bool:
        return True


MULTIMODAL_PARTS = frozenset({"image_url", "video_url", "input_audio", "audio_url"})


@registry.register("always-disagg-multimodal-decider")
class AlwaysDisaggMultimodalDecider(_DeciderBase):
    def disaggregate(
        self,
        cycle: interfaces.CycleState,
        request: InferenceRequest,
        decode: Endpoint | None,
        prefill: interfaces.ProfileResult | None,
    ) -> bool:
        return is_multimodal(request.body_bytes)


class _TypedPart(msgspec.Struct):
    type: str = ""


class _Message(msgspec.Struct):
    content: str | list[_TypedPart | str] | None = None


class _Chat(msgspec.Struct):
    messages: list[_Message] = []


_CHAT = msgspec.json.Decoder(_Chat)
_MARKERS = tuple(f'"{t}"'.encode() for t in sorted(MULTIMODAL_PARTS))


def is_multimodal(body: bytes) -> bool:
    """Whether a chat body carries an image, video or audio content part. A byte search rules
    out the common text-only body without decoding it; a candidate is decoded for its parts'
    types only (msgspec skips the rest, base64 images included)."""
    if not any(marker in body for marker in _MARKERS):
        return False
    try:
        chat = _CHAT.decode(body)
    except msgspec.DecodeError:
        return False
    return any(
        isinstance(part, _TypedPart) and part.type in MULTIMODAL_PARTS
        for message in chat.messages
        if isinstance(message.content, list)
        for part in message.content
    )


@registry.register("dynamo-pd-decider")
class DynamoPDDecider(_DeciderBase):
    """Dynamo's conditional disaggregation (its `DisaggregatedRouter`), as a decider: prefill
    remotely when the prompt's tokens the decode pod does not hold exceed
    `maxLocalPrefillLength` (Dynamo's default 1000) and the prefill queue is shorter than
    `maxPrefillQueueDepth` (the prefill pods' scraped waiting requests, summed; 0: no limit).
    A peer's rule, for `epp bench pd` to compare against."""

    consumes_tokens: ClassVar[bool] = True

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        maxLocalPrefillLength: Annotated[int, msgspec.Meta(ge=0)] = 1000
        maxPrefillQueueDepth: Annotated[int, msgspec.Meta(ge=0)] = 8

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self.max_local = params.maxLocalPrefillLength
        self.max_queue = params.maxPrefillQueueDepth
        self._datastore = handle.datastore

    def disaggregate(
        self,
        cycle: interfaces.CycleState,
        request: InferenceRequest,
        decode: Endpoint | None,
        prefill: interfaces.ProfileResult | None,
    ) -> bool:
        if decode is None:
            return False
        held = cached_tokens(cycle, self.decode_scorers, decode) or 0
        if prompt_tokens(request) - held <= self.max_local:
            return False
        if self.max_queue:
            queued = sum(
                ep.metrics.waiting
                for ep in self._datastore.endpoints()
                if ep.spec.labels.get(ROLE_LABEL) in PREFILL_ROLES
            )
            if queued >= self.max_queue:
                return False
        return True
