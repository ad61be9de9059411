"""GIE's and llm-d's published EndpointPickerConfigs, as facts (data/upstream_configs.json, made by
upstream_refs.py; sources and counts in data/README.md): each record is rendered here into a
configuration of our own layout and loaded through epp's loader. It loads and routes, or is refused
naming the plugin, the parameter and the line of that rendering, for the reason docs/configs.md
gives."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.kvcache.index import BlockIndex
from epp.scheduling import config
from epp.scheduling.plugins.precise_llmd import KVEventsSettings
from epp.scheduling.plugins.precise_prefix_cache_scorer import PrefixMatch
from epp.scheduling.plugins.prefix_cache_scorer import PrefixCacheScorer
from epp.tokenize.render import RenderSpec

from . import builders, upstream_refs

DATA = Path(__file__).parent / "data"
FACTS = DATA / "upstream_configs.json"
RECORDS: dict[str, dict[str, Any]] = {r["id"]: r for r in json.loads(FACTS.read_text("utf-8"))["configs"]}

_GRPC = "(type 'vllmgrpc-parser') is not supported: vLLM's gRPC API is not supported"
_CEL = "(type 'request-attribute-reporter') is not supported: epp has no CEL request-attribute reporter"
_STALE_TP = (
    "plugins[0].parameters.indexerConfig.tokenProcessorConfig",
    "plugin 'precise-prefix-cache-scorer'",
)
# Two records nest two of llm-d's fields where llm-d does not read them; with the rendering's sorted
# keys this one comes first (the other, tokenProcessorConfig, is pinned on its own below).
_STALE_KB = (
    "plugins[0].parameters.indexerConfig.kvBlockIndexConfig.maxPrefixBlocksToMatch",
    "plugin 'precise-prefix-cache-scorer'",
    "llm-d ignores it there too (not a field of kvBlockIndexConfig)",
)
_UNKNOWN = "unknown plugin type"

# Record -> None (loads), or where the refusal points (a path into the configuration; the test
# adds the line that path has in the rendering) and further fragments of the message.
Refusal = tuple[str, ...]
EXPECTED: dict[str, Refusal | None] = {
    "gie-v1.0.0-config__charts__inferencepool__templates__epp-config": None,
    "gie-v1.0.0-conformance__resources__base": None,
    "gie-v1.0.0-site-src__guides__epp-configuration__config-text-2": None,
    "gie-v1.0.0-site-src__guides__epp-configuration__config-text-3": (
        "schedulingProfiles[0].-pluginRef",
        "unknown key '-pluginRef'",
    ),
    "gie-v1.0.0-test__testdata__configloader_1_test": (
        "plugins[0]",
        f"plugin 'test1': {_UNKNOWN} 'test-one'",
    ),
    "gie-v1.5.0-chart-default-rendered": None,
    "gie-v1.5.0-config__charts__inferencepool__README-1": (
        "plugins[0]",
        f"plugin 'custom-scorer': {_UNKNOWN} 'custom-scorer'",
    ),
    "gie-v1.5.0-conformance__resources__base": None,
    "gie-v1.5.0-pkg__epp__framework__plugins__requesthandling__parsers__README-1": (
        "plugins[1]",
        "plugin 'vllmgrpcParser'",
        _GRPC,
    ),
    "gie-v1.5.0-site-src__guides__epp-configuration__config-text-2": None,
    "gie-v1.5.0-site-src__guides__epp-configuration__config-text-3": None,
    "gie-v1.5.0-site-src__guides__troubleshooting-1": (
        "plugins[2].parameters.blockSize",
        "plugin 'prefix-cache-scorer'",
        "deprecated block size in characters, which GIE itself refuses",
    ),
    "gie-v1.5.0-site-src__guides__troubleshooting-2": (
        "plugins[2].parameters.blockSize",
        "plugin 'prefix-cache-scorer'",
    ),
    "gie-v1.5.0-site-src__implementations__model-servers-1": None,
    "gie-v1.5.0-site-src__implementations__model-servers-2": None,
    "gie-v1.5.0-test__integration__epp__testdata__datalayer-config": (
        "plugins[5]",
        f"plugin 'mock-metrics-source': {_UNKNOWN}",
    ),
    "gie-v1.5.0-test__integration__epp__testdata__default-config": None,
    "gie-v1.5.0-test__integration__epp__testdata__request-attribute-reporter-config": (
        "plugins[1]",
        "plugin 'total-tokens-cost-reporter'",
        _CEL,
    ),
    "gie-v1.5.0-test__testdata__configloader_1_test": (
        "plugins[0]",
        f"plugin 'test1': {_UNKNOWN} 'test-one'",
    ),
    "llm-d-guides-gaie-kv-events": None,
    "llm-d-guides-inference-scheduling": None,
    "llm-d-guides-pd-disaggregation": None,
    "llm-d-guides-precise-prefix-cache-aware-pod-discovery": None,
    "llm-d-guides-precise-prefix-cache-aware": None,
    "llm-d-router-HEAD-deploy__config__dp-epp-config": None,
    "llm-d-router-HEAD-deploy__config__epp-config": None,
    "llm-d-router-HEAD-deploy__config__epp-estimate-prefix-cache-config": None,
    "llm-d-router-HEAD-deploy__config__epp-precise-prefix-cache-config": None,
    "llm-d-router-HEAD-deploy__config__pd-epp-config": None,
    "llm-d-router-HEAD-deploy__config__probabilistic-admitter-epp-config": None,
    "llm-d-router-HEAD-deploy__config__sim-e-p-d-epp-config": None,
    "llm-d-router-HEAD-deploy__config__sim-e-pd-epp-config": None,
    "llm-d-router-HEAD-deploy__config__sim-epp-config": None,
    "llm-d-router-HEAD-deploy__config__sim-epp-kvcache-config": None,
    "llm-d-router-HEAD-deploy__config__sim-epp-no-hit-lru": _STALE_KB,
    "llm-d-router-HEAD-deploy__config__sim-epp-tokenizer-vllm-http-config": None,
    "llm-d-router-HEAD-deploy__config__sim-pd-epp-config": None,
    "llm-d-router-HEAD-docs__architecture-2": _STALE_KB,
    "llm-d-router-v0.10-deploy__config__dp-epp-config": None,
    "llm-d-router-v0.10-deploy__config__epp-burst-prefix-cache-config": None,
    "llm-d-router-v0.10-deploy__config__epp-config": None,
    "llm-d-router-v0.10-deploy__config__epp-estimate-prefix-cache-config": None,
    # Published with a parameter llm-d v0.10's own decoder refuses (cacheSizeInMBPerServer is its name).
    "llm-d-router-v0.10-deploy__config__epp-mm-embeddings-cache-config": (
        "plugins[4].parameters.cacheSizeInMB",
        "unknown key 'cacheSizeInMB'; known keys: cacheSizeInMBPerServer",
    ),
    "llm-d-router-v0.10-deploy__config__epp-precise-prefix-cache-config": None,
    "llm-d-router-v0.10-deploy__config__pd-epp-config": None,
    "llm-d-router-v0.10-deploy__config__pd-topology-epp-config": None,
    "llm-d-router-v0.10-deploy__config__probabilistic-admitter-epp-config": None,
    "llm-d-router-v0.10-deploy__config__sim-e-p-d-epp-config": None,
    "llm-d-router-v0.10-deploy__config__sim-e-pd-epp-config": None,
    "llm-d-router-v0.10-deploy__config__sim-epp-config": None,
    "llm-d-router-v0.10-deploy__config__sim-epp-gpu-config": None,
    "llm-d-router-v0.10-deploy__config__sim-epp-kvcache-config": None,
    "llm-d-router-v0.10-deploy__config__sim-epp-no-hit-lru": None,
    "llm-d-router-v0.10-deploy__config__sim-epp-tokenizer-vllm-http-config": None,
    "llm-d-router-v0.10-deploy__config__sim-pd-epp-config": None,
    "llm-d-router-v0.10-deploy__config__sim-program-aware-config": None,
    "llm-d-router-v0.10-deploy__config__soft-reflective-ceiling-epp-config": None,
    "llm-d-router-HEAD-docs__disaggregation-1": None,
    "llm-d-router-HEAD-docs__disaggregation-2": None,
    "llm-d-router-HEAD-pkg__epp__framework__plugins__datalayer__source__models__README-1": (
        "data",
        "unknown key 'data'",
    ),
    "llm-d-router-HEAD-pkg__epp__framework__plugins__requestcontrol__requestattributereporter__README-1": (
        "plugins[0]",
        "plugin 'total-tokens-cost-reporter'",
        _CEL,
    ),
    "llm-d-router-HEAD-pkg__epp__framework__plugins__requesthandling__parsers__README-1": (
        "plugins[1]",
        "plugin 'vllmgrpcParser'",
        _GRPC,
    ),
}


# --- rendering: a facts record back into an EndpointPickerConfig, in our own fixed layout ---

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def _key(k: str) -> str:
    return k if _PLAIN_KEY.fullmatch(k) and k.lower() not in _YAML_WORDS else json.dumps(k)


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        text = repr(v)
        # PyYAML reads 1e-05 as a string and needs a '.' to read a float.
        assert math.isfinite(v) and "e" not in text and "." in text, v
        return text
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a YAML double-quoted scalar
    if v == {} or v == []:
        return json.dumps(v)
    raise TypeError(v)


def _emit(out: list[str], lines: dict[str, int], path: str, value: Any, indent: int) -> None:
    """Block-style YAML for a mapping or sequence; records the line each key and item starts on."""
    pad = " " * indent
    if isinstance(value, dict):
        for k, v in value.items():
            sub = f"{path}.{k}" if path else k
            lines[sub] = len(out) + 1
            if isinstance(v, (dict, list)) and v:
                out.append(f"{pad}{_key(k)}:")
                _emit(out, lines, sub, v, indent + 2)
            else:
                out.append(f"{pad}{_key(k)}: {_scalar(v)}")
        return
    for i, item in enumerate(value):
        sub = f"{path}[{i}]"
        lines[sub] = len(out) + 1
        if isinstance(item, (dict, list)) and item:
            first = len(out)
            _emit(out, lines, sub, item, indent + 2)
            out[first] = f"{pad}- {out[first][indent + 2 :]}"
        else:
            out.append(f"{pad}- {_scalar(item)}")


def _sorted(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _sorted(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [_sorted(x) for x in v]
    return v


def document(facts: dict[str, Any]) -> dict[str, Any]:
    """The configuration a record describes, keys in our order: apiVersion, kind, plugins
    (name, type, parameters), schedulingProfiles (name, plugins), then the sections, sorted."""
    doc: dict[str, Any] = {"apiVersion": facts["apiVersion"], "kind": facts["kind"]}
    doc["plugins"] = [
        {k: _sorted(p[k]) for k in ("name", "type", "parameters") if k in p} | _sorted(p.get("other", {}))
        for p in facts["plugins"]
    ]
    if "schedulingProfiles" in facts:
        doc["schedulingProfiles"] = [
            {"name": prof["name"], "plugins": _sorted(prof["plugins"])} | _sorted(prof.get("other", {}))
            for prof in facts["schedulingProfiles"]
        ]
    sections: dict[str, Any] = _sorted(facts["sections"])
    return doc | sections


def render(facts: dict[str, Any]) -> tuple[str, dict[str, int]]:
    out: list[str] = []
    lines: dict[str, int] = {}
    _emit(out, lines, "", document(facts), 0)
    return "\n".join(out) + "\n", lines


def _write(tmp_path: Path, name: str) -> tuple[Path, str, dict[str, int]]:
    text, lines = render(RECORDS[name]["config"])
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path, text, lines


def _load(tmp_path: Path, name: str, handle: Any = None) -> config.SchedulerConfig:
    path, _, _ = _write(tmp_path, name)
    # As llm-d runs its Alpha plugins: with --allow-experimental-plugins.
    return config.load_config_file(path, handle or builders.handle(BlockIndex()), allow_experimental=True)


# --- the facts file itself ---


def test_every_record_is_expected_and_counted() -> None:
    assert sorted(RECORDS) == sorted(EXPECTED)
    loads = sum(v is None for v in EXPECTED.values())
    readme = (DATA / "README.md").read_text("utf-8")
    assert f"{len(RECORDS)} configurations: {loads} load, {len(RECORDS) - loads} are refused" in readme


def test_facts_file_is_as_the_regenerator_writes_it() -> None:
    text = FACTS.read_text("utf-8")
    assert upstream_refs.dump(json.loads(text)) == text
    assert [r["id"] for r in json.loads(text)["configs"]] == [s.id for s in upstream_refs.SOURCES]


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_rendering_says_what_the_record_says(name: str) -> None:
    facts = RECORDS[name]["config"]
    text, lines = render(facts)
    assert upstream_refs.facts(yaml.safe_load(text)) == facts
    assert text.splitlines()[lines["plugins"] - 1] == "plugins:"


# --- loading ---


@pytest.mark.parametrize("name", sorted(n for n, v in EXPECTED.items() if v is None))
def test_loads_and_routes(tmp_path: Path, name: str) -> None:
    cfg = _load(tmp_path, name)
    eps = [builders.endpoint("a", waiting=3), builders.endpoint("b", address="10.0.0.2")]
    if name.startswith("llm-d-router-HEAD-docs__disaggregation"):
        # Its label selectors keep pods labelled `role: decode` for decode (and prefill, encode).
        for ep, role in zip(eps, ("decode", "prefill"), strict=True):
            ep.spec = dataclasses.replace(ep.spec, labels={"role": role})
    result = cfg.scheduler.schedule(builders.request(), eps)
    assert result.targets  # a whole decision runs through the configured plugins
    _, text, _ = _write(tmp_path, name)
    assert config.requested_kv_events(text) == cfg.kv_events


@pytest.mark.parametrize("name", sorted(n for n, v in EXPECTED.items() if v is not None))
def test_refused_naming_plugin_parameter_and_line(tmp_path: Path, name: str) -> None:
    expected = EXPECTED[name]
    assert expected is not None
    where, *fragments = expected
    path, _, lines = _write(tmp_path, name)
    with pytest.raises(config.ConfigError) as info:
        config.load_config_file(path, builders.handle(BlockIndex()), allow_experimental=True)
    message = str(info.value)
    assert message.startswith(f"{path}: {where} (line {lines[where]}): "), message
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize("name", sorted(n for n, v in EXPECTED.items() if v == _STALE_KB))
def test_each_stale_llmd_field_is_refused_on_its_own(tmp_path: Path, name: str) -> None:
    facts = copy.deepcopy(RECORDS[name]["config"])
    del facts["plugins"][0]["parameters"]["indexerConfig"]["kvBlockIndexConfig"]["maxPrefixBlocksToMatch"]
    text, lines = render(facts)
    path = tmp_path / "one-stale-field.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(config.ConfigError) as info:
        config.load_config_file(path, builders.handle(BlockIndex()))
    where = _STALE_TP[0]
    assert str(info.value).startswith(f"{path}: {where} (line {lines[where]}): {_STALE_TP[1]}")
    assert "llm-d ignores it there too" in str(info.value)


def test_llmd_precise_configs_say_how_kv_events_arrive(tmp_path: Path) -> None:
    central = _load(tmp_path, "llm-d-guides-precise-prefix-cache-aware")
    assert central.kv_events == KVEventsSettings("bind", bind="tcp://*:5557")
    assert central.render == {"Qwen/Qwen3-32B": RenderSpec(model_name="Qwen/Qwen3-32B")}
    per_pod = _load(tmp_path, "llm-d-guides-precise-prefix-cache-aware-pod-discovery")
    assert per_pod.kv_events == KVEventsSettings("connect", port=5557)
    # No kvEventsConfig at all: llm-d's defaults, per-pod subscribers on 5557.
    assert _load(tmp_path, "llm-d-router-HEAD-deploy__config__epp-precise-prefix-cache-config").kv_events == (
        KVEventsSettings("connect", port=5557)
    )
    # GIE-style configurations leave KV events to the flags.
    assert _load(tmp_path, "llm-d-guides-inference-scheduling").kv_events is None


def test_llmd_precise_block_size_and_profile_are_mapped(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "llm-d-guides-precise-prefix-cache-aware")
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


def test_gie_v1_0_hash_block_size_config_loads_with_its_block_size(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "gie-v1.0.0-site-src__guides__epp-configuration__config-text-2")
    prefix = cfg.plugins["prefix-cache-scorer"]
    assert isinstance(prefix, PrefixCacheScorer)
    request = builders.request()
    request.prompt_texts = ["x" * 12]
    assert len(prefix.block_hashes(request)) == 3  # hashBlockSize 5: characters per block


def test_without_kv_events_a_precise_config_names_the_remedy(tmp_path: Path) -> None:
    _, _, lines = _write(tmp_path, "llm-d-guides-gaie-kv-events")
    with pytest.raises(
        config.ConfigError, match=rf"plugins\[1\] \(line {lines['plugins[1]']}\).*needs vLLM KV events"
    ):
        _load(tmp_path, "llm-d-guides-gaie-kv-events", builders.handle())
