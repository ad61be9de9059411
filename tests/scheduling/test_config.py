"""Loading EndpointPickerConfig: the default, GIE examples, GIE's defaulting rules, every error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from epp.kvcache.index import BlockIndex
from epp.scheduling import config, framework, interfaces
from epp.scheduling.plugins import queue_scorer

from . import builders

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def load(body: str) -> config.SchedulerConfig:
    return config.load_config(HEAD + textwrap.dedent(body), builders.handle())


def only_profile(cfg: config.SchedulerConfig) -> framework.Profile:
    assert len(cfg.scheduler.profiles) == 1
    return cfg.scheduler.profiles[0]


def shape(profile: framework.Profile) -> tuple[list[str], list[tuple[str, float]], str]:
    """(filter names, (scorer name, weight) pairs, picker type) of a profile."""
    return (
        [f.name for f in profile.filters],
        [(s.name, w) for s, w in profile.scorers],
        profile.picker.type,
    )


# ---- valid configurations ------------------------------------------------------------------------


def test_default_config() -> None:
    cfg = config.load_config(None, builders.handle())
    profile = only_profile(cfg)
    assert profile.name == "default" == cfg.scheduler.primary
    assert shape(profile) == (
        [],
        [
            ("queue-scorer", 2.0),
            ("kv-cache-utilization-scorer", 2.0),
            ("prefix-cache-scorer", 3.0),
            ("inflight-load-scorer", 1.0),
        ],
        "max-score-picker",
    )
    assert cfg.warnings == []
    # The prefix scorer learns from each decision; nothing listens for responses by default.
    assert [p.type for p in cfg.pre_request] == ["prefix-cache-scorer"]
    assert cfg.response_complete == []


def test_default_config_with_kv_events_is_the_precise_one() -> None:
    cfg = config.load_config(None, builders.handle(BlockIndex()))
    # The whole request's latency over the precise match (the precise scorer at weight 0 only
    # supplies it).
    assert shape(only_profile(cfg))[1] == [
        ("precise-prefix-cache-scorer", 0.0),
        ("request-latency-scorer", 1.0),
    ]
    assert cfg.scheduler.consumes_tokens()
    assert sorted(p.type for p in cfg.response_complete) == ["request-latency-scorer"]
    text = config.default_config_text(precise=True)
    assert shape(only_profile(config.load_config(text, builders.handle(BlockIndex())))) == shape(
        only_profile(cfg)
    )


def test_default_config_is_the_packaged_yaml() -> None:
    text = config.default_config_text()
    assert "kind: EndpointPickerConfig" in text
    cfg = config.load_config(text, builders.handle())
    assert shape(only_profile(cfg)) == shape(only_profile(config.load_config(None, builders.handle())))


def test_default_config_routes_to_the_least_loaded_endpoint() -> None:
    cfg = config.load_config(None, builders.handle())
    eps = [
        builders.endpoint("busy", waiting=8, kv=0.9, inflight_requests=4),
        builders.endpoint("idle", waiting=0, kv=0.1, inflight_requests=0),
        builders.endpoint("mid", waiting=3, kv=0.5, inflight_requests=2),
    ]
    result = cfg.scheduler.schedule(builders.request(), eps, explain=True)
    assert [ep.name for ep in result.targets] == ["idle"]
    assert result.profiles["default"].scores["busy"] == {
        "queue-scorer": 0.0,
        "kv-cache-utilization-scorer": pytest.approx(0.1),
        "prefix-cache-scorer": 0.0,  # nothing routed yet: no prefix is known anywhere
        "inflight-load-scorer": 0.0,
    }


def test_gie_example_with_names_parameters_and_weights() -> None:
    cfg = load(
        """
        plugins:
        - type: queue-scorer
        - name: kv
          type: kv-cache-utilization-scorer
        - name: lora
          type: lora-affinity-scorer
        - type: max-score-picker
          parameters:
            maxNumOfEndpoints: 2
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: queue-scorer
            weight: 2
          - pluginRef: kv
            weight: 1.5
          - pluginRef: lora
          - pluginRef: max-score-picker
        """
    )
    profile = only_profile(cfg)
    assert shape(profile) == ([], [("queue-scorer", 2.0), ("kv", 1.5), ("lora", 1.0)], "max-score-picker")
    assert list(cfg.plugins) == ["queue-scorer", "kv", "lora", "max-score-picker"]
    assert cfg.plugins["kv"].type == "kv-cache-utilization-scorer"
    eps = [
        builders.endpoint("a", waiting=5),
        builders.endpoint("b", waiting=0),
        builders.endpoint("c", waiting=1),
    ]
    assert [ep.name for ep in cfg.scheduler.schedule(builders.request(), eps).targets] == ["b", "c"]


def test_filters_keep_profile_order_and_one_type_may_be_configured_twice() -> None:
    cfg = load(
        """
        plugins:
        - {name: by-requests, type: inflight-load-scorer}
        - {name: by-tokens, type: inflight-load-scorer, parameters: {mode: tokens}}
        - {name: second, type: header-based-testing-filter}
        - {name: first, type: header-based-testing-filter}
        - {type: random-picker}
        schedulingProfiles:
        - name: p
          plugins:
          - pluginRef: first
          - pluginRef: second
          - {pluginRef: by-tokens, weight: 3}
          - {pluginRef: by-requests}
          - {pluginRef: random-picker}
        """
    )
    assert shape(only_profile(cfg)) == (
        ["first", "second"],
        [("by-tokens", 3.0), ("by-requests", 1.0)],
        "random-picker",
    )
    assert cfg.scheduler.primary == "p"


def test_a_profile_without_picker_gets_max_score_picker() -> None:
    cfg = load(
        """
        plugins:
        - type: queue-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: queue-scorer
        """
    )
    picker = only_profile(cfg).picker
    assert picker.type == "max-score-picker" and picker.name == "max-score-picker"
    assert "max-score-picker" not in cfg.plugins  # injected, not configured


def test_empty_profiles_make_a_default_profile_of_all_scheduling_plugins_with_weight_one() -> None:
    cfg = load(
        """
        plugins:
        - type: header-based-testing-filter
        - type: queue-scorer
        - type: single-profile-handler
        - type: token-load-scorer
          parameters: {queueThresholdTokens: 1000}
        - type: weighted-random-picker
        """
    )
    profile = only_profile(cfg)
    assert profile.name == "default"
    assert shape(profile) == (
        ["header-based-testing-filter"],
        [("queue-scorer", 1.0), ("token-load-scorer", 1.0)],
        "weighted-random-picker",
    )
    assert cfg.warnings == []


def test_no_plugins_at_all_is_a_default_profile_with_the_default_picker() -> None:
    profile = only_profile(load("plugins: []\n"))
    assert shape(profile) == ([], [], "max-score-picker")


def test_an_explicit_single_profile_handler_is_accepted() -> None:
    cfg = load(
        """
        plugins:
        - type: single-profile-handler
        - type: queue-scorer
        schedulingProfiles:
        - name: only
          plugins: [{pluginRef: queue-scorer}]
        """
    )
    assert cfg.scheduler.profile_names() == ["only"]


def test_unused_scheduling_plugins_are_reported() -> None:
    cfg = load(
        """
        plugins:
        - type: queue-scorer
        - type: kv-cache-utilization-scorer
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: queue-scorer}]
        """
    )
    assert cfg.warnings == [
        "plugin 'kv-cache-utilization-scorer' (type 'kv-cache-utilization-scorer') is not used by any profile"
    ]


def test_gie_sections_load_with_warnings_and_flow_control_is_handed_on() -> None:
    # Shaped like GIE's Helm default-plugins.yaml plus the optional sections.
    cfg = load(
        """
        featureGates: [dataLayer, flowControl]
        plugins:
        - type: queue-scorer
        - type: kv-cache-utilization-scorer
        - type: metrics-data-source
          parameters: {scheme: http, path: /metrics}
        - type: core-metrics-extractor
        - name: detector
          type: utilization-detector
          parameters: {queueDepthThreshold: 5}
        - type: openai-parser
        - type: fcfs-ordering-policy
        schedulingProfiles:
        - name: default
          plugins:
          - {pluginRef: queue-scorer, weight: 2}
          - {pluginRef: kv-cache-utilization-scorer, weight: 2}
        saturationDetector:
          pluginRef: detector
        dataLayer:
          sources:
          - pluginRef: metrics-data-source
            extractors:
            - pluginRef: core-metrics-extractor
        flowControl:
          maxBytes: 1Gi
          priorityBands:
          - {priority: 0, orderingPolicyRef: fcfs-ordering-policy}
        parser:
          pluginRef: openai-parser
        """
    )
    assert shape(only_profile(cfg)) == (
        [],
        [("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0)],
        "max-score-picker",
    )
    assert list(cfg.plugins) == ["queue-scorer", "kv-cache-utilization-scorer", "detector"]
    assert cfg.saturation_detector is cfg.plugins["detector"]
    # The metrics source is epp's scrape (its scheme and path given: the flags' apply otherwise).
    assert (cfg.data_layer.metrics.scheme, cfg.data_layer.metrics.path) == ("http", "/metrics")
    assert cfg.warnings == [
        "featureGates 'dataLayer' has no effect: epp's data layer (scraping, /v1/models) is always on",
        "the top-level `parser` is deprecated: use requestHandler.parsers",
    ]
    assert [p.type for p in cfg.parsers.active] == ["openai-parser"]
    # Flow control's part is handed on undecoded (epp.flowcontrol.config builds it: tests/flowcontrol).
    flow = cfg.flow_control
    assert flow is not None and flow.enabled
    assert flow.section == {
        "maxBytes": "1Gi",
        "priorityBands": [{"priority": 0, "orderingPolicyRef": "fcfs-ordering-policy"}],
    }
    assert [(name, type_name) for _, name, type_name, _ in flow.plugins] == [
        ("fcfs-ordering-policy", "fcfs-ordering-policy")
    ]


def test_plugins_implementing_director_hooks_are_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def pre_request(self: object, request: object, result: object) -> None:
        calls.append("pre")

    # Give a built-in scorer a pre_request hook: the config must find it among the plugins.
    monkeypatch.setattr(queue_scorer.QueueScorer, "pre_request", pre_request, raising=False)
    cfg = load("plugins: [{type: queue-scorer}, {type: kv-cache-utilization-scorer}]\n")
    assert [p.name for p in cfg.pre_request] == ["queue-scorer"]
    assert isinstance(cfg.pre_request[0], interfaces.PreRequest)
    assert cfg.response_complete == []


def test_load_config_file(tmp_path: Path) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(HEAD + "plugins: [{type: queue-scorer}]\n")
    cfg = config.load_config_file(path, builders.handle())
    assert shape(only_profile(cfg)) == ([], [("queue-scorer", 1.0)], "max-score-picker")


def test_load_config_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(HEAD + "plugins: [{type: nope}]\n")
    with pytest.raises(
        config.ConfigError, match=rf"^{path}: plugins\[0\] \(line 3\): plugin 'nope': unknown"
    ):
        config.load_config_file(path, builders.handle())
    with pytest.raises(config.ConfigError, match=r"missing\.yaml: cannot read"):
        config.load_config_file(tmp_path / "missing.yaml", builders.handle())


# ---- errors: each names its culprit and, where it has one, its line -------------------------------

ERRORS: list[tuple[str, str, list[str]]] = [
    ("yaml syntax", HEAD + "plugins: [\n  {type: queue-scorer\n", ["invalid YAML at line 5"]),
    ("yaml tab", HEAD + "plugins:\n\t- type: x\n", ["invalid YAML at line 4"]),
    ("empty", "", ["the configuration is empty"]),
    ("comments only", "# nothing\n", ["the configuration is empty"]),
    ("not a mapping", "- a\n- b\n", ["must be a YAML mapping", "got list"]),
    ("duplicate yaml key", HEAD + "plugins: []\nplugins: []\n", ["duplicate key 'plugins' at line 4"]),
    (
        "unknown top-level key",
        HEAD + "plugins: []\nschedulingProfile: []\n",
        ["schedulingProfile (line 4): unknown key 'schedulingProfile'", "has: apiVersion, kind, plugins"],
    ),
    (
        "wrong apiVersion",
        "apiVersion: v1\nkind: EndpointPickerConfig\n",
        ["apiVersion (line 1): expected", "got 'v1'"],
    ),
    (
        "missing kind",
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\n",
        ["kind is missing; expected kind: EndpointPickerConfig"],
    ),
    ("missing apiVersion", "kind: EndpointPickerConfig\n", ["apiVersion is missing"]),
    (
        "wrong kind",
        HEAD.replace("EndpointPickerConfig", "InferencePool"),
        ["kind (line 2)", "'InferencePool'"],
    ),
    ("plugins not a list", HEAD + "plugins: {type: queue-scorer}\n", ["plugins (line 3): Expected `array`"]),
    (
        "missing type",
        HEAD + "plugins:\n- name: x\n",
        ["plugins[0] (line 4)", "missing required field `type`"],
    ),
    ("empty type", HEAD + "plugins:\n- type: ''\n", ["plugins[0] (line 4): plugin type is empty"]),
    (
        "misspelt plugin key",
        HEAD + "plugins:\n- type: queue-scorer\n  paramters: {}\n",
        ["plugins[0].paramters (line 5): unknown key 'paramters'"],
    ),
    (
        "unknown plugin type",
        HEAD + "plugins:\n- type: queue-scorer\n- name: mine\n  type: prefix-scorer\n",
        ["plugins[1] (line 5): plugin 'mine': unknown plugin type 'prefix-scorer'"],
    ),
    (
        "unknown parameter",
        HEAD + "plugins:\n- type: max-score-picker\n  parameters:\n    maxEndpoints: 2\n",
        [
            "plugins[0].parameters.maxEndpoints (line 6)",
            "plugin 'max-score-picker' (type 'max-score-picker')",
            "`maxEndpoints`",
        ],
    ),
    (
        "mistyped parameter",
        HEAD + "plugins:\n- {name: p, type: max-score-picker, parameters: {maxNumOfEndpoints: two}}\n",
        [
            "plugins[0].parameters.maxNumOfEndpoints (line 4): plugin 'p' (type 'max-score-picker')",
            "got `str` - at `$.maxNumOfEndpoints`",
        ],
    ),
    (
        "parameters not a mapping",
        HEAD + "plugins:\n- type: queue-scorer\n  parameters: [1]\n",
        ["plugins[0].parameters (line 5): Expected `object | null`"],
    ),
    (
        "duplicate plugin name",
        HEAD + "plugins:\n- type: queue-scorer\n- name: queue-scorer\n  type: kv-cache-utilization-scorer\n",
        ["plugins[1] (line 5): duplicate plugin name 'queue-scorer'"],
    ),
    (
        "undefined pluginRef",
        HEAD
        + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n"
        + "  - pluginRef: queue-scorer\n  - pluginRef: kv-scorer\n",
        ["schedulingProfiles[0].plugins[1] (line 9): pluginRef 'kv-scorer' is not a defined plugin"],
    ),
    (
        "weight on a picker",
        HEAD
        + "plugins:\n- type: max-score-picker\nschedulingProfiles:\n- name: default\n  plugins:\n"
        + "  - pluginRef: max-score-picker\n    weight: 2\n",
        [
            "schedulingProfiles[0].plugins[0] (line 8)",
            "'max-score-picker'",
            "has a weight but is not a scorer",
        ],
    ),
    (
        "weight on a filter",
        HEAD
        + "plugins:\n- {name: f, type: header-based-testing-filter}\nschedulingProfiles:\n- name: default\n"
        + "  plugins: [{pluginRef: f, weight: 1}]\n",
        ["plugin 'f' (type 'header-based-testing-filter') has a weight but is not a scorer"],
    ),
    (
        "negative weight",
        HEAD
        + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: d\n  plugins:\n"
        + "  - {pluginRef: queue-scorer, weight: -1}\n",
        ["schedulingProfiles[0].plugins[0].weight (line 7)", ">= 0.0"],
    ),
    (
        "infinite weight",
        HEAD
        + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: d\n  plugins:\n"
        + "  - {pluginRef: queue-scorer, weight: .inf}\n",
        [
            "schedulingProfiles[0].plugins[0] (line 7): plugin 'queue-scorer'",
            "weight inf; a weight must be finite",
        ],
    ),
    (
        "string weight",
        HEAD
        + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: d\n  plugins:\n"
        + "  - {pluginRef: queue-scorer, weight: high}\n",
        ["schedulingProfiles[0].plugins[0].weight (line 7): Expected `float | null`, got `str`"],
    ),
    (
        "two pickers",
        HEAD
        + "plugins: [{type: max-score-picker}, {type: random-picker}]\nschedulingProfiles:\n- name: d\n"
        + "  plugins: [{pluginRef: max-score-picker}, {pluginRef: random-picker}]\n",
        ["schedulingProfiles[0].plugins[1]", "profile 'd' already has picker 'max-score-picker'"],
    ),
    (
        "two pickers in the implicit default profile",
        HEAD + "plugins: [{type: max-score-picker}, {type: queue-scorer}, {type: random-picker}]\n",
        ["plugins[2] (line 3)", "profile 'default' already has picker 'max-score-picker'"],
    ),
    (
        "plugin listed twice in a profile",
        HEAD
        + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: d\n"
        + "  plugins: [{pluginRef: queue-scorer}, {pluginRef: queue-scorer, weight: 2}]\n",
        [
            "schedulingProfiles[0].plugins[1]",
            "'queue-scorer' (type 'queue-scorer') is listed twice in profile 'd'",
        ],
    ),
    (
        "handler used in a profile",
        HEAD
        + "plugins: [{type: single-profile-handler}]\nschedulingProfiles:\n- name: d\n"
        + "  plugins: [{pluginRef: single-profile-handler}]\n",
        ["'single-profile-handler' (type 'single-profile-handler') is not a filter, scorer or picker"],
    ),
    (
        "two handlers",
        HEAD + "plugins: [{type: single-profile-handler}, {name: h2, type: single-profile-handler}]\n",
        ["more than one profile handler: single-profile-handler, h2"],
    ),
    (
        "two profiles",
        HEAD
        + "plugins: [{type: queue-scorer}]\nschedulingProfiles:\n- name: prefill\n  plugins: []\n"
        + "- name: decode\n  plugins: []\n",
        [
            "schedulingProfiles (line 4)",
            "2 profiles (prefill, decode)",
            "need a multi-profile handler (disagg-profile-handler, header-profile-handler)",
        ],
    ),
    (
        "duplicate profile name",
        HEAD + "plugins: []\nschedulingProfiles:\n- name: d\n- name: d\n",
        ["schedulingProfiles[1] (line 6): duplicate profile name 'd'"],
    ),
    (
        "empty profile name",
        HEAD + "plugins: []\nschedulingProfiles:\n- name: ''\n",
        ["schedulingProfiles[0] (line 5): profile name is empty"],
    ),
    (
        "GIE-only plugin in a profile",
        HEAD
        + "plugins: [{name: u, type: metrics-data-source}]\nschedulingProfiles:\n- name: d\n"
        + "  plugins: [{pluginRef: u}]\n",
        [
            "schedulingProfiles[0].plugins[0] (line 6): plugin 'u' is a data-layer metrics source, not a "
            "filter, scorer or picker"
        ],
    ),
    (
        "featureGates not a list",
        HEAD + "featureGates: flowControl\n",
        ["featureGates (line 3): Expected `array`, got `str`"],
    ),
    (
        "flowControl not a mapping",
        HEAD + "flowControl: [1]\n",
        ["flowControl (line 3): Expected `object | null`"],
    ),
    (
        "parser ref undefined",
        HEAD + "plugins: []\nparser:\n  pluginRef: nope\n",
        ["parser.pluginRef (line 5): pluginRef 'nope' is neither a parser plugin nor a parser type"],
    ),
    (
        "parser ref to a scorer",
        HEAD + "plugins: [{type: queue-scorer}]\nparser: {pluginRef: queue-scorer}\n",
        ["parser.pluginRef (line 4): pluginRef 'queue-scorer' is neither a parser plugin nor a parser type"],
    ),
    (
        "saturation detector ref of the wrong kind",
        HEAD
        + "plugins: [{type: metrics-data-source}]\nsaturationDetector: {pluginRef: metrics-data-source}\n",
        ["saturationDetector.pluginRef", "(type 'metrics-data-source') is not a saturation detector"],
    ),
    (
        "data layer extractor ref undefined",
        HEAD
        + "plugins: [{type: metrics-data-source}]\n"
        + "dataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n"
        + "    extractors: [{pluginRef: core-metrics-extractor}]\n",
        [
            "dataLayer.sources[0].extractors[0].pluginRef (line 7)",
            "'core-metrics-extractor' is not a defined",
        ],
    ),
]


@pytest.mark.parametrize(("case", "text", "fragments"), ERRORS, ids=[e[0] for e in ERRORS])
def test_config_errors_name_the_culprit(case: str, text: str, fragments: list[str]) -> None:
    with pytest.raises(config.ConfigError) as info:
        config.load_config(text, builders.handle())
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
