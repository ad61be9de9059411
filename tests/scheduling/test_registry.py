"""The plugin registry: the pinned list of built-in types, registration checks, parameter errors."""

from __future__ import annotations

import ast
import subprocess
import sys

import msgspec
import pytest

from epp.scheduling import interfaces, registry

from . import builders

# Adding or renaming a plugin type must be a deliberate change to this list.
BUILT_IN_TYPES = [
    "active-request-scorer",
    "agent-identity",
    "approx-prefix-cache-producer",
    "bounded-load-filter",
    "burst-prefix-cache-producer",
    "by-label",
    "by-label-selector",
    "concurrency-detector",
    "context-length-aware",
    "data-parallel-profile-handler",
    "decode-filter",
    "destination-endpoint-served-verifier",
    "dynamo-cost-scorer",
    "encode-filter",
    "endpoint-attribute-filter",
    "endpoint-attribute-scorer",
    "header-based-testing-filter",
    "header-label-affinity-scorer",
    "header-profile-handler",
    "inflight-load-scorer",
    "kv-cache-utilization-scorer",
    "label-selector-filter",
    "load-aware-scorer",
    "lora-affinity-scorer",
    "max-score-picker",
    "no-hit-lru-scorer",
    "precise-prefix-cache-producer",
    "precise-prefix-cache-scorer",
    "predicted-ttft-scorer",
    "prefill-filter",
    "prefix-cache-scorer",
    "probabilistic-admitter",
    "queue-scorer",
    "random-picker",
    "request-latency-scorer",
    "round-robin-picker",
    "running-requests-size-scorer",
    "session-affinity-filter",
    "session-affinity-scorer",
    "session-id-producer",
    "sglang-cache-aware-picker",
    "single-profile-handler",
    "token-load-scorer",
    "topology-affinity-filter",
    "topology-affinity-scorer",
    "utilization-detector",
    "utilization-filter",
    "weighted-random-picker",
]

# Types whose factory needs parameters (as llm-d's do): the least that builds them.
REQUIRED: dict[str, dict[str, object]] = {
    "by-label": {"label": "role", "validValues": ["decode"]},
    "endpoint-attribute-filter": {
        "attribute": "GPUUtilization",
        "producer": "dcgm-extractor",
        "algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 0.9}},
    },
    "endpoint-attribute-scorer": {"attributeKey": "Temp", "algorithm": {"type": "linear_lower_is_better"}},
    "header-label-affinity-scorer": {"headerName": "x-zone", "labelKey": "zone"},
    "session-id-producer": {"headerName": "x-session-id"},
    "utilization-filter": {"conditions": [{"metric": "waiting-queue", "maxValue": 10}]},
}

KINDS = {
    "bounded-load-filter": interfaces.Filter,
    "by-label-selector": interfaces.Filter,
    "concurrency-detector": interfaces.SaturationDetector,
    "decode-filter": interfaces.Filter,
    "encode-filter": interfaces.Filter,
    "label-selector-filter": interfaces.Filter,
    "load-aware-scorer": interfaces.Scorer,
    "no-hit-lru-scorer": interfaces.Scorer,
    "prefill-filter": interfaces.Filter,
    "dynamo-cost-scorer": interfaces.Scorer,
    "header-based-testing-filter": interfaces.Filter,
    "inflight-load-scorer": interfaces.Scorer,
    "kv-cache-utilization-scorer": interfaces.Scorer,
    "lora-affinity-scorer": interfaces.Scorer,
    "max-score-picker": interfaces.Picker,
    "precise-prefix-cache-scorer": interfaces.Scorer,
    "predicted-ttft-scorer": interfaces.Scorer,
    "prefix-cache-scorer": interfaces.Scorer,
    "queue-scorer": interfaces.Scorer,
    "random-picker": interfaces.Picker,
    "request-latency-scorer": interfaces.Scorer,
    "round-robin-picker": interfaces.Picker,
    "running-requests-size-scorer": interfaces.Scorer,
    "sglang-cache-aware-picker": interfaces.Picker,
    "token-load-scorer": interfaces.Scorer,
    "utilization-detector": interfaces.SaturationDetector,
    "weighted-random-picker": interfaces.Picker,
}


def test_importing_the_plugins_package_registers_exactly_the_pinned_types() -> None:
    # A fresh interpreter: in this one, other tests may import plugin modules the package does not.
    code = (
        "import epp.scheduling.plugins; from epp.scheduling import registry; print(registry.default.types())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert ast.literal_eval(out) == BUILT_IN_TYPES


@pytest.mark.parametrize("type_name", BUILT_IN_TYPES)
def test_every_type_builds_with_defaults_and_carries_its_identity(type_name: str) -> None:
    plugin = builders.plugin(type_name, REQUIRED.get(type_name), name="my-name")
    assert plugin.type == type_name
    assert plugin.name == "my-name"
    assert repr(plugin) == f"my-name/{type_name}"
    assert isinstance(plugin, interfaces.Plugin)
    if type_name in KINDS:
        assert isinstance(plugin, KINDS[type_name])


@pytest.mark.parametrize(
    ("type_name", "parameters", "fragments"),
    [
        ("queue-scorer", {"foo": 1}, ["'p'", "'queue-scorer'", "unknown field `foo`"]),
        ("max-score-picker", {"maxNumOfEndpoint": 2}, ["'max-score-picker'", "`maxNumOfEndpoint`"]),
        (
            "max-score-picker",
            {"maxNumOfEndpoints": "2"},
            ["Expected `int`, got `str`", "$.maxNumOfEndpoints"],
        ),
        ("max-score-picker", {"maxNumOfEndpoints": 0}, [">= 1", "$.maxNumOfEndpoints"]),
        ("random-picker", {"maxNumOfEndpoints": 1.5}, ["Expected `int`", "$.maxNumOfEndpoints"]),
        ("inflight-load-scorer", {"mode": "bytes"}, ["'inflight-load-scorer'", "$.mode"]),
        ("token-load-scorer", {"queueThresholdTokens": 0}, [">= 1", "$.queueThresholdTokens"]),
    ],
)
def test_bad_parameters_name_plugin_type_and_parameter(
    type_name: str, parameters: dict[str, object], fragments: list[str]
) -> None:
    with pytest.raises(registry.ConfigError) as info:
        builders.plugin(type_name, parameters, name="p")
    message = str(info.value)
    assert "plugin 'p'" in message
    for fragment in fragments:
        assert fragment in message


def test_unknown_type_names_plugin_and_type_and_lists_the_known() -> None:
    with pytest.raises(
        registry.ConfigError, match=r"plugin 'x': unknown plugin type 'no-such-scorer'.*queue-scorer"
    ):
        registry.default.build("no-such-scorer", "x", None, builders.handle())


def test_parameters_are_decoded_into_params() -> None:
    picker = builders.plugin("max-score-picker", {"maxNumOfEndpoints": 3})
    assert picker.max_endpoints == 3


def test_register_rejects_a_type_registered_twice() -> None:
    reg = registry.Registry()

    @reg.register("twice")
    class First(registry.PluginBase):
        pass

    with pytest.raises(ValueError, match="'twice' is registered twice"):

        @reg.register("twice")
        class Second(registry.PluginBase):
            pass


def test_register_rejects_lenient_params() -> None:
    reg = registry.Registry()
    with pytest.raises(TypeError, match="forbid_unknown_fields"):

        @reg.register("lenient")
        class Lenient(registry.PluginBase):
            class Params(msgspec.Struct):  # unknown fields would be ignored silently
                x: int = 0


def test_a_separate_registry_sets_type_and_builds() -> None:
    reg = registry.Registry()

    @reg.register("thing")
    class Thing(registry.PluginBase):
        class Params(msgspec.Struct, forbid_unknown_fields=True):
            size: int = 1

        def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
            self.name = name
            self.size = params.size

    assert Thing.type == "thing"
    assert reg.types() == ["thing"]
    assert "thing" in reg and "queue-scorer" not in reg
    built = reg.build("thing", "t", {"size": 5}, builders.handle())
    assert isinstance(built, Thing) and built.size == 5
