"""One explanation of a routing decision, shared by the gRPC API and its HTTP JSON twin.

The payload is a plain dict whose keys are the proto field names of `epp.v1.ExplainResponse` /
`ListEndpointsResponse`, so the gRPC answer is this dict parsed into the message and the HTTP
answer is the same dict as JSON: the two cannot drift apart.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from epp.datastore.endpoints import Datastore
from epp.requestcontrol.director import Director
from epp.scheduling.interfaces import SchedulingResult


async def explain(
    director: Director, *, path: str, headers: Mapping[str, str], body: bytes
) -> dict[str, Any]:
    """Raises `epp.api.errors.RequestError` exactly as routing the request would."""
    request, result = await director.explain(path=path, headers=headers, body=body)
    weights, rows, per_plugin, facts = _profile(director, result, result.primary)
    targets = [ep.hostport for ep in result.targets]
    about = facts.get("request", {})
    payload: dict[str, Any] = {
        "model": request.model,
        "target_model": request.target_model,
        "profile": result.primary,
        "targets": targets,
        "pick": targets[0] if targets else "",
        "weights": weights,
        "endpoints": rows,
        "prompt_tokens_estimate": request.prompt_tokens_estimate,
        "request_blocks": about.get("request_blocks", 0),
        "request_tokens": about.get("request_tokens", 0),
        "block_size": about.get("block_size", 0),
        "request_terms": {plugin: own["request"] for plugin, own in per_plugin.items() if own.get("request")},
    }
    stages = []
    for stage, pods in result.stages.items():
        name = next(
            (n for n, r in result.profiles.items() if n != result.primary and r.targets[:1] == pods[:1]), ""
        )
        if not name:
            continue
        s_weights, s_rows, s_plugins, _ = _profile(director, result, name)
        hostports = [ep.hostport for ep in result.profiles[name].targets]
        stages.append(
            {
                "stage": stage,
                "profile": name,
                "targets": hostports,
                "pick": ",".join(ep.hostport for ep in pods),
                "endpoints": s_rows,
                "weights": s_weights,
                "request_terms": {p: own["request"] for p, own in s_plugins.items() if own.get("request")},
            }
        )
    payload["stages"] = stages
    payload["disaggregation"] = result.cycle.get("epp.disagg/decision") or {}
    return payload


def _profile(
    director: Director, result: SchedulingResult, name: str
) -> tuple[dict[str, float], list[dict[str, Any]], dict[str, dict[str, Any]], dict[str, Any]]:
    """One profile's weights, per-endpoint rows (best total first), explainers and facts."""
    profile_result = result.profiles[name]
    weights: dict[str, float] = {}
    for profile in director.scheduler.profiles:
        if profile.name == name:
            weights = {scorer.name: weight for scorer, weight in profile.scorers}
    facts = profile_result.facts
    per_endpoint = facts.get("endpoints", {})
    per_plugin: dict[str, dict[str, Any]] = facts.get("plugins", {})
    rows = []
    for name, scores in profile_result.scores.items():
        ep = director.datastore.get(name)
        address = ep.hostport if ep is not None else ""
        found = per_endpoint.get(name, {})
        rows.append(
            {
                "name": name,
                "address": address,
                "endpoint": address,
                "total": sum(score * weights.get(scorer, 1.0) for scorer, score in scores.items()),
                "scores": scores,
                "matched_blocks": found.get("matched_blocks", 0),
                "tier": found.get("tier", ""),
                "cached_tokens": found.get("cached_tokens", 0),
                "terms": {
                    plugin: own["endpoints"][name]
                    for plugin, own in per_plugin.items()
                    if name in own.get("endpoints", {})
                },
            }
        )
    rows.sort(key=lambda row: row["total"], reverse=True)
    return weights, rows, per_plugin, facts


def list_endpoints(datastore: Datastore) -> dict[str, Any]:
    now = time.monotonic()
    routable = {id(ep) for ep in datastore.candidates()}
    out = []
    for ep in sorted(datastore.endpoints(), key=lambda e: e.name):
        age = ep.metrics_age(now)
        out.append(
            {
                "name": ep.name,
                "address": ep.hostport,
                "rank": ep.spec.rank,
                "routable": id(ep) in routable,
                "waiting": ep.metrics.waiting,
                "running": ep.metrics.running,
                "kv_usage": ep.metrics.kv_usage,
                "metrics_age_seconds": age if age != float("inf") else -1.0,
                "inflight_requests": ep.inflight_requests,
                "inflight_tokens": ep.inflight_tokens,
            }
        )
    return {"endpoints": out}
