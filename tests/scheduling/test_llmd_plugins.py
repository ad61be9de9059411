"""llm-d's plugins in epp: load-aware-scorer, no-hit-lru-scorer, the role and label-selector
filters, and the mapping of llm-d's precise-prefix-cache-scorer parameters."""

from __future__ import annotations

from typing import Any

import pytest

from epp.datastore.endpoints import Endpoint, EndpointSpec
from epp.kvcache.index import BlockIndex
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins.precise_llmd import KVEventsSettings

from . import builders

E = builders.endpoint


def labelled(name: str, **labels: str) -> Endpoint:
    spec = EndpointSpec(name=name, address="10.0.0.1", port=8000, labels=labels)
    return Endpoint(spec=spec, hostport=spec.hostport)


# ---- load-aware-scorer -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threshold", "waiting", "expected"),
    [
        (128, [0, 64, 128, 500], [0.5, 0.25, 0.0, 0.0]),
        (10, [0, 1, 5], [0.5, 0.45, 0.25]),
        (128, [3, 3], [0.5 * (1 - 3 / 128)] * 2),  # absolute, not min-max: equal loads, < 0.5
    ],
)
def test_load_aware_scorer(threshold: int, waiting: list[int], expected: list[float]) -> None:
    scorer = builders.plugin("load-aware-scorer", {"threshold": threshold})
    eps = [E(f"e{i}", waiting=w) for i, w in enumerate(waiting)]
    assert scorer.score({}, builders.request(), eps) == pytest.approx(expected)


def test_load_aware_scorer_refuses_a_threshold_llm_d_would_silently_replace() -> None:
    with pytest.raises(registry.ConfigError, match=r"\$\.threshold"):
        builders.plugin("load-aware-scorer", {"threshold": 0})


# ---- no-hit-lru-scorer -------------------------------------------------------------------------


def _result(target: Endpoint) -> interfaces.SchedulingResult:
    return interfaces.SchedulingResult("default", {"default": interfaces.ProfileResult("default", [target])})


def _route(scorer: Any, eps: list[Endpoint], cycle: dict[str, Any] | None = None) -> list[float]:
    """Score one request, then route it to the best-scored endpoint (ties: the first)."""
    request = builders.request()
    scores: list[float] = scorer.score(cycle or {}, request, eps)
    scorer.pre_request(request, _result(eps[scores.index(max(scores))]))
    return scores


def test_no_hit_lru_spreads_cold_requests_over_the_least_recently_used() -> None:
    scorer = builders.plugin("no-hit-lru-scorer")
    a, b, c = E("a"), E("b"), E("c")
    assert _route(scorer, [a, b, c]) == [1.0, 0.5, 0.0]  # nobody used: candidate order
    assert _route(scorer, [a, b, c]) == [0.0, 1.0, 0.5]  # a was used: never-used b, c first
    assert _route(scorer, [a, b, c]) == [0.5, 0.0, 1.0]
    assert _route(scorer, [a, b, c]) == [1.0, 0.5, 0.0]  # all used: a is the oldest
    assert scorer.score({}, builders.request(), [b]) == [1.0]  # one candidate


class _Producer:
    """A prefix producer that finds a fixed number of blocks on some endpoints."""

    type = "approx-prefix-cache-producer"
    is_producer = True

    def __init__(self, name: str, held: dict[str, int]) -> None:
        self.name = name
        self.held = held
        self.calls = 0

    def score(self, cycle: dict[str, Any], request: Any, endpoints: list[Endpoint]) -> list[float]:
        self.calls += 1
        cycle[self.name] = True
        return [0.0] * len(endpoints)

    def match_info(self, cycle: dict[str, Any], endpoints: Any) -> list[tuple[float, int, int]]:
        return [(float(self.held.get(ep.name, 0)), 4, 16) for ep in endpoints]

    def explain(self, cycle: dict[str, Any]) -> dict[str, Any]:
        return {}


def test_no_hit_lru_is_neutral_when_its_producer_found_a_hit() -> None:
    scorer = builders.plugin("no-hit-lru-scorer")
    a, b = E("a"), E("b")
    scorer.source = _Producer("approx-prefix-cache-producer", {"a": 2})
    assert _route(scorer, [a, b]) == [0.5, 0.5]
    # A warm request does not move the LRU: the next cold one still starts at a.
    scorer.source = _Producer("approx-prefix-cache-producer", {})
    assert _route(scorer, [a, b]) == [1.0, 0.0]


def test_no_hit_lru_reuses_a_match_already_in_the_cycle() -> None:
    scorer = builders.plugin("no-hit-lru-scorer")
    source = scorer.source = _Producer("p", {"a": 1})
    cycle: dict[str, Any] = {"p": True}  # a prefix-cache-scorer reading "p" ran before
    scorer.score(cycle, builders.request(), [E("a"), E("b")])
    assert source.calls == 0
    scorer.score({}, builders.request(), [E("a"), E("b")])  # none ran: the producer matches
    assert source.calls == 1


def _llmd_config(plugins: str, profile: str, handle: Any = None) -> Any:
    from epp.scheduling import config

    return config.load_config(
        f"apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins: [{plugins}]\n"
        f"schedulingProfiles:\n- name: default\n  plugins:\n{profile}",
        handle or builders.handle(),
    )


def test_no_hit_lru_reads_the_default_producer_in_a_profile() -> None:
    handle = builders.handle()
    cfg = _llmd_config(
        "{type: prefix-cache-scorer}, {type: no-hit-lru-scorer}, {type: max-score-picker}",
        "  - {pluginRef: prefix-cache-scorer, weight: 2}\n  - {pluginRef: no-hit-lru-scorer}\n",
        handle,
    )
    # Both read llm-d's default producer, which the loader made with llm-d's defaults.
    producer = cfg.plugins["approx-prefix-cache-producer"]
    assert cfg.plugins["no-hit-lru-scorer"].source is producer
    assert cfg.plugins["prefix-cache-scorer"].source is producer
    # The producer remembers blocks only on endpoints the datastore knows.
    eps, _ = handle.datastore.sync(
        "test", [EndpointSpec("a", "10.0.0.1", 8000), EndpointSpec("b", "10.0.0.2", 8000)]
    )

    def route(text: str) -> tuple[str, dict[str, float]]:
        request = builders.request()
        request.prompt_texts = [text]
        result = cfg.scheduler.schedule(request, eps, explain=True)
        for hook in cfg.pre_request:
            hook.pre_request(request, result)
        return result.targets[0].name, {
            n: s["no-hit-lru-scorer"] for n, s in result.profiles["default"].scores.items()
        }

    assert route("first prompt " * 40) == ("a", {"a": 1.0, "b": 0.0})
    assert route("second prompt " * 40) == ("b", {"a": 0.0, "b": 1.0})  # cold: the unused one
    assert route("first prompt " * 40) == ("a", {"a": 0.5, "b": 0.5})  # warm on a: neutral


def test_no_hit_lru_may_come_before_the_prefix_scorer() -> None:
    cfg = _llmd_config(
        "{type: no-hit-lru-scorer}, {type: prefix-cache-scorer}",
        "  - {pluginRef: no-hit-lru-scorer}\n  - {pluginRef: prefix-cache-scorer}\n",
    )
    assert [s.name for s, _ in cfg.scheduler.profiles[0].scorers] == [
        "no-hit-lru-scorer",
        "prefix-cache-scorer",
    ]


def test_no_hit_lru_naming_no_producer_is_refused() -> None:
    from epp.scheduling import config

    with pytest.raises(config.ConfigError, match=r"plugins\[0\]\.parameters\.prefixMatchInfoProducerName"):
        _llmd_config(
            "{type: no-hit-lru-scorer, parameters: {prefixMatchInfoProducerName: nope}}",
            "  - {pluginRef: no-hit-lru-scorer}\n",
        )


def test_no_hit_lru_forgets_beyond_its_size() -> None:
    scorer = builders.plugin("no-hit-lru-scorer", {"lruSize": 1})
    a, b, c = E("a"), E("b"), E("c")
    _route(scorer, [a, b, c])  # a
    _route(scorer, [a, b, c])  # b; a falls out and counts as never used again
    assert scorer.score({}, builders.request(), [a, b, c]) == [1.0, 0.0, 0.5]


# ---- role and label filters --------------------------------------------------------------------


def test_role_filters_use_llm_d_role_values() -> None:
    eps = [
        labelled("plain"),
        labelled("d", **{"llm-d.ai/role": "decode"}),
        labelled("p", **{"llm-d.ai/role": "prefill"}),
        labelled("pd", **{"llm-d.ai/role": "prefill-decode"}),
        labelled("both", **{"llm-d.ai/role": "both"}),
        labelled("e", **{"llm-d.ai/role": "encode"}),
        labelled("epd", **{"llm-d.ai/role": "encode-prefill-decode"}),
    ]

    def kept(type_name: str) -> list[str]:
        return [ep.name for ep in builders.plugin(type_name).filter({}, builders.request(), eps)]

    assert kept("decode-filter") == ["plain", "d", "pd", "both", "epd"]
    assert kept("prefill-filter") == ["p", "pd", "both", "epd"]
    assert kept("encode-filter") == ["e", "epd"]


def test_label_selector_filter() -> None:
    eps = [labelled("a", role="prefill", zone="x"), labelled("b", role="decode"), labelled("c")]
    params = {
        "matchLabels": {"zone": "x"},
        "matchExpressions": [{"key": "role", "operator": "In", "values": ["prefill"]}],
    }
    f = builders.plugin("label-selector-filter", params)
    assert [ep.name for ep in f.filter({}, builders.request(), eps)] == ["a"]
    f = builders.plugin(
        "label-selector-filter", {"matchExpressions": [{"key": "role", "operator": "DoesNotExist"}]}
    )
    assert [ep.name for ep in f.filter({}, builders.request(), eps)] == ["c"]
    f = builders.plugin(
        "by-label-selector",
        {"matchExpressions": [{"key": "role", "operator": "NotIn", "values": ["decode"]}]},
    )
    assert [ep.name for ep in f.filter({}, builders.request(), eps)] == ["a", "c"]
    assert builders.plugin("label-selector-filter").filter({}, builders.request(), eps) == eps
    with pytest.raises(registry.ConfigError, match=r"matchExpressions\[0\]: operator In needs values"):
        builders.plugin("label-selector-filter", {"matchExpressions": [{"key": "k", "operator": "In"}]})
    with pytest.raises(registry.ConfigError, match="operator"):
        builders.plugin("label-selector-filter", {"matchExpressions": [{"key": "k", "operator": "Gt"}]})


# ---- precise-prefix-cache-scorer, llm-d's parameters ---------------------------------------------


def precise(**params: Any) -> Any:
    return builders.plugin("precise-prefix-cache-scorer", params)


def test_llmd_backend_weights_map_to_gpu_and_offload_weights() -> None:
    p = precise(
        indexerConfig={
            "kvCacheBackendConfigs": [{"name": "gpu", "weight": 0.9}, {"name": "cpu", "weight": 0.3}]
        }
    )
    assert (p._w_gpu, p._w_off) == (0.9, 0.3)
    with pytest.raises(registry.ConfigError, match=r"the weights .* of cpu, disk differ"):
        precise(
            indexerConfig={
                "kvCacheBackendConfigs": [{"name": "cpu", "weight": 0.3}, {"name": "disk", "weight": 0.1}]
            }
        )


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"kvEventsConfig": {"zmqEndpoint": "tcp://*:5557", "discoverPods": False}},
            KVEventsSettings("bind", bind="tcp://*:5557"),
        ),
        (
            {"kvEventsConfig": {"zmqEndpoint": "tcp://0.0.0.0:6000"}},
            KVEventsSettings("bind", bind="tcp://0.0.0.0:6000"),
        ),
        (
            {"kvEventsConfig": {"podDiscoveryConfig": {"socketPort": 6001}}},
            KVEventsSettings("connect", port=6001),
        ),
        ({"tokenProcessorConfig": {"blockSizeTokens": 32}}, KVEventsSettings("connect", port=5557)),
        ({"blockSize": 32}, None),  # epp's own parameters: the flags decide
    ],
)
def test_llmd_kv_events_config(params: dict[str, Any], expected: KVEventsSettings | None) -> None:
    assert precise(**params).llmd.kv_events == expected


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        (
            {"kvEventsConfig": {"zmqEndpoint": "tcp://*:1", "discoverPods": True}},
            "epp consumes KV events one way",
        ),
        ({"kvEventsConfig": {"discoverPods": False}}, "leaves no source of KV events"),
        ({"kvEventsConfig": {"engineType": "sglang"}}, "engineType 'sglang'"),
        ({"kvEventsConfig": {"topicFilter": "mine@"}}, "topicFilter 'mine@'"),
        (
            {"indexerConfig": {"kvBlockIndexConfig": {"redisConfig": {"address": "r:6379"}}}},
            "kvBlockIndexConfig.redisConfig",
        ),
        ({"tokenProcessorConfig": {"blockSize": 16, "blockSizeTokens": 64}}, "block sizes disagree"),
        ({"blockSize": 16, "tokenProcessorConfig": {"blockSize": 64}}, "block sizes disagree"),
        ({"speculativeTTL": "forever"}, "speculativeTTL"),
        (
            {"indexerConfig": {"kvBlockIndexConfig": {"maxPrefixBlocksToMatch": 1}}},
            "unknown field `maxPrefixBlocksToMatch`",
        ),
    ],
)
def test_llmd_parameters_epp_cannot_honour_are_refused(params: dict[str, Any], fragment: str) -> None:
    with pytest.raises(registry.ConfigError) as info:
        precise(**params)
    assert fragment in str(info.value)


def test_llmd_speculative_indexing() -> None:
    assert precise(speculativeIndexing=False)._ttl == 0.0
    assert precise(speculativeIndexing=True, speculativeTTL="500ms")._ttl == 0.5
    assert precise(tokenProcessorConfig={"blockSize": 64})._block_size == 64


def test_llmd_precise_needs_the_kv_index() -> None:
    with pytest.raises(registry.ConfigError, match="needs vLLM KV events"):
        registry.default.build("precise-prefix-cache-scorer", "p", {}, builders.handle())
    assert precise() is not None
    assert builders.plugin("precise-prefix-cache-scorer", {}).llmd.kv_events is None
    assert isinstance(BlockIndex(), BlockIndex)
