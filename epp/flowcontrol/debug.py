"""What /debug/flow-control shows of a flow controller: its limits, saturation, bands and flows
(the first 100 of each band), outcomes and programs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from epp import clock
from epp.flowcontrol.fair_share import FairShare

if TYPE_CHECKING:
    from epp.flowcontrol.controller import FlowController


def snapshot(fc: FlowController) -> dict[str, Any]:
    """The state behind /debug/flow-control, of `fc`."""
    now = clock.now()
    config = fc.config
    bands = []
    for band in fc.registry.ordered:
        flows = []
        for flow_id in band.flow_ids[:100]:
            queue = band.flows[flow_id]
            head = queue.head()
            flows.append(
                {
                    "fairness_id": flow_id,
                    "requests": queue.len,
                    "bytes": queue.bytes,
                    "oldest_wait_s": round(max(now - i.enqueued for i in queue.items()), 3) if head else 0.0,
                }
            )
        entry: dict[str, Any] = {
            "priority": band.priority,
            "requests": band.len,
            "bytes": band.bytes,
            "max_requests": band.max_requests,
            "max_bytes": band.max_bytes,
            "fairness": band.fairness.type,
            "ordering": band.ordering.type,
            "flows": flows,
            "flows_total": len(band.flows),
        }
        if isinstance(band.fairness, FairShare):  # what it weighs: each tenant's routed requests
            entry["in_flight"] = dict(sorted(band.state.inflight.items(), key=lambda kv: -kv[1])[:100])
        bands.append(entry)
    outcomes: dict[str, int] = {}
    for (outcome, _), n in fc.stats.outcomes.items():
        outcomes[outcome] = outcomes.get(outcome, 0) + n
    return {
        "pool": fc.pool_name,
        "closed": fc.closed,
        "queued_requests": fc.registry.len,
        "queued_bytes": fc.registry.bytes,
        "max_requests": fc.registry.max_requests,
        "max_bytes": fc.registry.max_bytes,
        "default_request_ttl_s": config.default_request_ttl,
        "no_endpoint_request_ttl_s": config.no_endpoint_request_ttl,
        "pool_empty": fc.pool_empty,
        "saturation": {k: round(v, 4) for k, v in fc.saturations.items()},
        "detector": fc.detector.name,
        "stale_endpoints": fc.stale,
        "dispatch_halted": fc.halted or None,
        "usage_limit_policy": config.usage_limit.type,
        "bands": bands,
        "outcomes": outcomes,
        "programs": {
            policy.name: {
                "programs": len(policy.programs),
                "jains_fairness_index": round(policy.jains_index(), 4),
            }
            for policy in config.programs
        },
    }
