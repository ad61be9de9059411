"""The gateway listener's parts: the ext_proc HTTP filter, the catch-all route (with override_host
retries), the access log and the listener's buffer limit."""

from __future__ import annotations

from typing import Any

from epp.gateway.fragments import TYPE_URL, duration
from epp.gateway.params import EXT_PROC_CLUSTER, LB_NAMESPACE, PODS_CLUSTER, BodyMode, GatewayParams, PodsMode


def ext_proc_filter(params: GatewayParams) -> dict[str, Any]:
    duplex_request = params.body_mode is BodyMode.FULL_DUPLEX_STREAMED
    mode: dict[str, str] = {
        "request_header_mode": "SEND",
        "request_body_mode": str(params.body_mode),
        "request_trailer_mode": "SEND" if duplex_request else "SKIP",
    }
    if params.process_responses:
        duplex_response = params.response_body_mode is BodyMode.FULL_DUPLEX_STREAMED
        mode |= {
            "response_header_mode": "SEND",
            "response_body_mode": str(params.response_body_mode),
            "response_trailer_mode": "SEND" if duplex_response else "SKIP",
        }
    else:
        mode |= {
            "response_header_mode": "SKIP",
            "response_body_mode": "NONE",
            "response_trailer_mode": "SKIP",
        }
    metadata_options: dict[str, Any] = {"receiving_namespaces": {"untyped": [LB_NAMESPACE]}}
    if params.forward_lb_metadata:
        metadata_options["forwarding_namespaces"] = {"untyped": [LB_NAMESPACE]}
    typed_config: dict[str, Any] = {
        "@type": TYPE_URL + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {
            "envoy_grpc": {"cluster_name": EXT_PROC_CLUSTER},
            # Envoy 1.40 does not cut the ext_proc stream at this deadline (a 3 s streamed
            # response outlived a 1 s value in a test); it is kept at the route timeout so
            # that an Envoy which did apply it could not cut long responses either.
            "timeout": duration(params.route_timeout),
            **_retries(params),
        },
        "failure_mode_allow": params.failure_mode_allow,
        "status_on_error": {"code": params.epp_status_on_error},
        "message_timeout": duration(params.message_timeout),
        "max_message_timeout": duration(params.max_message_timeout),
        "processing_mode": mode,
        "metadata_options": metadata_options,
    }
    if duplex_request:
        # Bodies stream into epp as they arrive: it bounds the unfinished ones per client
        # connection, which this names (`epp serve --max-unfinished-bodies-per-connection`).
        typed_config["request_attributes"] = ["connection.id"]
    if params.mode_override:
        typed_config["allow_mode_override"] = True
    return {"name": "envoy.filters.http.ext_proc", "typed_config": typed_config}


def _retries(params: GatewayParams) -> dict[str, Any]:
    """The ext-proc stream's retry policy (`GatewayParams.epp_retries`): only failures before
    epp answered (a refused or reset connection, UNAVAILABLE, or CANCELLED: a stream that reached
    a stopping epp as its gRPC server shut down is cancelled by gRPC before epp sees it, one in
    ~12 restarts under a steady client), never RESOURCE_EXHAUSTED (an overloaded epp is not asked
    again at once). Envoy retries a stream only until its first answer's headers, so a stream epp
    was already answering is never sent twice. None with `failure_mode_allow`: the request is to
    go on without epp at once then."""
    if not params.epp_retries or params.failure_mode_allow:
        return {}
    return {
        "retry_policy": {
            "retry_on": "connect-failure,refused-stream,reset,unavailable,cancelled",
            "num_retries": params.epp_retries,
            "retry_back_off": {
                "base_interval": duration(params.epp_retry_base_interval),
                "max_interval": duration(params.epp_retry_max_interval),
            },
        }
    }


# Envoy's own answers (its local replies) in the OpenAI error shape epp's answers have
# (`epp.api.errors.error_body`). epp's own answers (ImmediateResponse, details "epp") pass as
# they are. An ext-proc failure says that epp could not decide, with `status_on_error`'s status
# for every kind: Envoy answers a stream epp did not answer within `message_timeout` 504
# (`ext_proc_error_per-message_timeout_exceeded`) whatever `status_on_error` says, and that is
# what a burst of new streams past what epp picks up in time gets: an overloaded epp, which
# clients should see as the 503 its other overload answers are. Anything else Envoy answers
# itself (its overload, an upstream timeout, a body over its buffer, no upstream) keeps its status
# and Envoy's text, with the response code details.
_NOT_EPPS = "response.code_details != 'epp'"
# Also a complete request that idled out before any upstream was chosen: it was waiting for
# epp's answer, which Envoy's message_timeout does not bound in FULL_DUPLEX_STREAMED, and which
# under heap pressure outlasts the stream idle timeout the overload manager scales down
# (`fragments.overload_manager`): 10,000 streams at once got 504 `stream_idle_timeout` so. A
# request still uploading idles out as 408, and one an upstream left waiting keeps its 504.
_EXT_PROC_FAILED = (
    "response.code_details.startsWith('ext_proc_error') || (response.code_details == 'stream_idle_timeout'"
    " && response.code == 504 && !has(upstream.address))"
)


def _cel(expression: str) -> dict[str, Any]:
    return {
        "extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {
                "@type": TYPE_URL + "envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                "expression": expression,
            },
        }
    }


def _openai_error(message: str, kind: str) -> dict[str, Any]:
    return {
        "json_format": {"error": {"message": message, "type": kind, "code": "%RESPONSE_CODE%"}},
        "content_type": "application/json",
    }


def local_replies(params: GatewayParams) -> dict[str, Any]:
    return {
        "mappers": [
            {
                "filter": _cel(_EXT_PROC_FAILED),
                "status_code": params.epp_status_on_error,
                "body_format_override": _openai_error(
                    "the endpoint picker (epp) could not route the request: it is unreachable, "
                    "restarting or overloaded; retry (%RESPONSE_CODE_DETAILS%)",
                    "service_unavailable",
                ),
            },
            {
                "filter": _cel(_NOT_EPPS),
                "body_format_override": _openai_error(
                    "%LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)", "gateway_error"
                ),
            },
        ]
    }


def catch_all_route(params: GatewayParams) -> dict[str, Any]:
    route: dict[str, Any] = {"cluster": PODS_CLUSTER, "timeout": duration(params.route_timeout)}
    if params.pods_mode is PodsMode.OVERRIDE_HOST and params.num_retries > 0:
        route["retry_policy"] = {
            "retry_on": params.retry_on,
            "num_retries": params.num_retries,
            # override_host hands out the next listed host per attempt; this predicate only
            # matters once the list repeats or the least-request fallback takes over.
            "retry_host_predicate": [
                {
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {
                        "@type": TYPE_URL
                        + "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
                    },
                }
            ],
            "host_selection_retry_max_attempts": 5,
        }
    return {"match": {"prefix": "/"}, "route": route}


def access_log_config(path: str) -> list[dict[str, Any]]:
    fmt = (
        '[%START_TIME%] "%REQ(:METHOD)% %REQ(:PATH)%" %RESPONSE_CODE% %RESPONSE_FLAGS% '
        "upstream=%UPSTREAM_HOST% attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% "
        'dest="%REQ(X-GATEWAY-DESTINATION-ENDPOINT)%" dur=%DURATION%ms details=%RESPONSE_CODE_DETAILS%\n'
    )
    return [
        {
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": TYPE_URL + "envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": path,
                "log_format": {"text_format_source": {"inline_string": fmt}},
            },
        }
    ]


def listener_buffer_limit(params: GatewayParams) -> dict[str, Any]:
    if params.body_mode is BodyMode.BUFFERED and params.pods_mode is not PodsMode.ROUND_ROBIN:
        return {"per_connection_buffer_limit_bytes": params.max_request_body_bytes}
    return {}
