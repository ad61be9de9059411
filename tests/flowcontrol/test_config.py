"""The `flowControl` section and the flow-control plugin types: llm-d's configs load, and
everything epp would not honour is refused with its line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from epp.datastore.endpoints import Datastore
from epp.flowcontrol import config as fc_config
from epp.flowcontrol import fairness, ordering, usage_limits
from epp.flowcontrol.program_aware import ProgramAware
from epp.scheduling import config as sched_config
from epp.scheduling import config_compat
from epp.scheduling.interfaces import Handle

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
PROFILES = "schedulingProfiles:\n- name: default\n  plugins: [{pluginRef: queue-scorer}]\n"
ON = "featureGates: [flowControl]\n" + PROFILES
LLMD_CONFIGS = Path(__file__).parent / "llmd"


def setup(text: str) -> fc_config.FlowControlSetup:
    loaded = sched_config.load_config(
        HEAD + textwrap.dedent(text), Handle(datastore=Datastore()), allow_experimental=True
    )
    assert loaded.flow_control is not None
    return fc_config.build(loaded.flow_control, loaded.plugins, loaded.saturation_detector)


def config(text: str) -> fc_config.FlowControlConfig:
    built = setup(text).config
    assert built is not None
    return built


def error(text: str) -> str:
    with pytest.raises(sched_config.ConfigError) as info:
        setup(text)
    return str(info.value)


def test_the_plugin_types_are_the_ones_the_scheduling_config_hands_over() -> None:
    assert set(fc_config.PLUGIN_TYPES) == config_compat.FLOW_CONTROL


def test_off_without_the_gate_and_llm_d_defaults_with_it() -> None:
    assert setup("plugins: [{type: queue-scorer}]\n" + PROFILES).config is None
    cfg = config("featureGates: [flowControl]\nplugins: [{type: queue-scorer}]\n" + PROFILES)
    assert (cfg.default_request_ttl, cfg.no_endpoint_request_ttl) == (60.0, 60.0)
    assert (cfg.max_bytes, cfg.max_requests) == (0, 0)
    band = cfg.default_band
    assert (band.max_bytes, band.max_requests) == (1_000_000_000, 5000)
    assert isinstance(band.fairness, fairness.GlobalStrict) and isinstance(band.ordering, ordering.Fcfs)
    assert isinstance(cfg.usage_limit, usage_limits.Static) and cfg.usage_limit.threshold == 1.0
    assert (
        setup("featureGates: [flowControl=false]\nplugins: [{type: queue-scorer}]\n" + PROFILES).config
        is None
    )


def test_every_key() -> None:
    cfg = config(
        """
        featureGates: [flowControl]
        plugins:
        - type: queue-scorer
        - type: round-robin-fairness-policy
        - {name: deadline, type: edf-ordering-policy}
        - {name: slo, type: slo-deadline-ordering-policy}
        - {name: hold, type: priority-holdback-policy, parameters: {minCeiling: 0.4, domain: value}}
        - {type: concurrency-detector, parameters: {maxConcurrency: 8}}
        - type: eviction-sheddable-filter
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: queue-scorer}]
        flowControl:
          maxBytes: 2Gi
          maxRequests: 10k
          defaultRequestTTL: 30s
          noEndpointRequestTTL: 5m
          defaultPriorityBand: {maxRequests: 100, fairnessPolicyRef: round-robin-fairness-policy}
          defaultNegativePriorityBand: {maxBytes: 10M, orderingPolicyRef: deadline}
          priorityBands:
          - {priority: 10, orderingPolicyRef: slo, maxRequests: 0}
          usageLimitPolicyPluginRef: hold
          saturationDetector: {pluginRef: concurrency-detector}
          enableEviction: true
        """
    )
    assert (cfg.max_bytes, cfg.max_requests) == (2 << 30, 10_000)
    assert (cfg.default_request_ttl, cfg.no_endpoint_request_ttl) == (30.0, 300.0)
    assert cfg.default_band.max_requests == 100 and isinstance(cfg.default_band.fairness, fairness.RoundRobin)
    negative = cfg.template(-5)
    assert negative.max_bytes == 10_000_000 and isinstance(negative.ordering, ordering.Edf)
    assert cfg.template(3) is cfg.default_band
    assert cfg.bands[10].max_requests == 5000 and isinstance(cfg.bands[10].ordering, ordering.SloDeadline)
    assert isinstance(cfg.usage_limit, usage_limits.PriorityHoldback) and cfg.usage_limit.by_value
    assert cfg.enable_eviction


def test_the_ttl_for_an_empty_pool_follows_the_default_one() -> None:
    cfg = config(
        "featureGates: [flowControl]\nplugins: [{type: queue-scorer}]\n"
        + PROFILES
        + "flowControl: {defaultRequestTTL: 0s}\n"
    )
    assert (cfg.default_request_ttl, cfg.no_endpoint_request_ttl) == (0.0, 0.0)


@pytest.mark.parametrize("name", ["soft-reflective-ceiling-epp-config.yaml", "sim-program-aware-config.yaml"])
def test_llm_d_flow_control_configs_load(name: str) -> None:
    text = (LLMD_CONFIGS / name).read_text()
    loaded = sched_config.load_config(text, Handle(datastore=Datastore()), allow_experimental=True)
    assert loaded.flow_control is not None
    built = fc_config.build(loaded.flow_control, loaded.plugins, loaded.saturation_detector)
    assert built.config is not None and built.warnings == []
    if name.startswith("soft"):
        assert isinstance(built.config.usage_limit, usage_limits.SoftReflectiveCeiling)
    else:
        assert isinstance(built.config.default_band.fairness, ProgramAware)
        assert built.config.programs == [built.config.default_band.fairness]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            PROFILES + "plugins: [{type: queue-scorer}]\nflowControl: {maxBytes: 1G}\n",
            "flowControl.maxBytes (line 7): flowControl is configured but the flowControl feature gate is",
        ),
        (
            PROFILES + "plugins: [{type: queue-scorer}, {type: round-robin-fairness-policy}]\n",
            "plugins[1] (line 6): plugin 'round-robin-fairness-policy' (type 'round-robin-fairness-policy') "
            "is a flow-control plugin, but the flowControl feature gate is off",
        ),
        (
            "featureGates: [flowControl]\n"
            + PROFILES
            + "plugins: [{type: queue-scorer}]\nflowControl: {maxByte: 1}\n",
            "flowControl.maxByte (line 8): unknown key 'maxByte'; known keys: maxBytes",
        ),
        (
            "featureGates: [flowControl]\n"
            + PROFILES
            + "plugins: [{type: queue-scorer}]\nflowControl: {maxBytes: 1Gb}\n",
            "flowControl.maxBytes (line 8): not a quantity: '1Gb'",
        ),
        (
            "featureGates: [flowControl]\n" + PROFILES + "plugins: [{type: queue-scorer}]\n"
            "flowControl: {maxRequests: -3}\n",
            "flowControl.maxRequests (line 8): must be non-negative",
        ),
        (
            "featureGates: [flowControl]\n" + PROFILES + "plugins: [{type: queue-scorer}]\n"
            "flowControl: {defaultRequestTTL: 60}\n",
            "flowControl.defaultRequestTTL (line 8): Expected `str | null`, got `int`",
        ),
        (
            "featureGates: [flowControl]\n" + PROFILES + "plugins: [{type: queue-scorer}]\n"
            "flowControl:\n  priorityBands:\n  - {priority: 1}\n  - {priority: 1}\n",
            "flowControl.priorityBands[1].priority (line 11): duplicate priority band 1",
        ),
        (
            "featureGates: [flowControl]\n" + PROFILES + "plugins: [{type: queue-scorer}]\n"
            "flowControl:\n  priorityBands:\n  - {maxRequests: 3}\n",
            "flowControl.priorityBands[0] (line 10): priority is required",
        ),
        (
            "featureGates: [flowControl]\n" + PROFILES + "plugins: [{type: queue-scorer}]\n"
            "flowControl: {defaultPriorityBand: {priority: 3}}\n",
            "flowControl.defaultPriorityBand.priority (line 8): a band template takes no priority",
        ),
        (
            "featureGates: [flowControl]\n" + PROFILES + "plugins: [{type: queue-scorer}]\n"
            "flowControl: {defaultPriorityBand: {fairnessPolicyRef: fcfs-ordering-policy}}\n",
            "flowControl.defaultPriorityBand.fairnessPolicyRef (line 8): plugin 'fcfs-ordering-policy' "
            "(type 'fcfs-ordering-policy') is not a fairness policy",
        ),
        (
            "featureGates: [flowControl]\n" + PROFILES + "plugins: [{type: queue-scorer}]\n"
            "flowControl: {usageLimitPolicyPluginRef: queue-scorer}\n",
            "flowControl.usageLimitPolicyPluginRef (line 8): plugin 'queue-scorer' (type 'queue-scorer') "
            "is not a usage-limit policy",
        ),
        (
            "featureGates: [flowControl]\n" + PROFILES + "plugins: [{type: queue-scorer}]\n"
            "flowControl: {usageLimitPolicyPluginRef: soft-reflective-ceiling-policy}\n",
            "flowControl.usageLimitPolicyPluginRef (line 8): pluginRef 'soft-reflective-ceiling-policy' "
            "is not a defined plugin",
        ),
        (
            ON + "plugins: [{type: queue-scorer},\n"
            "  {type: priority-holdback-policy, parameters: {maxCeiling: 1}}]\n",
            "plugins[1].parameters (line 8): plugin 'priority-holdback-policy' (type "
            "'priority-holdback-policy'): minCeiling is required",
        ),
        (
            "featureGates: [flowControl]\n"
            + PROFILES
            + "plugins: [{type: queue-scorer}, {type: soft-reflective-ceiling-policy, parameters: {x: 1}}]\n",
            "plugins[1].parameters.x (line 7): unknown key 'x'",
        ),
        (
            ON + "plugins: [{type: queue-scorer},\n"
            "  {type: static-usage-limit-policy, parameters: {threshold: 2}}]\n",
            "plugins[1].parameters.threshold (line 8): Expected `float` <= 1",
        ),
        (
            ON
            + "plugins: [{type: queue-scorer}, {type: program-aware-fairness, parameters: {strategy: x}}]\n",
            "plugins[1].parameters.strategy (line 7): Invalid enum value 'x'",
        ),
        (
            "featureGates: [flowControl]\n"
            + PROFILES
            + "plugins: [{type: queue-scorer}, {type: eviction-sheddable-filter}]\n",
            "plugins[1] (line 7): plugin 'eviction-sheddable-filter' (type 'eviction-sheddable-filter') "
            "has an effect only with flowControl.enableEviction: true",
        ),
        (
            "featureGates: [flowControl]\nplugins: [{type: queue-scorer}, {type: edf-ordering-policy}]\n"
            "schedulingProfiles:\n- name: default\n  plugins: [{pluginRef: edf-ordering-policy}]\n",
            "schedulingProfiles[0].plugins[0] (line 7): plugin 'edf-ordering-policy' is a flow-control "
            "policy, not a filter, scorer or picker",
        ),
        (
            "featureGates: [flowControl]\n" + PROFILES + "plugins: [{type: queue-scorer}]\n"
            "flowControl: {saturationDetector: {pluginRef: queue-scorer}}\n",
            "flowControl.saturationDetector.pluginRef (line 8): plugin 'queue-scorer' (type 'queue-scorer') "
            "is not a saturation detector",
        ),
    ],
)
def test_refused_with_the_line(text: str, message: str) -> None:
    assert message in error(text)


def test_an_unused_flow_control_plugin_is_a_warning() -> None:
    built = setup(
        "featureGates: [flowControl]\nplugins: [{type: queue-scorer}, {type: edf-ordering-policy}]\n"
        + PROFILES
    )
    assert built.warnings == [
        "flow-control plugin 'edf-ordering-policy' (type 'edf-ordering-policy') is not used"
    ]


def test_the_detector_serves_legacy_admission_without_the_gate() -> None:
    built = setup(
        "plugins: [{type: queue-scorer}, {type: concurrency-detector}]\n"
        + PROFILES
        + "flowControl: {saturationDetector: {pluginRef: concurrency-detector}}\n"
    )
    assert built.config is None and built.detector.type == "concurrency-detector"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1Gi", 1 << 30),
        ("1G", 10**9),
        ("500M", 5 * 10**8),
        ("5k", 5000),
        (100, 100),
        ("1.5Ki", 1536),
        ("1e3", 1000),
        ("100m", 1),
    ],
)
def test_quantities(value: object, expected: int) -> None:
    assert fc_config.parse_quantity(value) == expected  # type: ignore[arg-type]
