"""`agent-identity` (llm-d, Alpha): the agent session a request belongs to, from the headers coding
agents send (`epp.api.agent_identity`), kept as the request attribute `agent-identity`.

Flow control takes it as the fairness ID when no explicit fairness header is given (so
`program-aware-fairness` sees each agent session as a program); `session-affinity-scorer` /
`-filter` may list it as a session source (`attribute: agent-identity`).

Parameters (llm-d's): `additionalSessionHeaders` ([]): headers looked at before the built-in ones.
"""

from __future__ import annotations

import msgspec

from epp.api import agent_identity
from epp.api.requests import InferenceRequest
from epp.scheduling import interfaces, registry


@registry.register("agent-identity")
class AgentIdentity(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        additionalSessionHeaders: list[str] = []

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self._order = agent_identity.header_order(params.additionalSessionHeaders)

    def request_headers(self, request: InferenceRequest) -> None:
        found = agent_identity.identity(request.headers, self._order)
        if found:
            request.attributes[agent_identity.ATTRIBUTE] = found
