"""Session affinity as llm-d v0.10 has it: `session-affinity-scorer` and `session-affinity-filter`
(Alpha), and the `session-id-producer` they may read.

Two strategies (`strategy`), both as llm-d's:

- `encoded_endpoint_header` (the default): the response carries the endpoint that served the
  request, base64-encoded, in `encodedEndpointHeaderConfig.header` (`x-session-token`); a client
  that sends it back is pinned there. The endpoint is named as llm-d names it: the pod's
  `namespace/name`, where `name` is `<pod>-rank-<i>` for Kubernetes pods (epp's endpoint name);
  endpoints without a namespace (epp's `--endpoints`) by their name alone.
- `session_id`: the request's session identifier, read from `sessionIdConfig.sources` in order
  (`header: <name>`, or `attribute: <key>` with an optional `producer`: `agent-identity`,
  `SessionIDDataKey` of `session-id-producer`; default one source, header `x-session-id`), is
  bound to the endpoint the session's first request went to. A binding unused for
  `evictionTtlSeconds` (300) is dropped (swept every `evictionSweepSeconds`, 10). A session whose
  endpoint is no longer a candidate expresses no preference, and moves to wherever that request
  is routed.

The scorer gives the session's endpoint 1.0 and the others 0 (no session: 0 everywhere); the
filter keeps only it (no session, or it is not a candidate: every candidate). `profileName` pins
the pick of that profile instead of the primary one (P/D: one instance per profile, each with
its own header).
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from epp import clock
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import framework, interfaces, registry

DEFAULT_TOKEN_HEADER = "x-session-token"
DEFAULT_SESSION_HEADER = "x-session-id"
SESSION_ID_TYPE = "SessionIDDataKey"  # llm-d's data type of session-id-producer's attribute


def endpoint_id(ep: Endpoint) -> str:
    """llm-d's endpoint identity: `namespace/name` (its NamespacedName's string)."""
    spec = ep.spec
    return f"{spec.namespace}/{spec.name}" if spec.namespace else spec.name


# ---- session-id-producer -------------------------------------------------------------------------


@registry.register("session-id-producer")
class SessionIdProducer(registry.PluginBase):
    """llm-d's `session-id-producer`: the value of a request header or of a named cookie, kept as the
    request attribute `SessionIDDataKey` of this producer. Exactly one of `headerName`,
    `cookieName`."""

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        headerName: str = ""
        cookieName: str = ""

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        header = params.headerName.strip().lower()
        cookie = params.cookieName.strip()
        if bool(header) == bool(cookie):
            raise registry.ConfigError(
                f"plugin {name!r} (type {self.type!r}) requires exactly one of headerName or cookieName"
            )
        self._header = header
        self._cookie = cookie

    def request_headers(self, request: InferenceRequest) -> None:
        if self._header:
            found = request.headers.get(self._header, "").strip()
        else:
            found = _cookie(request.headers.get("cookie", ""), self._cookie).strip()
        if found:
            request.attributes[(SESSION_ID_TYPE, self.name)] = found


def _cookie(header: str, name: str) -> str:
    for pair in header.split(";"):
        key, sep, value = pair.strip().partition("=")
        if sep and key == name:
            return value
    return ""


# ---- the scorer and the filter -------------------------------------------------------------------


class _Source(msgspec.Struct, forbid_unknown_fields=True):
    header: str = ""
    attribute: str = ""
    producer: str = ""


class _SessionIdConfig(msgspec.Struct, forbid_unknown_fields=True):
    sources: list[_Source] = []
    evictionTtlSeconds: float = 0.0
    evictionSweepSeconds: float = 0.0


class _HeaderConfig(msgspec.Struct, forbid_unknown_fields=True):
    header: str = ""


class _Bindings:
    """Session id -> (endpoint id, last use), least recently used first; swept of expired ones at
    most every `sweep` seconds, on use (epp runs no timer per plugin)."""

    def __init__(self, ttl: float, sweep: float) -> None:
        self._ttl = ttl
        self._sweep = sweep
        self._swept = clock.now()
        self._by_session: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def get(self, session: str) -> str:
        self._expire()
        found = self._by_session.get(session)
        return found[0] if found is not None else ""

    def bind(self, session: str, endpoint: str) -> None:
        self._by_session[session] = (endpoint, clock.now())
        self._by_session.move_to_end(session)

    def _expire(self) -> None:
        now = clock.now()
        if now - self._swept < self._sweep:
            return
        self._swept = now
        by = self._by_session
        while by:
            session, (_, used) = next(iter(by.items()))
            if now - used <= self._ttl:
                break
            del by[session]

    def __len__(self) -> int:
        return len(self._by_session)


class _SessionAffinity(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        strategy: Literal["encoded_endpoint_header", "session_id"] = "encoded_endpoint_header"
        encodedEndpointHeaderConfig: _HeaderConfig = msgspec.field(default_factory=_HeaderConfig)
        sessionIdConfig: _SessionIdConfig = msgspec.field(default_factory=_SessionIdConfig)
        profileName: str = ""

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        label = f"plugin {name!r} (type {self.type!r})"
        self.strategy = params.strategy
        self.profile = params.profileName
        self.token_header = (
            params.encodedEndpointHeaderConfig.header.strip() or DEFAULT_TOKEN_HEADER
        ).lower()
        config = params.sessionIdConfig
        sources: list[tuple[str, tuple[str, str]]] = []
        for i, source in enumerate(config.sources or [_Source(header=DEFAULT_SESSION_HEADER)]):
            if bool(source.header) == bool(source.attribute):
                raise registry.ConfigError(
                    f"{label}: parameter sessionIdConfig.sources[{i}]: exactly one of header or "
                    "attribute must be set"
                )
            if source.header:
                sources.append((source.header.strip().lower(), ("", "")))
            else:
                sources.append(("", (source.attribute, source.producer)))
        self._sources = sources
        ttl = config.evictionTtlSeconds or 300.0
        sweep = config.evictionSweepSeconds or 10.0
        if params.strategy == "session_id" and (ttl <= 0 or sweep <= 0):
            raise registry.ConfigError(
                f"{label}: parameter sessionIdConfig: evictionTtlSeconds and evictionSweepSeconds must be > 0"
            )
        self._bindings = _Bindings(ttl, sweep)
        # pre_request gets no CycleState; the Director calls it right after `schedule`.
        self._last: tuple[InferenceRequest, bool] | None = None

    def session(self, request: InferenceRequest) -> str:
        """The request's session identifier ("": none)."""
        for header, key in self._sources:
            value = request.headers.get(header, "") if header else request.attributes.get(key, "")
            if isinstance(value, str) and value.strip():
                return value.strip()
        return ""

    def chosen(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Endpoint | None:
        """The candidate the request is pinned to, if it is one of `endpoints`."""
        if self.strategy == "encoded_endpoint_header":
            token = request.headers.get(self.token_header, "")
            if not token:
                return None
            try:
                wanted = base64.b64decode(token, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return None
            return next((ep for ep in endpoints if endpoint_id(ep) == wanted), None)
        session = self.session(request)
        if not session:
            return None
        bound = self._bindings.get(session)
        target = next((ep for ep in endpoints if bound and endpoint_id(ep) == bound), None)
        # Recorded for pre_request: the session moves only when its endpoint was not a candidate.
        self._last = (request, bool(bound) and target is None)
        return target

    def pre_request(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        last, self._last = self._last, None
        if self.strategy != "session_id":
            return
        session = self.session(request)
        picked = self._picked(result)
        if not session or picked is None:
            return
        bound = self._bindings.get(session)
        moved = last is not None and last[0] is request and last[1]
        if not bound or bound == endpoint_id(picked) or moved:
            self._bindings.bind(session, endpoint_id(picked))

    def response_headers(
        self,
        request: InferenceRequest,
        result: interfaces.SchedulingResult,
        served: str | None,
        headers: Mapping[str, str],
    ) -> Mapping[str, str]:
        if self.strategy != "encoded_endpoint_header":
            return {}
        picked = self._picked(result)
        if picked is None:
            return {}
        return {self.token_header: base64.b64encode(endpoint_id(picked).encode()).decode()}

    def _picked(self, result: interfaces.SchedulingResult) -> Endpoint | None:
        profile = result.profiles.get(self.profile or result.primary)
        if profile is None and self.profile:
            pods = result.stages.get(self.profile)
            return pods[0] if pods else None
        return profile.targets[0] if profile is not None and profile.targets else None


@registry.register("session-affinity-scorer")
class SessionAffinityScorer(_SessionAffinity):
    def score(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[float]:
        target = self.chosen(request, endpoints)
        cycle[self.name] = target
        return [1.0 if ep is target else 0.0 for ep in endpoints]

    def explain(self, cycle: interfaces.CycleState) -> dict[str, Any]:
        pinned = cycle.get(self.name)
        return framework.explain_inputs(cycle, lambda ep: {"pinned": ep is pinned})


@registry.register("session-affinity-filter")
class SessionAffinityFilter(_SessionAffinity):
    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        target = self.chosen(request, endpoints)
        return [target] if target is not None else endpoints
