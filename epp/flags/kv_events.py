"""`epp serve`'s KV-cache event flags (precise prefix-cache routing) and their access-policy type."""

from __future__ import annotations

import argparse

from epp.flags.types import byte_size, duration, port_number, positive_int
from epp.kvcache.access import AccessPolicy

KV_EVENTS_PORT_DEFAULT = 5557
KV_EVENTS_BIND_DEFAULT = "tcp://*:5557"  # vLLM's own default endpoint, seen from the other side


def kv_access(text: str) -> AccessPolicy:
    try:
        return AccessPolicy.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_kv_events_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("KV-cache events (precise prefix-cache routing)")
    g.add_argument(
        "--kv-events",
        choices=["off", "connect", "bind"],
        default="off",
        help="consume vLLM's KV-cache events: connect a subscriber to each endpoint's publisher, "
        "or bind one that the model servers connect to (default off)",
    )
    g.add_argument(
        "--kv-events-port",
        type=port_number,
        default=KV_EVENTS_PORT_DEFAULT,
        help="connect mode: the publisher port of endpoints whose entry names no kvEvents, "
        "plus the endpoint's data-parallel rank, as vLLM offsets it (default 5557)",
    )
    g.add_argument(
        "--kv-replay-port",
        type=port_number,
        default=None,
        help="the replay port of endpoints whose entry names no kvReplay (plus the rank); "
        "default: no replay for them (a gap purges the pod's blocks until new events rebuild them)",
    )
    g.add_argument(
        "--kv-events-bind",
        default=KV_EVENTS_BIND_DEFAULT,
        help="bind mode: where to listen for publishers (vLLM's endpoint tcp://<epp>:5557, "
        "topic kv@<ip>:<port>@<model>) (default tcp://*:5557)",
    )
    g.add_argument(
        "--kv-events-allow",
        type=kv_access,
        default=kv_access("pool"),
        metavar="pool|any|[pool,]CIDR,...",
        help="bind mode: who may publish. pool: only the pool's pods, each for its own topic; "
        "CIDRs admit those networks for any pod (a NAT or mesh range); any: no check "
        "(default pool; docs/security.md)",
    )
    g.add_argument(
        "--kv-events-max-message-bytes",
        type=byte_size,
        default=16 << 20,
        help="larger KV-event frames close the sender's connection (default 16Mi)",
    )
    g.add_argument(
        "--kv-events-silence-grace",
        type=duration,
        default=60.0,
        help="a pod sent 1024 prompt tokens or more that publishes no KV event this long is "
        "warned about, once, and counted in epp_kv_events_publisher_silent (default 60s)",
    )
    g.add_argument(
        "--kv-index-max-entries",
        type=positive_int,
        default=10_000_000,
        help="cap on (block, pod) entries in the KV index; least recently used go first (default 10M)",
    )
    g.add_argument(
        "--kv-block-size",
        type=positive_int,
        default=None,
        help="block size for events that carry none (offload connectors); default: none",
    )
