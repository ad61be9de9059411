"""`header-profile-handler` (llm-d v0.10): one scheduling profile per request, the one a request
header names.

For a caller that already knows which stage each call is for (llm-d's coordinator calls the EPP
once per stage of an encode/prefill/decode pipeline) one epp serves every stage's profile:

- one profile configured: it always runs, header or not;
- the header names a configured profile: that profile alone runs, and its result is primary;
- the header missing or blank: `defaultProfile` runs (requests that never carry it, `GET
  /v1/models`);
- the header naming no configured profile (or missing, with no `defaultProfile` profile): the
  request gets 400 naming the header and the profiles. llm-d answers 429 there (its scheduler
  cannot carry the reason; its README says 400 would be the accurate status) and logs the reason.

The value is matched verbatim against `schedulingProfiles[].name` after trimming whitespace; the
header name case-insensitively.

Inputs consumed: the request header. Parameters: `headerName` (`EPP-Profile`), `defaultProfile`
(`decode`). It writes no P/D headers: the caller tracks the stages (llm-d's handler has no
pre-request hook either).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from epp.api import errors
from epp.api.requests import InferenceRequest
from epp.observability import metrics
from epp.scheduling import framework, interfaces, registry


@registry.register("header-profile-handler")
class HeaderProfileHandler(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        headerName: str = "EPP-Profile"
        defaultProfile: str = "decode"

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        # Envoy hands epp lower-case header names; blank values take llm-d's defaults, as there.
        self.header = params.headerName.strip().lower() or "epp-profile"
        self.default_profile = params.defaultProfile.strip() or "decode"

    def scheduler(self, profiles: Sequence[framework.Profile]) -> tuple[HeaderProfileScheduler, list[str]]:
        """The per-request choice over the configured `profiles`, and notes to log."""
        notes: list[str] = []
        names = [p.name for p in profiles]
        if len(profiles) > 1 and self.default_profile not in names:
            notes.append(
                f"plugin {self.name!r} (type {self.type!r}): defaultProfile {self.default_profile!r} is "
                f"not a scheduling profile ({', '.join(names)}): a request without the "
                f"{self.header} header gets 400"
            )
        return HeaderProfileScheduler(profiles, self.header, self.default_profile), notes


class HeaderProfileScheduler(framework.Scheduler):
    """Runs the profile the request's header names (see the module)."""

    def __init__(self, profiles: Sequence[framework.Profile], header: str, default_profile: str) -> None:
        if not profiles:
            raise ValueError("no scheduling profile")
        self.profiles = tuple(profiles)
        self.header = header
        self.default_profile = default_profile
        self._by_name = {p.name: p for p in profiles}
        self.primary = default_profile if default_profile in self._by_name else profiles[0].name
        self._profile = self._by_name[self.primary]  # what `facts` falls back to
        self._observe = metrics.scheduler_duration.observe

    def choose(self, request: InferenceRequest) -> framework.Profile:
        """The profile to run for `request`; BadRequest when the header names none."""
        if len(self.profiles) == 1:
            return self.profiles[0]
        value = request.headers.get(self.header, "").strip()
        profile = self._by_name.get(value or self.default_profile)
        if profile is not None:
            return profile
        configured = ", ".join(self._by_name)
        if value:
            raise errors.BadRequest(
                f"header {self.header}: no scheduling profile {value!r} (configured: {configured})"
            )
        raise errors.BadRequest(
            f"header {self.header} is missing and the default profile {self.default_profile!r} is "
            f"not configured (configured: {configured})"
        )

    def facts(self, result: interfaces.SchedulingResult) -> dict[str, Any]:
        return self._by_name.get(result.primary, self._profile).facts(result.cycle)
