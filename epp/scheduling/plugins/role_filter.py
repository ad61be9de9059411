"""`decode-filter`, `prefill-filter`, `encode-filter`: llm-d's role filters, on the pod label
`llm-d.ai/role`.

What it does: keeps the endpoints whose `llm-d.ai/role` label is one of the role's values, in
input order; an endpoint without the label passes only the decode filter (llm-d: an unlabelled pod
is an ordinary, aggregated server that decodes). The values are llm-d's:

- `decode-filter`: `decode`, `prefill-decode`, `both`, `encode-prefill-decode`, or no label;
- `prefill-filter`: `prefill`, `encode-prefill`, `prefill-decode`, `both`, `encode-prefill-decode`;
- `encode-filter`: `encode`, `encode-prefill`, `encode-prefill-decode`.

In a pool without roles (every pod unlabelled) `decode-filter` keeps every endpoint, which is why
llm-d's single-profile configurations list it. `prefill-filter` and `encode-filter` select the
pods of the prefill and encode stages of llm-d's disaggregated configurations
(`epp.scheduling.disagg`, docs/disaggregation.md).

Inputs consumed: `Endpoint.spec.labels` (the pod's labels, from the InferencePool's pods or the
endpoints file).

Parameters: none.
"""

from __future__ import annotations

from typing import ClassVar

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry

ROLE_LABEL = "llm-d.ai/role"


class _RoleFilter(registry.PluginBase):
    roles: ClassVar[frozenset[str]] = frozenset()
    unlabelled_passes: ClassVar[bool] = False

    def filter(
        self, cycle: interfaces.CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        roles, unlabelled = self.roles, self.unlabelled_passes
        kept = []
        for ep in endpoints:
            role = ep.spec.labels.get(ROLE_LABEL)
            if (role is None and unlabelled) or role in roles:
                kept.append(ep)
        return kept


@registry.register("decode-filter")
class DecodeFilter(_RoleFilter):
    roles = frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode"})
    unlabelled_passes = True


@registry.register("prefill-filter")
class PrefillFilter(_RoleFilter):
    roles = frozenset({"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"})


@registry.register("encode-filter")
class EncodeFilter(_RoleFilter):
    roles = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})
