"""What varies between the gateway configs epp generates (`GatewayParams`, checked when built), and the
header, metadata and cluster names Envoy and epp share."""

from __future__ import annotations

import dataclasses
import enum

DESTINATION_HEADER = "x-gateway-destination-endpoint"
SERVED_KEY = "x-gateway-destination-endpoint-served"
SUBSET_HEADER = "x-gateway-destination-endpoint-subset"
MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
LLMD_MODEL_REWRITE_HEADER = "x-llm-d-model-name-rewrite"  # llm-d v0.10's name for the one above
# GIE's "system owned" request headers that steer routing or rewriting, and llm-d's new name of
# the rewrite. The other inputs, the inference objective and fairness id (x-gateway-* and
# x-llm-d-*), are the client's to choose, as in GIE and llm-d.
CONTROL_HEADERS = (
    DESTINATION_HEADER,
    SERVED_KEY,
    SUBSET_HEADER,
    MODEL_REWRITE_HEADER,
    LLMD_MODEL_REWRITE_HEADER,
)
LB_NAMESPACE = "envoy.lb"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"

EXT_PROC_CLUSTER = "epp_ext_proc"
PODS_CLUSTER = "pods"


class BodyMode(enum.StrEnum):
    """Envoy ext_proc body modes (the proto enum names)."""

    NONE = "NONE"
    STREAMED = "STREAMED"
    BUFFERED = "BUFFERED"
    FULL_DUPLEX_STREAMED = "FULL_DUPLEX_STREAMED"


# epp parses the whole request body before it answers, so it supports only these two.
REQUEST_BODY_MODES = (BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED)


class PodsMode(enum.StrEnum):
    ORIGINAL_DST = "original-dst"
    OVERRIDE_HOST = "override-host"
    ROUND_ROBIN = "round-robin"


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayParams:
    """Everything that varies between the gateway configs we run. Times are in seconds."""

    listen_port: int
    admin_port: int
    # host:port of each epp ext-proc server; Envoy spreads streams across them.
    epp_addresses: tuple[str, ...] = ("127.0.0.1:9002",)
    pods_mode: PodsMode = PodsMode.ORIGINAL_DST
    # host:port of each model server; required by OVERRIDE_HOST and ROUND_ROBIN.
    pod_endpoints: tuple[str, ...] = ()
    listen_address: str = "127.0.0.1"
    admin_address: str = "127.0.0.1"
    body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    # Response headers/body/trailers to epp (usage accounting, in-flight bookkeeping).
    process_responses: bool = True
    response_body_mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED
    # Let epp stop the response body per request (ext_proc allow_mode_override): off-sample
    # requests then cost epp a few messages instead of one per streamed chunk. Envoy 1.40 ignores
    # the override while either body mode is FULL_DUPLEX_STREAMED, so this needs request body
    # BUFFERED and response body STREAMED (`override_params` sets them).
    mode_override: bool = False
    # BUFFERED request bodies larger than the listener's buffer limit (Envoy's default 1 MiB)
    # are answered 413 by Envoy: raised to epp's --max-body-bytes default when buffering.
    max_request_body_bytes: int = 16 << 20
    # A client's whole request (headers and body, until epp has routed it) must arrive within
    # request_timeout, its headers within request_headers_timeout: slowloris requests are
    # answered 408 by Envoy and never held by epp (epp's own --request-body-timeout, 60 s, is
    # the backstop). 0 = no limit. The response is not bounded by these (see route_timeout).
    request_timeout: float = 60.0
    request_headers_timeout: float = 10.0
    epp_tls: bool = False
    epp_sni: str = ""  # "" = no SNI
    epp_health_check: bool = False
    epp_health_check_interval: float = 1.0
    # Failed checks in a row before Envoy stops sending epp new streams: 2 x 1 s stays within
    # `epp serve --drain-delay` (5 s), which keeps serving meanwhile. One slow check (a GC pause)
    # is not enough; a host wrongly marked comes back at its next good check (healthy_threshold 1).
    epp_health_check_unhealthy_threshold: int = 2
    # ext-proc streams per HTTP/2 connection to epp: past it Envoy opens another connection. An
    # `epp serve --workers N` pod spreads load per connection (SO_REUSEPORT), so a busy gateway
    # must open several; 0 = Envoy's default (no limit: one connection per worker thread).
    epp_streams_per_connection: int = 16
    # 200 ms (Envoy's default) is too tight for a Python server under GC; FULL_DUPLEX ignores it.
    message_timeout: float = 5.0
    # The most epp may extend message_timeout by for one message (override_message_timeout): flow
    # control holds a request up to its queue-wait budget and asks Envoy to wait that long. The
    # listener's request_timeout must exceed flowControl.defaultRequestTTL too (docs/flow-control.md).
    max_message_timeout: float = 3600.0  # Envoy's upper bound
    failure_mode_allow: bool = False
    # What Envoy answers when an ext-proc stream fails (epp unreachable, restarting, crashed,
    # gRPC's own limits, or no answer within message_timeout): this status (Envoy's defaults are
    # 500, and 504 for the timeout) with an OpenAI-shaped body naming the cause
    # (`filters.local_replies`), as epp's own overload answers are.
    epp_status_on_error: int = 503
    # A stream that cannot reach epp (connection refused, reset before epp answered, UNAVAILABLE)
    # is retried this many times, with exponential back-off (jittered) from the base interval to
    # the max: a lone epp restarting holds new requests for a few seconds (~8 s on average in
    # all, ~17 s at most) rather than failing them. Safe: epp has not answered such a stream, so it
    # has booked nothing. 0: no retries. The max was 1 s (~4.5 s in all): a restart on a loaded
    # 2-core machine (old process drained, new one importing and binding) then outlasted the
    # retries once in CI.
    epp_retries: int = 10
    epp_retry_base_interval: float = 0.25
    epp_retry_max_interval: float = 2.0
    # CONTROL_HEADERS a client may send (e.g. a trusted proxy in front sets the model rewrite);
    # the others are removed from every request before Envoy routes it.
    client_control_headers: tuple[str, ...] = ()
    # Send envoy.lb dynamic metadata (e.g. x-gateway-destination-endpoint-served) to epp.
    forward_lb_metadata: bool = True
    route_timeout: float = 300.0
    connect_timeout: float = 1.0
    # OVERRIDE_HOST only: how many times to move down epp's endpoint list.
    num_retries: int = 2
    retry_on: str = "connect-failure,refused-stream,reset,5xx"
    # ORIGINAL_DST only: route on envoy.lb metadata instead of the header.
    original_dst_use_metadata: bool = False
    access_log_path: str = ""  # "" = no access log
    max_downstream_connections: int = 50_000
    # Envoy's heap bound (its overload manager; 0: none): from 80% of it the streams buffering the
    # most (1 MiB or more) are reset, at 95% new requests are answered 503. Unfinished request
    # bodies held in Envoy (BUFFERED mode) are what grows it: 70 unfinished 15 MiB uploads took an
    # unbounded Envoy to 1.15 GB. The default fits the chart's 1 GiB limit with room for what
    # the heap does not count (docs/security.md).
    max_heap_bytes: int = 768 << 20
    # Streams one client connection may have open at once (HTTP/2; Envoy's default is 2^31-1):
    # with the listener's buffer limit, what one connection's unfinished bodies can hold.
    max_streams_per_client_connection: int = 100
    # Envoy's default circuit breakers (1024 requests) would cap the benchmarks.
    circuit_breaker_limit: int = 40_000

    def __post_init__(self) -> None:
        if self.pods_mode is not PodsMode.ROUND_ROBIN:
            if not self.epp_addresses:
                raise ValueError("at least one epp address is needed")
            if self.body_mode not in REQUEST_BODY_MODES:
                raise ValueError(f"request body mode must be one of {[str(m) for m in REQUEST_BODY_MODES]}")
        if self.pods_mode is not PodsMode.ORIGINAL_DST and not self.pod_endpoints:
            raise ValueError(f"pods mode {self.pods_mode} needs pod_endpoints")
        for addr in (*self.epp_addresses, *self.pod_endpoints):
            split_host_port(addr)
        if self.num_retries < 0 or self.epp_retries < 0:
            raise ValueError("num_retries and epp_retries must be >= 0")
        if not 0 < self.epp_retry_base_interval <= self.epp_retry_max_interval:
            raise ValueError("epp retry intervals: 0 < base <= max")
        if not 400 <= self.epp_status_on_error <= 599:
            raise ValueError("epp_status_on_error must be an HTTP error status (400-599)")
        if self.max_heap_bytes < 0 or self.max_streams_per_client_connection < 1:
            raise ValueError("max_heap_bytes must be >= 0 and max_streams_per_client_connection >= 1")
        if (
            self.failure_mode_allow
            and self.pods_mode is not PodsMode.ROUND_ROBIN
            and self.body_mode is BodyMode.FULL_DUPLEX_STREAMED
        ):
            # Measured on 1.40 (e2e/test_routing.py): a POST with epp down got 503, not a pod.
            raise ValueError(
                "failing open needs a BUFFERED request body: with FULL_DUPLEX_STREAMED Envoy fails "
                "open only until the first body chunk has gone to epp, so a request with a body "
                "still fails closed when epp is down"
            )
        unknown = {h.lower() for h in self.client_control_headers} - set(CONTROL_HEADERS)
        if unknown:
            raise ValueError(f"not control headers: {sorted(unknown)} (known: {list(CONTROL_HEADERS)})")
        if (
            self.mode_override
            and self.pods_mode is not PodsMode.ROUND_ROBIN
            and (
                self.body_mode is not BodyMode.BUFFERED
                or self.response_body_mode is not BodyMode.STREAMED
                or not self.process_responses
            )
        ):
            raise ValueError(
                "mode override needs request body BUFFERED and response body STREAMED "
                "(Envoy ignores it with FULL_DUPLEX_STREAMED)"
            )


def override_params(params: GatewayParams) -> GatewayParams:
    """`params` with epp's mode-override setup: request body BUFFERED, response body STREAMED,
    `allow_mode_override` on."""
    return dataclasses.replace(
        params,
        mode_override=True,
        body_mode=BodyMode.BUFFERED,
        response_body_mode=BodyMode.STREAMED,
        process_responses=True,
    )


def split_host_port(addr: str) -> tuple[str, int]:
    """'10.0.0.5:8000' / '[::1]:8000' / 'epp.ns:9002' -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {addr!r}")
    return host.strip("[]"), int(port)
