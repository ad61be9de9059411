"""Envoy 1.40 bootstrap configs for a front gateway that asks epp where to send each request.

The generator returns a plain dict (the bootstrap as YAML would spell it), so tests can inspect it
and `write_config` can dump it; nothing here imports Envoy's protos. Its parts live beside it:
params (`GatewayParams` and the shared names), clusters, filters (ext_proc, route, access log),
doors (header stripping, the destination guard), fragments, and launch (running the binary); this
module re-exports the parameters and the launcher, where callers import them from. Every variant is checked by
`envoy --mode validate` in tests/gateway/, which is the only reliable source of field names.

Three ways to reach the model servers ("pods"), picked by `PodsMode`:

* ``ORIGINAL_DST`` (default, as GIE's standalone Envoy): an ORIGINAL_DST cluster that connects to
  whatever ``ip:port`` the header ``x-gateway-destination-endpoint`` names. One endpoint only, no
  list of pods needed, no fallback.
* ``OVERRIDE_HOST``: a STATIC cluster of the known pods with the ``override_host`` load-balancing
  policy. It reads the ordered, comma-separated list epp returns (``envoy.lb`` metadata and the
  header) and, together with a route retry policy, walks down that list when an attempt fails.
* ``ROUND_ROBIN``: a STATIC round-robin cluster with no ext_proc filter at all: the baseline for
  benchmarks and the demo's "without epp" arm.

Closed doors (docs/security.md): the control headers epp reads or writes
(``CONTROL_HEADERS``: destination, served, subset, model-name rewrite) are removed from client
requests before routing and before any filter (the HCM's early header mutation), unless
``client_control_headers`` lets one through for a trusted front proxy. With ORIGINAL_DST an RBAC
filter after ext_proc refuses (403) a destination on Envoy's own admin port, or on its listener
port at a loopback address: with ``failure_mode_allow`` and epp down nothing else would stand
between a forwarded client header and the admin page.

Envoy facts this module relies on (found by running the 1.40 binary):

* ``FULL_DUPLEX_STREAMED`` in a direction requires that direction's trailer mode to be ``SEND``.
* ``metadata_options.receiving_namespaces.untyped`` must list ``envoy.lb`` or Envoy drops the
  dynamic metadata epp returns.
* ``override_host`` concatenates the hosts of *all* its sources: with both metadata and header
  configured, epp's list ``a,b`` becomes ``a,b,a,b``. Retries therefore cycle through the list
  (the ``previous_hosts`` retry predicate skips hosts already tried) before falling back to the
  fallback policy.
* ``allow_mode_override``: Envoy honours a ``mode_override`` only on the answer to request or
  response *headers*, and ignores it whenever the request or response body mode is
  ``FULL_DUPLEX_STREAMED`` (GIE's config). With request body ``BUFFERED`` and response body
  ``STREAMED`` an override to response body ``NONE`` stops the body; Envoy then ends the ext_proc
  stream when the HTTP stream ends (a few ms at most, docs/bench/overhead.md#mode-override), alike
  for a finished response and a client reset. A ``BUFFERED`` request body over the listener's buffer
  limit (1 MiB by default) is answered 413 by Envoy itself.
* ``failure_mode_allow`` with a ``FULL_DUPLEX_STREAMED`` request body fails open only until the
  first body chunk has gone to the ext_proc server: a POST with epp down got 503, not a pod
  (e2e/test_routing.py runs the BUFFERED case). `GatewayParams` refuses the combination.
* Envoy sets ``PR_SET_PDEATHSIG``: the process that starts it must stay alive; and two Envoys on
  one machine need distinct ``--base-id`` values, which `start_envoy` requires.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from epp.gateway.clusters import ext_proc_cluster, pods_cluster
from epp.gateway.doors import destination_guard, strip_control_headers
from epp.gateway.filters import (
    access_log_config,
    catch_all_route,
    ext_proc_filter,
    listener_buffer_limit,
    local_replies,
)
from epp.gateway.fragments import HCM_TYPE, TYPE_URL, admin_config, overload_manager, socket_address

# Callers import the parameters and the launcher from here too (the `X as X` re-exports).
from epp.gateway.launch import envoy_version as envoy_version
from epp.gateway.launch import find_envoy as find_envoy
from epp.gateway.launch import require_envoy as require_envoy
from epp.gateway.launch import start_envoy as start_envoy
from epp.gateway.launch import stop_process as stop_process
from epp.gateway.launch import unique_base_id as unique_base_id
from epp.gateway.launch import validate_config as validate_config
from epp.gateway.launch import wait_envoy_ready as wait_envoy_ready
from epp.gateway.params import CONTROL_HEADERS as CONTROL_HEADERS
from epp.gateway.params import DESTINATION_HEADER as DESTINATION_HEADER
from epp.gateway.params import EXT_PROC_CLUSTER as EXT_PROC_CLUSTER
from epp.gateway.params import EXT_PROC_SERVICE as EXT_PROC_SERVICE
from epp.gateway.params import LB_NAMESPACE as LB_NAMESPACE
from epp.gateway.params import MODEL_REWRITE_HEADER as MODEL_REWRITE_HEADER
from epp.gateway.params import PODS_CLUSTER as PODS_CLUSTER
from epp.gateway.params import REQUEST_BODY_MODES as REQUEST_BODY_MODES
from epp.gateway.params import SERVED_KEY as SERVED_KEY
from epp.gateway.params import SUBSET_HEADER as SUBSET_HEADER
from epp.gateway.params import BodyMode as BodyMode
from epp.gateway.params import GatewayParams as GatewayParams
from epp.gateway.params import PodsMode as PodsMode
from epp.gateway.params import override_params as override_params
from epp.gateway.params import split_host_port as split_host_port


def gateway_config(params: GatewayParams) -> dict[str, Any]:
    """The Envoy bootstrap (as a dict) for the front gateway described by `params`."""
    http_filters: list[dict[str, Any]] = []
    if params.pods_mode is not PodsMode.ROUND_ROBIN:
        http_filters.append(ext_proc_filter(params))
    if params.pods_mode is PodsMode.ORIGINAL_DST:
        http_filters.append(destination_guard(params))
    http_filters.append(
        {
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": TYPE_URL + "envoy.extensions.filters.http.router.v3.Router"},
        }
    )
    hcm: dict[str, Any] = {
        "@type": HCM_TYPE,
        "stat_prefix": "gateway",
        "route_config": {
            "name": "gateway",
            "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [catch_all_route(params)]}],
        },
        "http_filters": http_filters,
    }
    if early := strip_control_headers(params):
        hcm["early_header_mutation_extensions"] = early
    if params.request_timeout:
        hcm["request_timeout"] = f"{params.request_timeout:g}s"
    if params.request_headers_timeout:
        hcm["request_headers_timeout"] = f"{params.request_headers_timeout:g}s"
    if params.access_log_path:
        hcm["access_log"] = access_log_config(params.access_log_path)
    if params.pods_mode is not PodsMode.ROUND_ROBIN:
        hcm["local_reply_config"] = local_replies(params)
    hcm["http2_protocol_options"] = {"max_concurrent_streams": params.max_streams_per_client_connection}
    clusters = [pods_cluster(params)]
    if params.pods_mode is not PodsMode.ROUND_ROBIN:
        clusters.insert(0, ext_proc_cluster(params))
    return {
        "admin": admin_config(params.admin_address, params.admin_port),
        "overload_manager": overload_manager(params.max_downstream_connections, params.max_heap_bytes),
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": socket_address(params.listen_address, params.listen_port),
                    **listener_buffer_limit(params),
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }


# A vLLM-like /metrics text for backends that answer with a fixed body (benchmarks): epp's scraper
# gets an idle server, so scoring does real work but no endpoint is ever excluded.
STATIC_BACKEND_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="bench-model"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="bench-model"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="bench-model"} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="8192"} 1.0
"""

STATIC_BACKEND_BODY = (
    '{"id":"cmpl-bench","object":"chat.completion","created":0,"model":"bench-model",'
    '"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":1000,"completion_tokens":1,"total_tokens":1001,'
    '"prompt_tokens_details":{"cached_tokens":0}}}'
)


def static_backends_config(
    ports: Sequence[int],
    admin_port: int,
    *,
    address: str = "127.0.0.1",
    body: str = STATIC_BACKEND_BODY,
    metrics: str = STATIC_BACKEND_METRICS,
) -> dict[str, Any]:
    """An Envoy that plays N model servers with `direct_response` listeners, one per port.

    Backend cost is then small and identical in every benchmark arm. GET /metrics answers a
    fixed vLLM exposition so epp's scraper keeps the endpoints routable.
    """

    def listener(port: int) -> dict[str, Any]:
        routes = [
            {
                "match": {"path": "/metrics"},
                "direct_response": {"status": 200, "body": {"inline_string": metrics}},
            },
            {
                "match": {"prefix": "/"},
                "direct_response": {"status": 200, "body": {"inline_string": body}},
                "response_headers_to_add": [
                    {
                        "header": {"key": "content-type", "value": "application/json"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                    },
                    {
                        "header": {"key": "x-sim-server", "value": f"{address}:{port}"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                    },
                ],
            },
        ]
        hcm = {
            "@type": HCM_TYPE,
            "stat_prefix": f"backend_{port}",
            "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
            "http_filters": [
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": TYPE_URL + "envoy.extensions.filters.http.router.v3.Router"},
                }
            ],
        }
        return {
            "name": f"backend_{port}",
            "address": socket_address(address, port),
            "filter_chains": [
                {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
            ],
        }

    return {
        "admin": admin_config(address, admin_port),
        "overload_manager": overload_manager(50_000),
        "static_resources": {"listeners": [listener(p) for p in ports]},
    }


def dump_config(config: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False)


def write_config(path: str | os.PathLike[str], params: GatewayParams | Mapping[str, Any]) -> Path:
    """Write the gateway config for `params` (or an already built bootstrap dict) as YAML."""
    config = gateway_config(params) if isinstance(params, GatewayParams) else params
    out = Path(path)
    out.write_text(dump_config(config), encoding="utf-8")
    return out
