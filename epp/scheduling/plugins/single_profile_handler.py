"""`single-profile-handler`: the configuration has one scheduling profile, and it is primary.

What it does: nothing by itself. It is the only profile handler epp has, so `framework.Scheduler`
implements its behaviour directly (run the only profile once; its result is primary) and `config`
rejects more than one profile. A configuration gets that behaviour whether or not it lists this
plugin (GIE injects it when there is one profile and no handler); listing it is accepted so that
GIE configurations load unchanged.

Inputs consumed: none.

Parameters: none.
"""

from __future__ import annotations

from epp.scheduling import registry


@registry.register("single-profile-handler")
class SingleProfileHandler(registry.PluginBase):
    pass
