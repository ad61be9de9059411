"""`single-profile-handler`: the configuration has one scheduling profile, and it is primary.

What it does: nothing by itself. It is the only profile handler epp has, so `framework.Scheduler`
implements its behaviour directly (run the only profile once; its result is primary) and `config`
rejects more than one profile. A configuration gets that behaviour whether or not it lists this
plugin (GIE injects it when there is one profile and no handler); listing it is accepted so that
GIE configurations load unchanged.

`data-parallel-profile-handler` (llm-d's, deprecated there in favour of the single handler) is
accepted as the same: llm-d sends every request to the pod's `primaryPort` and names the chosen
data-parallel rank in a header, for Istio before 1.28.1; epp knows each rank as its own endpoint
(`<pod>-rank-<n>`, on its own port) and routes to that port directly, which is where llm-d's header
sends the request too.

Inputs consumed: none.

Parameters: none; `data-parallel-profile-handler`: `primaryPort` (8000, 1-65535), not used.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from epp.scheduling import interfaces, registry


@registry.register("single-profile-handler")
class SingleProfileHandler(registry.PluginBase):
    pass


@registry.register("data-parallel-profile-handler")
class DataParallelProfileHandler(SingleProfileHandler):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        primaryPort: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 8000

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        # Read by the configuration loader, which logs them.
        self.config_notes = (
            f"plugin {name!r} (type {self.type!r}) works as single-profile-handler: epp routes to "
            f"each data-parallel rank's own port, not through primaryPort {params.primaryPort}",
        )
