"""Builders for scheduling tests: endpoints with given metrics, requests, plugins by type."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import epp.scheduling.plugins  # noqa: F401  (importing it registers the built-in plugins)
from epp.api.requests import Api, InferenceRequest
from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.kvcache.index import BlockIndex
from epp.scheduling import interfaces, registry


def endpoint(
    name: str,
    *,
    address: str = "10.0.0.1",
    port: int = 8000,
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.0,
    max_lora: int = 0,
    running_loras: Iterable[str] = (),
    waiting_loras: Iterable[str] = (),
    inflight_requests: int = 0,
    inflight_tokens: int = 0,
) -> Endpoint:
    spec = EndpointSpec(name=name, address=address, port=port)
    ep = Endpoint(spec=spec, hostport=spec.hostport)
    m = ep.metrics
    m.waiting, m.running, m.kv_usage, m.max_lora = waiting, running, kv, max_lora
    m.running_loras, m.waiting_loras = frozenset(running_loras), frozenset(waiting_loras)
    ep.inflight_requests, ep.inflight_tokens = inflight_requests, inflight_tokens
    return ep


def pool(n: int) -> list[Endpoint]:
    return [endpoint(f"pod-{i}", address=f"10.0.0.{i + 1}") for i in range(n)]


def request(*, headers: Mapping[str, str] | None = None, target_model: str = "base") -> InferenceRequest:
    return InferenceRequest(
        request_id="req-1",
        api=Api.CHAT,
        path="/v1/chat/completions",
        headers=dict(headers or {}),
        model=target_model,
        target_model=target_model,
    )


def handle(index: BlockIndex | None = None) -> interfaces.Handle:
    """A handle with a fresh datastore, and `index` as the KV index (None: KV events off)."""
    return interfaces.Handle(datastore=Datastore(), kv_index=index)


def plugin(type_name: str, parameters: Mapping[str, Any] | None = None, *, name: str = "") -> Any:
    """A built-in plugin built as the config would build it (typed Any: tests call its methods)."""
    return registry.default.build(type_name, name or type_name, parameters, handle(BlockIndex()))


def scored(*pairs: tuple[Endpoint, float]) -> list[interfaces.ScoredEndpoint]:
    return [interfaces.ScoredEndpoint(ep, score) for ep, score in pairs]
