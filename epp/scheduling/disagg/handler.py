"""llm-d's disaggregation profile handlers, and the header hooks of its P/D protocol.

`disagg-profile-handler` (llm-d v0.10):

- `stageOrder`: `decode-first` (default) or `prefill-first` (a prefill decider is then refused,
  as llm-d refuses it: prefill always runs first);
- `profiles.{decode, prefill, encode}`: the profiles' names (defaults `decode`, `prefill`, `encode`);
  a stage whose profile the configuration lacks never runs;
- `deciders.{prefill, encode}`: the plugins that decide per request (`epp.scheduling.disagg.
  deciders`, or epp's `pd-latency-decider`); no decider, no stage (except prefill-first);
- llm-d's deprecated flat form (`decodeProfile`, `prefillProfile`, `encodeProfile`,
  `prefillDeciderPluginName`, `encodeDeciderPluginName`, `deciderPluginName`) is read too, not
  mixed with the nested one.

Its pre-request hook writes the request headers the decode pod's sidecar reads:
`x-prefiller-host-port: ip:port` of the prefill pod, `x-encoder-hosts-ports: ip:port,...` of the
encode pods, each absent when its stage did not run (and removed if a client sent it).

`pd-profile-handler` (llm-d's deprecated P/D-only handler): `decodeProfile`, `prefillProfile`,
`deciderPluginName`; `prefixPluginType`/`prefixPluginName`/`prefixMatchInfoProducerName` are
accepted (epp reads the decode profile's prefix scorer), `primaryPort` as
`data-parallel-profile-handler`'s (epp routes to each rank's own port).

`disagg-headers-handler` and `prefill-header-handler` (deprecated in llm-d: the profile handler
writes the headers now) are accepted beside a disaggregation handler whose profiles they name,
and do nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from epp.api.requests import InferenceRequest
from epp.scheduling import framework, interfaces, registry
from epp.scheduling.disagg import deciders, runner
from epp.scheduling.disagg.latency_decider import PDLatencyDecider
from epp.sidecar.protocol import ENCODER_HEADER, PREFILL_HEADER

ConfigError = registry.ConfigError


class _Profiles(msgspec.Struct, forbid_unknown_fields=True):
    decode: str = ""
    prefill: str = ""
    encode: str = ""


class _Deciders(msgspec.Struct, forbid_unknown_fields=True):
    prefill: str = ""
    encode: str = ""


class _Flat(msgspec.Struct, forbid_unknown_fields=True):
    stageOrder: str = ""
    decodeProfile: str = ""
    prefillProfile: str = ""
    encodeProfile: str = ""
    prefillDeciderPluginName: str = ""
    encodeDeciderPluginName: str = ""
    deciderPluginName: str = ""


def _order(value: str) -> Literal["decode-first", "prefill-first"]:
    key = value.lower().replace("-", "").replace("_", "")
    if key in ("", "decodefirst", "decode"):
        return "decode-first"
    if key in ("prefillfirst", "prefill"):
        return "prefill-first"
    raise ConfigError(f"invalid stageOrder {value!r}: decode-first or prefill-first")


@registry.register("disagg-profile-handler")
class DisaggProfileHandler(registry.PluginBase):
    """See the module. `scheduler()` turns it and the configured profiles into the run."""

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        stageOrder: str = ""
        profiles: _Profiles | None = None
        deciders: _Deciders | None = None
        # llm-d's deprecated flat parameters (one form or the other).
        decodeProfile: str = ""
        prefillProfile: str = ""
        encodeProfile: str = ""
        prefillDeciderPluginName: str = ""
        encodeDeciderPluginName: str = ""
        deciderPluginName: str = ""

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        label = f"plugin {name!r} (type {self.type!r})"
        flat = _Flat(
            params.stageOrder,
            params.decodeProfile,
            params.prefillProfile,
            params.encodeProfile,
            params.prefillDeciderPluginName,
            params.encodeDeciderPluginName,
            params.deciderPluginName,
        )
        uses_flat = any(getattr(flat, f) for f in _Flat.__struct_fields__ if f != "stageOrder")
        if uses_flat and (params.profiles is not None or params.deciders is not None):
            raise ConfigError(
                f"{label}: give the nested profiles/deciders or llm-d's deprecated flat parameters, not both"
            )
        profiles = params.profiles or _Profiles(flat.decodeProfile, flat.prefillProfile, flat.encodeProfile)
        chosen = params.deciders or _Deciders(
            flat.prefillDeciderPluginName or flat.deciderPluginName, flat.encodeDeciderPluginName
        )
        try:
            self.order = _order(params.stageOrder)
        except ConfigError as err:
            raise ConfigError(f"{label}: parameters.stageOrder: {err}") from None
        if self.order == "prefill-first" and chosen.prefill:
            raise ConfigError(
                f"{label}: parameters.deciders.prefill: a prefill decider is not supported with stageOrder "
                "prefill-first (prefill always runs first), as in llm-d"
            )
        self.decode_profile = profiles.decode or "decode"
        self.prefill_profile = profiles.prefill or "prefill"
        self.encode_profile = profiles.encode or "encode"
        self.prefill_decider = chosen.prefill
        self.encode_decider = chosen.encode
        self.config_notes: tuple[str, ...] = ()
        if uses_flat:
            self.config_notes = (f"{label}: llm-d's deprecated flat parameters; use profiles/deciders",)

    def scheduler(
        self, profiles: Mapping[str, framework.Profile], plugins: Mapping[str, interfaces.Plugin]
    ) -> tuple[runner.DisaggScheduler, list[str]]:
        """The multi-profile run over the configured `profiles`, and notes to log. Raises
        ConfigError for a missing decode profile or a decider that is not one."""
        label = f"plugin {self.name!r} (type {self.type!r})"
        decode = profiles.get(self.decode_profile)
        if decode is None:
            raise ConfigError(
                f"{label}: no scheduling profile {self.decode_profile!r} (the decode profile); "
                f"profiles: {', '.join(profiles)}"
            )
        notes: list[str] = []

        def decider(ref: str, stage: str) -> deciders.Decider | None:
            if not ref:
                return None
            plugin = plugins.get(ref)
            if plugin is None:
                raise ConfigError(f"{label}: deciders.{stage}: {ref!r} is not a defined plugin")
            if not isinstance(plugin, deciders.Decider):
                raise ConfigError(
                    f"{label}: deciders.{stage}: plugin {ref!r} (type {plugin.type!r}) is not a decider"
                )
            return plugin

        prefill_decider = decider(self.prefill_decider, "prefill")
        encode_decider = decider(self.encode_decider, "encode")
        prefill = profiles.get(self.prefill_profile)
        encode = profiles.get(self.encode_profile)
        for ref, stage, profile in (
            (prefill_decider, "prefill", prefill),
            (encode_decider, "encode", encode),
        ):
            if ref is not None and profile is None:
                raise ConfigError(
                    f"{label}: deciders.{stage} is set but there is no {stage} profile "
                    f"{getattr(self, stage + '_profile')!r}"
                )
        if prefill is not None and prefill_decider is None and self.order == "decode-first":
            notes.append(f"{label}: no deciders.prefill: profile {prefill.name!r} never runs (no P/D split)")
        if encode is not None and encode_decider is None:
            notes.append(f"{label}: no deciders.encode: profile {encode.name!r} never runs")
        for d in (prefill_decider, encode_decider):
            if isinstance(d, deciders._DeciderBase):
                d.decode_scorers = tuple(s for s, _ in decode.scorers)
        if (
            isinstance(prefill_decider, deciders.PrefixBasedPDDecider)
            and deciders.prefix_scorer(prefill_decider.decode_scorers) is None
        ):
            notes.append(
                f"plugin {prefill_decider.name!r} (type {prefill_decider.type!r}): decode profile "
                f"{decode.name!r} has no prefix scorer, so no request is split (llm-d reads "
                "PrefixCacheMatchInfo there too)"
            )
        used = {p.name for p in (decode, prefill, encode) if p is not None}
        others = [p for n, p in profiles.items() if n not in used]
        if others:
            raise ConfigError(
                f"{label}: profiles {', '.join(p.name for p in others)} are not a stage of this handler "
                f"(decode {self.decode_profile!r}, prefill {self.prefill_profile!r}, "
                f"encode {self.encode_profile!r})"
            )
        if isinstance(prefill_decider, PDLatencyDecider):
            if prefill is None:
                raise ConfigError(f"{label}: {prefill_decider.type!r} needs a prefill profile")
            prefill_decider.bind(decode, prefill)
        run = runner.DisaggScheduler(
            handler=self,
            decode=decode,
            prefill=prefill if (prefill_decider is not None or self.order == "prefill-first") else None,
            encode=encode if encode_decider is not None else None,
            prefill_decider=prefill_decider,
            encode_decider=encode_decider,
            order=self.order,
        )
        return run, notes

    def pre_request(self, request: InferenceRequest, result: interfaces.SchedulingResult) -> None:
        """Name the other stages' pods to the decode pod's sidecar (`SchedulingResult.headers`)."""
        prefill = result.stages.get("prefill")
        if prefill:
            result.headers[PREFILL_HEADER] = prefill[0].hostport
        encode = result.stages.get("encode")
        if encode:
            result.headers[ENCODER_HEADER] = ",".join(ep.hostport for ep in encode)


@registry.register("pd-profile-handler")
class PDProfileHandler(DisaggProfileHandler):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        decodeProfile: str = ""
        prefillProfile: str = ""
        deciderPluginName: str = ""
        prefixPluginType: str = ""
        prefixPluginName: str = ""
        prefixMatchInfoProducerName: str = ""
        primaryPort: int = 0

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        flat = DisaggProfileHandler.Params(
            decodeProfile=params.decodeProfile,
            prefillProfile=params.prefillProfile,
            deciderPluginName=params.deciderPluginName,
        )
        super().__init__(name, flat, handle)
        self.config_notes = (
            f"plugin {name!r} (type {self.type!r}) is llm-d's deprecated P/D handler: run as "
            "disagg-profile-handler (decode first); the prefix match is read from the decode profile's "
            "prefix scorer",
        )


@registry.register("disagg-headers-handler")
class DisaggHeadersHandler(registry.PluginBase):
    class Params(msgspec.Struct, forbid_unknown_fields=True):
        prefillProfile: str = "prefill"
        encodeProfile: str = "encode"

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self.profiles = (params.prefillProfile, params.encodeProfile)
        self.config_notes = (
            f"plugin {name!r} (type {self.type!r}) is deprecated in llm-d: the disaggregation profile "
            "handler writes the headers; nothing else to do",
        )


@registry.register("prefill-header-handler")
class PrefillHeaderHandler(DisaggHeadersHandler):
    pass
