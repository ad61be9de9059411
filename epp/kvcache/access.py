"""Who may publish KV events to epp's bound socket (`--kv-events bind`), and for which pod.

A bound SUB on 0.0.0.0 takes connections from anyone who can reach the port, and a message
names its pod in the topic. Without checks a stranger can fill another pod's index entries or
force purges (a restart is a sequence going back). Two checks close that:

1. At the ZMTP handshake (ZAP, in `epp.kvcache.ingest`): the peer's IP must be one of the pool's
   pods (the IPs of the configured feeds), or in a network the operator admitted.
2. Per message: the pod the topic names must have the peer's IP, unless the peer's IP is in an
   admitted network (a NAT or proxy range the operator vouches for). A pod can then publish for
   itself only, not for its neighbours.

`--kv-events-allow` spells the policy: `pool` (default; the pool's pods), `pool,<cidr>,...`
(plus those networks), `<cidr>,...` (only those networks) or `any` (no check, the old
behaviour). This module holds no sockets (the import contract keeps ZMQ in ingest and feed).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclasses.dataclass(frozen=True, slots=True)
class AccessPolicy:
    """What `--kv-events-allow` says; see the module docstring."""

    pool: bool = True  # the pool's pods may publish (each for itself)
    networks: tuple[IPNetwork, ...] = ()  # peers in these may publish, for any pod
    any: bool = False  # no checks at all

    @classmethod
    def parse(cls, text: str) -> AccessPolicy:
        """`pool`, `any`, or a comma list of `pool` and IPs / CIDRs. ValueError if malformed."""
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise ValueError("empty KV-event access policy: use pool, any, or IPs/CIDRs")
        if "any" in items:
            if len(items) > 1:
                raise ValueError(f"'any' admits everyone; it cannot be combined: {text!r}")
            return cls(pool=False, any=True)
        networks: list[IPNetwork] = []
        for item in items:
            if item == "pool":
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"not pool, any, an IP or a CIDR: {item!r}") from None
        return cls(pool="pool" in items, networks=tuple(networks))

    def __str__(self) -> str:
        if self.any:
            return "any"
        return ",".join([*(["pool"] if self.pool else []), *(str(n) for n in self.networks)])


def parse_ip(text: str) -> IPAddress | None:
    """An IP from a peer address or a pod's host ("[::1]" and IPv4-mapped IPv6 included)."""
    try:
        ip = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class PeerCheck:
    """The policy applied to the current pods: `admits` at handshake, `may_publish` per message."""

    __slots__ = ("_pod_ips", "policy")

    def __init__(self, policy: AccessPolicy) -> None:
        self.policy = policy
        self._pod_ips: frozenset[IPAddress] = frozenset()

    def set_pods(self, hosts: Iterable[str]) -> None:
        """The pool's pods, by host (IP; names that are not IPs admit nothing)."""
        ips = (parse_ip(h) for h in hosts)
        self._pod_ips = frozenset(ip for ip in ips if ip is not None)

    def _in_networks(self, ip: IPAddress) -> bool:
        return any(ip in net for net in self.policy.networks)

    def admits(self, peer: str) -> bool:
        """May a connection from `peer` (an IP string) be accepted?"""
        if self.policy.any:
            return True
        ip = parse_ip(peer)
        if ip is None:
            return False
        return (self.policy.pool and ip in self._pod_ips) or self._in_networks(ip)

    def may_publish(self, peer: str | None, pod_host: str) -> bool:
        """May a connection from `peer` publish the events of the pod at `pod_host`?"""
        if self.policy.any:
            return True
        ip = parse_ip(peer) if peer else None
        if ip is None:
            return False
        if self.policy.pool and ip == parse_ip(pod_host):
            return True
        return self._in_networks(ip)
