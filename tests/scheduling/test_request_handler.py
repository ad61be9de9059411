"""llm-d's `requestHandler.parsers` and its parser plugin types in an EndpointPickerConfig."""

from __future__ import annotations

import textwrap

import pytest

from epp.api.errors import BadRequest
from epp.api.routes import Api
from epp.kvcache.index import BlockIndex
from epp.scheduling import config

from . import builders

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def _load(body: str) -> config.SchedulerConfig:
    return config.load_config(HEAD + textwrap.dedent(body), builders.handle(BlockIndex()))


def test_no_section_is_llm_ds_default() -> None:
    cfg = _load("plugins: [{type: queue-scorer}]\n")
    assert [p.type for p in cfg.parsers.active] == [
        "openai-parser",
        "anthropic-parser",
        "vllmhttp-parser",
        "passthrough-parser",
    ]
    assert cfg.parsers.resolve("/v1/anything").api is Api.PASSTHROUGH


def test_an_explicit_list_is_used_as_given() -> None:
    cfg = _load(
        """\
        plugins:
        - {type: queue-scorer}
        - {name: vllmhttpParser, type: vllmhttp-parser}
        - {name: openaiParser, type: openai-parser}
        requestHandler:
          parsers:
          - pluginRef: vllmhttpParser
          - pluginRef: openaiParser
        """
    )
    assert [(p.name, p.type) for p in cfg.parsers.active] == [
        ("vllmhttpParser", "vllmhttp-parser"),
        ("openaiParser", "openai-parser"),
    ]
    assert cfg.parsers.resolve("/inference/v1/generate").parser == "vllmhttpParser"
    with pytest.raises(BadRequest, match="no parser registered"):
        cfg.parsers.resolve("/v1/messages")  # no fallback unless listed
    assert cfg.warnings == []


def test_a_type_name_needs_no_declared_plugin_and_skips_are_warned() -> None:
    cfg = _load(
        """\
        plugins: [{type: queue-scorer}]
        requestHandler:
          parsers:
          - pluginRef: anthropic-parser
          - pluginRef: anthropic-parser
          - pluginRef: passthrough-parser
          - pluginRef: openai-parser
        """
    )
    assert [p.type for p in cfg.parsers.active] == ["anthropic-parser", "passthrough-parser"]
    assert cfg.parsers.resolve("/v1/chat/completions").api is Api.PASSTHROUGH
    assert len(cfg.warnings) == 2 and "after the fallback" in cfg.warnings[1]


def test_the_legacy_parser_stands_for_a_one_parser_list() -> None:
    cfg = _load("plugins: [{type: queue-scorer}]\nparser: {pluginRef: openai-parser}\n")
    assert [p.type for p in cfg.parsers.active] == ["openai-parser"]
    assert "deprecated" in cfg.warnings[0]
    both = _load(
        "plugins: [{type: queue-scorer}]\nparser: {pluginRef: openai-parser}\n"
        "requestHandler: {parsers: [{pluginRef: anthropic-parser}]}\n"
    )
    assert [p.type for p in both.parsers.active] == ["anthropic-parser"]  # the section wins


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        (
            "plugins: [{name: g, type: vllmgrpc-parser}]\n",
            ["plugins[0] (line 3): plugin 'g' (type 'vllmgrpc-parser') is not supported", "gRPC"],
        ),
        (
            "plugins: [{type: vertexai-parser}]\n",
            ["plugins[0] (line 3)", "Vertex AI", "use openai-parser"],
        ),
        (
            "plugins: [{type: sglanghttp-parser}]\n",
            ["plugins[0] (line 3)", "SGLang's native /generate"],
        ),
        (
            "plugins: [{type: queue-scorer}]\nrequestHandler: {parsers: [{pluginRef: vllmgrpc-parser}]}\n",
            ["requestHandler.parsers[0].pluginRef (line 4): parser 'vllmgrpc-parser' is not supported"],
        ),
        (
            "plugins: [{type: openai-parser, parameters: {x: 1}}]\n",
            ["plugins[0].parameters (line 3)", "takes no parameters"],
        ),
        (
            "plugins: [{type: queue-scorer}]\nrequestHandler: {parsers: [{pluginRef: queue-scorer}]}\n",
            ["pluginRef 'queue-scorer' is neither a parser plugin nor a parser type"],
        ),
        (
            "plugins: [{type: queue-scorer}]\nrequestHandler: {parsers: [{plugin: openai-parser}]}\n",
            ["requestHandler.parsers[0].plugin", "unknown key"],
        ),
        (
            "plugins: [{type: openai-parser}]\nschedulingProfiles:\n"
            "- {name: default, plugins: [{pluginRef: openai-parser}]}\n",
            ["is a parser, not a filter, scorer or picker"],
        ),
        (
            "plugins: [{type: openai-parser}, {name: openai-parser, type: queue-scorer}]\n",
            ["duplicate plugin name 'openai-parser'"],
        ),
    ],
)
def test_refusals_name_the_culprit(body: str, fragments: list[str]) -> None:
    with pytest.raises(config.ConfigError) as info:
        _load(body)
    for fragment in fragments:
        assert fragment in str(info.value)
