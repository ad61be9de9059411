"""`header-based-testing-filter`: keep only the endpoints a request header names (conformance tests).

What it does: reads the comma-separated request header `test-epp-endpoint-selection`. Each entry
is an address (`10.0.0.5`, `::1`, `[::1]`), which keeps every endpoint at that address whatever its
port, or an address with a port (`10.0.0.5:8000`, `[::1]:8000`), which keeps only that endpoint.
Endpoints keep their input order. Without the header every endpoint passes, so the filter is
harmless in a configuration that also serves ordinary traffic; a header that names no candidate
leaves none, which the framework answers with 429.

GIE's filter also takes addresses or address:port pairs, but differs in two ways: it returns nothing
when the header is absent or blank, and it keeps one endpoint per IP. Here an address entry keeps all
ports of a multi-rank pod.

Inputs consumed: `InferenceRequest.headers`; `Endpoint.spec.address`, `Endpoint.hostport`.

Parameters: none.
"""

from __future__ import annotations

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry

HEADER = "test-epp-endpoint-selection"


def _parse(value: str) -> tuple[set[str], set[str]]:
    """Split the header into (bare addresses, "address:port" entries in Endpoint.hostport form)."""
    addresses: set[str] = set()
    hostports: set[str] = set()
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        if item.startswith("["):  # bracketed IPv6, with or without a port
            if "]:" in item:
                hostports.add(item)
            else:
                addresses.add(item.strip("[]"))
        elif item.count(":") == 1:  # IPv4 or host name with a port
            hostports.add(item)
        else:  # no colon (IPv4, host name) or several (bare IPv6)
            addresses.add(item)
    return addresses, hostports


@registry.register("header-based-testing-filter")
class HeaderBasedTestingFilter(registry.PluginBase):
    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        value = request.headers.get(HEADER)
        if value is None:
            return endpoints
        addresses, hostports = _parse(value)
        return [ep for ep in endpoints if ep.spec.address in addresses or ep.hostport in hostports]
