"""GIE's and llm-d's vocabulary in EndpointPickerConfig: both apiVersions, llm-d's plugin names,
the strict inline sections, and what is refused."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from epp.kvcache.index import BlockIndex
from epp.scheduling import config
from epp.scheduling.plugins.precise_llmd import KVEventsSettings
from epp.tokenize.render import RenderSpec

from . import builders

LLMD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
GIE = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def load(body: str, head: str = LLMD, *, base_dir: Path | None = None) -> config.SchedulerConfig:
    return config.load_config(head + textwrap.dedent(body), builders.handle(BlockIndex()), base_dir=base_dir)


def refused(body: str, head: str = GIE) -> str:
    with pytest.raises(config.ConfigError) as info:
        load(body, head)
    return str(info.value)


def test_both_api_versions_load_the_same_schema() -> None:
    body = "plugins: [{type: decode-filter}, {type: load-aware-scorer}]\n"
    for head in (LLMD, GIE):
        profile = load(body, head).scheduler.profiles[0]
        assert ([f.type for f in profile.filters], [s.type for s, _ in profile.scorers]) == (
            ["decode-filter"],
            ["load-aware-scorer"],
        )
    message = refused("plugins: []\n", "apiVersion: llm-d.ai/v1beta1\nkind: EndpointPickerConfig\n")
    assert (
        "apiVersion (line 1): expected 'inference.networking.x-k8s.io/v1alpha1' or 'llm-d.ai/v1alpha1'"
        in message
    )


def test_token_producer_with_and_without_a_path(tmp_path: Path) -> None:
    cfg = load(
        """
        plugins:
        - name: local
          type: token-producer
          parameters: {modelName: m1, path: tok}
        - name: sidecar
          type: token-producer
          parameters:
            modelName: m2
            vllm: {http: "http://localhost:8000", timeout: 5s}
        - type: queue-scorer
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: local}, {pluginRef: sidecar}, {pluginRef: queue-scorer}]
        """,
        base_dir=tmp_path,
    )
    assert cfg.tokenizers == {"m1": tmp_path / "tok"}
    assert cfg.render == {"m2": RenderSpec(url="http://localhost:8000", model_name="m2", timeout=5.0)}
    message = refused(
        "plugins:\n- {type: token-producer, parameters: {modelName: m, vllm: {url: x}}}\n", LLMD
    )
    assert "plugins[0].parameters.vllm.url (line 4)" in message and "http:// URL" in message
    message = refused(
        "plugins:\n- {name: a, type: token-producer, parameters: {modelName: m}}\n"
        "- {name: b, type: tokenizer, parameters: {modelName: m}}\n"
    )
    assert "plugins[1].parameters.modelName (line 5): 'm' already has a token producer" in message


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            "featureGates: [flowControll]\n",
            "featureGates[0] (line 3): unknown feature gate 'flowControll'; known gates:",
        ),
        ("featureGates: [1]\n", "featureGates[0] (line 3): Expected `str`, got `int`"),
        (
            "plugins: [{type: metrics-data-source}]\ndataLayer:\n  sources:\n"
            "  - pluginRef: metrics-data-source\n    extractor: []\n",
            "dataLayer.sources[0].extractor (line 7): unknown key 'extractor'",
        ),
        (
            "dataLayer: {injectDefaults: maybe}\n",
            "dataLayer.injectDefaults (line 3): Expected `bool | null`, got `str`",
        ),
        ("dataLayer: {sources: [{pluginRef: nope}]}\n", "pluginRef 'nope' is not a defined plugin"),
        (
            "plugins: [{type: openai-parser}]\nparser: {pluginRef: openai-parser, mode: fast}\n",
            "parser.mode (line 4): unknown key",
        ),
        (
            "plugins: [{type: metrics-data-source, parameters: {port: 70000}}]\n",
            "plugins[0].parameters.port (line 3)",
        ),
        ("plugins: [{type: metrics-data-source, parameters: {interval: soon}}]\n", "invalid interval"),
        ("plugins: [{type: metrics-data-source, parameters: {refresh: 1s}}]\n", "unknown key 'refresh'"),
        (
            "plugins: [{type: disagg-profile-handler}]\n",
            "plugins[0] (line 3): plugin 'disagg-profile-handler'",
        ),
        ("plugins: [{type: active-request-scorer, parameters: {maxBusyScore: 2}}]\n", "maxBusyScore"),
        (
            "plugins: [{type: data-parallel-profile-handler, parameters: {primaryPort: 0}}]\n",
            "plugins[0].parameters.primaryPort (line 3)",
        ),
    ],
)
def test_inline_sections_and_gie_only_plugins_are_strict(body: str, fragment: str) -> None:
    assert fragment in refused(body)


def test_precise_scorer_may_extract_for_a_notification_source_and_dp_handler_is_single() -> None:
    cfg = load(
        """
        plugins:
        - type: endpoint-notification-source
        - type: precise-prefix-cache-scorer
        - type: data-parallel-profile-handler
          parameters: {primaryPort: 8000}
        dataLayer:
          sources:
          - pluginRef: endpoint-notification-source
            extractors: [{pluginRef: precise-prefix-cache-scorer}]
        """
    )
    assert [s.type for s, _ in cfg.scheduler.profiles[0].scorers] == ["precise-prefix-cache-scorer"]
    assert any("works as single-profile-handler" in w for w in cfg.warnings)
    message = refused(
        "plugins: [{type: endpoint-notification-source}, {type: queue-scorer}, {type: metrics-data-source}]\n"
        "dataLayer: {sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: queue-scorer}]}]}\n"
    )
    assert "(type 'queue-scorer') is not a metrics extractor" in message


def test_two_precise_scorers_must_agree_on_kv_events() -> None:
    message = refused(
        """
        plugins:
        - {name: a, type: precise-prefix-cache-scorer, parameters: {kvEventsConfig: {zmqEndpoint: "tcp://*:1"}}}
        - {name: b, type: precise-prefix-cache-scorer, parameters: {kvEventsConfig: {}}}
        """,
        LLMD,
    )
    assert "plugins[1].parameters (line 6)" in message
    assert "epp consumes KV events one way" in message


def test_requested_kv_events_reads_the_config_before_the_index_exists() -> None:
    text = (
        LLMD
        + "plugins:\n- type: precise-prefix-cache-scorer\n  parameters: {kvEventsConfig: {zmqEndpoint: 'tcp://*:7'}}\n"
    )
    assert config.requested_kv_events(text) == KVEventsSettings("bind", bind="tcp://*:7")
    assert config.requested_kv_events(GIE + "plugins: [{type: precise-prefix-cache-scorer}]\n") is None
    assert config.requested_kv_events(None) is None
    assert config.requested_kv_events("not: [valid") is None
