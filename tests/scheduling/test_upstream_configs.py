"""GIE's and llm-d's published EndpointPickerConfigs (tests/scheduling/data/upstream/, sources in
its README): each loads, or is refused naming the plugin, the parameter and the line, for the
reason docs/configs.md gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.kvcache.index import BlockIndex
from epp.scheduling import config
from epp.scheduling.plugins.precise_llmd import KVEventsSettings
from epp.scheduling.plugins.precise_prefix_cache_scorer import PrefixMatch
from epp.scheduling.plugins.prefix_cache_scorer import PrefixCacheScorer

from . import builders

DATA = Path(__file__).parent / "data" / "upstream"

_PD = "is not supported: P/D (prefill/decode) and E/P/D disaggregation are not supported"
_GRPC = "(type 'vllmgrpc-parser') is not supported: epp parses OpenAI HTTP request bodies only"
_CEL = "(type 'request-attribute-reporter') is not supported: epp has no CEL request-attribute reporter"
_STALE_TP = (
    "plugins[0].parameters.indexerConfig.tokenProcessorConfig (line 7): plugin 'precise-prefix-cache-scorer'"
)

# File -> None (loads) or fragments of the refusal, location first.
EXPECTED: dict[str, list[str] | None] = {
    "gie-v1.0.0-config__charts__inferencepool__templates__epp-config.yaml": None,
    "gie-v1.0.0-conformance__resources__base.yaml": None,
    "gie-v1.0.0-site-src__guides__epp-configuration__config-text-2.yaml": None,
    "gie-v1.0.0-site-src__guides__epp-configuration__config-text-3.yaml": [
        "schedulingProfiles[0].-pluginRef (line 16): unknown key '-pluginRef'"
    ],
    "gie-v1.0.0-test__testdata__configloader_1_test.yaml": [
        "plugins[0] (line 4): plugin 'test1': unknown plugin type 'test-one'"
    ],
    "gie-v1.5.0-chart-default-rendered.yaml": None,
    "gie-v1.5.0-config__charts__inferencepool__README-1.yaml": [
        "plugins[0] (line 4): plugin 'custom-scorer': unknown plugin type 'custom-scorer'"
    ],
    "gie-v1.5.0-conformance__resources__base.yaml": [
        "plugins[1] (line 5): plugin 'destination-endpoint-served-verifier'",
        "epp has no response-header plugin hook",
    ],
    "gie-v1.5.0-pkg__epp__framework__plugins__requesthandling__parsers__README-1.yaml": [
        "plugins[1] (line 6): plugin 'vllmgrpcParser'",
        _GRPC,
    ],
    "gie-v1.5.0-site-src__guides__epp-configuration__config-text-2.yaml": None,
    "gie-v1.5.0-site-src__guides__epp-configuration__config-text-3.yaml": None,
    "gie-v1.5.0-site-src__guides__troubleshooting-1.yaml": [
        "plugins[2].parameters.blockSize (line 8): plugin 'prefix-cache-scorer'",
        "deprecated block size in characters, which GIE itself refuses",
    ],
    "gie-v1.5.0-site-src__guides__troubleshooting-2.yaml": [
        "plugins[2].parameters.blockSize (line 8): plugin 'prefix-cache-scorer'",
    ],
    "gie-v1.5.0-site-src__implementations__model-servers-1.yaml": [
        "plugins[0].parameters.defaultEngine (line 9): plugin 'core-metrics-extractor'",
        "'sglang': epp reads vLLM's metrics only",
    ],
    "gie-v1.5.0-site-src__implementations__model-servers-2.yaml": [
        "plugins[0].parameters.engineConfigs (line 11): plugin 'core-metrics-extractor'",
        "'sglang': epp reads vLLM's metrics only",
    ],
    "gie-v1.5.0-test__integration__epp__testdata__datalayer-config.yaml": [
        "plugins[5] (line 9): plugin 'mock-metrics-source': unknown plugin type"
    ],
    "gie-v1.5.0-test__integration__epp__testdata__default-config.yaml": None,
    "gie-v1.5.0-test__integration__epp__testdata__request-attribute-reporter-config.yaml": [
        "plugins[1] (line 5): plugin 'total-tokens-cost-reporter'",
        _CEL,
    ],
    "gie-v1.5.0-test__testdata__configloader_1_test.yaml": [
        "plugins[0] (line 4): plugin 'test1': unknown plugin type 'test-one'"
    ],
    "llm-d-guides-gaie-kv-events.yaml": None,
    "llm-d-guides-inference-scheduling.yaml": None,
    "llm-d-guides-pd-disaggregation.yaml": ["plugins[0] (line 6): plugin 'disagg-headers-handler'", _PD],
    "llm-d-guides-precise-prefix-cache-aware-pod-discovery.yaml": None,
    "llm-d-guides-precise-prefix-cache-aware.yaml": None,
    "llm-d-router-HEAD-deploy__config__dp-epp-config.yaml": None,
    "llm-d-router-HEAD-deploy__config__epp-config.yaml": None,
    "llm-d-router-HEAD-deploy__config__epp-estimate-prefix-cache-config.yaml": None,
    "llm-d-router-HEAD-deploy__config__epp-precise-prefix-cache-config.yaml": None,
    "llm-d-router-HEAD-deploy__config__pd-epp-config.yaml": [
        "plugins[5] (line 12): plugin 'prefix-based-pd-decider'",
        _PD,
    ],
    "llm-d-router-HEAD-deploy__config__probabilistic-admitter-epp-config.yaml": [
        "plugins[0] (line 4): plugin 'probabilistic-admitter'",
        "no admitter plugins",
    ],
    "llm-d-router-HEAD-deploy__config__sim-e-p-d-epp-config.yaml": [
        "plugins[4] (line 8): plugin 'always-disagg-multimodal-decider'",
        _PD,
    ],
    "llm-d-router-HEAD-deploy__config__sim-e-pd-epp-config.yaml": [
        "plugins[3] (line 7): plugin 'always-disagg-multimodal-decider'",
        _PD,
    ],
    "llm-d-router-HEAD-deploy__config__sim-epp-config.yaml": None,
    "llm-d-router-HEAD-deploy__config__sim-epp-kvcache-config.yaml": None,
    "llm-d-router-HEAD-deploy__config__sim-epp-no-hit-lru.yaml": [
        _STALE_TP,
        "llm-d ignores it there too",
    ],
    "llm-d-router-HEAD-deploy__config__sim-epp-tokenizer-vllm-http-config.yaml": None,
    "llm-d-router-HEAD-deploy__config__sim-pd-epp-config.yaml": [
        "plugins[5] (line 14): plugin 'prefix-based-pd-decider'",
        _PD,
    ],
    "llm-d-router-HEAD-docs__architecture-2.yaml": [_STALE_TP, "llm-d ignores it there too"],
    "llm-d-router-HEAD-docs__disaggregation-1.yaml": [
        "plugins[4] (line 27): plugin 'prefix-based-pd-decider'",
        _PD,
    ],
    "llm-d-router-HEAD-docs__disaggregation-2.yaml": [
        "plugins[5] (line 35): plugin 'always-disagg-multimodal-decider'",
        _PD,
    ],
    "llm-d-router-HEAD-pkg__epp__framework__plugins__datalayer__source__models__README-1.yaml": [
        "data (line 12): unknown key 'data'"
    ],
    "llm-d-router-HEAD-pkg__epp__framework__plugins__requestcontrol__"
    "requestattributereporter__README-1.yaml": [
        "plugins[0] (line 4): plugin 'total-tokens-cost-reporter'",
        _CEL,
    ],
    "llm-d-router-HEAD-pkg__epp__framework__plugins__requesthandling__parsers__README-1.yaml": [
        "plugins[1] (line 6): plugin 'vllmgrpcParser'",
        _GRPC,
    ],
}


def _load(name: str) -> config.SchedulerConfig:
    return config.load_config_file(DATA / name, builders.handle(BlockIndex()))


def test_every_file_is_expected_and_documented() -> None:
    files = sorted(p.name for p in DATA.glob("*.yaml"))
    assert files == sorted(EXPECTED)
    readme = (DATA / "README.md").read_text("utf-8")
    assert [f for f in files if f"`{f}`" not in readme] == []
    loads = sum(v is None for v in EXPECTED.values())
    assert f"Counts: {len(files)} configurations; {loads} load; {len(files) - loads} are refused" in readme


@pytest.mark.parametrize("name", sorted(n for n, v in EXPECTED.items() if v is None))
def test_loads_and_routes(name: str) -> None:
    cfg = _load(name)
    eps = [builders.endpoint("a", waiting=3), builders.endpoint("b", address="10.0.0.2")]
    result = cfg.scheduler.schedule(builders.request(), eps)
    assert result.targets  # a whole decision runs through the configured plugins
    text = (DATA / name).read_text("utf-8")
    assert config.requested_kv_events(text) == cfg.kv_events


@pytest.mark.parametrize("name", sorted(n for n, v in EXPECTED.items() if v is not None))
def test_refused_naming_plugin_parameter_and_line(name: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        _load(name)
    message = str(info.value)
    assert message.startswith(f"{DATA / name}: ")
    fragments = EXPECTED[name]
    assert fragments is not None
    for fragment in fragments:
        assert fragment in message


def test_llmd_precise_configs_say_how_kv_events_arrive() -> None:
    central = _load("llm-d-guides-precise-prefix-cache-aware.yaml")
    assert central.kv_events == KVEventsSettings("bind", bind="tcp://*:5557")
    assert central.tokenizer_models == ["Qwen/Qwen3-32B"]
    per_pod = _load("llm-d-guides-precise-prefix-cache-aware-pod-discovery.yaml")
    assert per_pod.kv_events == KVEventsSettings("connect", port=5557)
    # No kvEventsConfig at all: llm-d's defaults, per-pod subscribers on 5557.
    assert _load("llm-d-router-HEAD-deploy__config__epp-precise-prefix-cache-config.yaml").kv_events == (
        KVEventsSettings("connect", port=5557)
    )
    # GIE-style configurations leave KV events to the flags.
    assert _load("llm-d-guides-inference-scheduling.yaml").kv_events is None


def test_llmd_precise_block_size_and_profile_are_mapped() -> None:
    cfg = _load("llm-d-guides-precise-prefix-cache-aware.yaml")
    profile = cfg.scheduler.profiles[0]
    assert [f.type for f in profile.filters] == ["decode-filter"]
    assert [(s.type, w) for s, w in profile.scorers] == [
        ("precise-prefix-cache-scorer", 2.0),
        ("kv-cache-utilization-scorer", 1.0),
        ("queue-scorer", 1.0),
    ]
    request = builders.request()
    request.token_ids = list(range(200))
    result = cfg.scheduler.schedule(request, [builders.endpoint("a")])
    match = result.cycle["precise-prefix-cache-scorer"]
    assert isinstance(match, PrefixMatch)
    assert (match.block_size, match.request_blocks) == (64, 3)  # tokenProcessorConfig.blockSize


def test_gie_v1_0_hash_block_size_config_loads_with_its_block_size() -> None:
    cfg = _load("gie-v1.0.0-site-src__guides__epp-configuration__config-text-2.yaml")
    prefix = cfg.plugins["prefix-cache-scorer"]
    assert isinstance(prefix, PrefixCacheScorer)
    request = builders.request()
    request.prompt_texts = ["x" * 12]
    assert len(prefix.block_hashes(request)) == 3  # hashBlockSize 5: characters per block


def test_without_kv_events_a_precise_config_names_the_remedy() -> None:
    with pytest.raises(config.ConfigError, match=r"plugins\[1\] \(line 5\).*needs vLLM KV events"):
        config.load_config_file(DATA / "llm-d-guides-gaie-kv-events.yaml", builders.handle())
