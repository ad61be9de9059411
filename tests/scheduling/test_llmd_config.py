"""llm-d v0.9+'s configuration shape: stability levels, feature gates, producers and the
prefix-cache-scorer that reads one, and the data layer (what serve runs from it)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from epp.datastore.endpoints import EndpointSpec
from epp.datastore.engines import BUILTIN, parse_spec
from epp.kvcache.index import BlockIndex
from epp.scheduling import (
    catalog,
    config,
    config_compat,
    datalayer,
    registry,
    request_handler,
    token_producer,
)
from epp.scheduling.plugins.approx_prefix_producer import ApproxPrefixCacheProducer
from epp.scheduling.plugins.precise_prefix_producer import PrecisePrefixCacheProducer
from epp.scheduling.plugins.prefix_match_scorer import PrefixMatchScorer

from . import builders

LLMD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
GIE = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def load(body: str, head: str = LLMD, *, allow: bool = True, handle: Any = None) -> config.SchedulerConfig:
    return config.load_config(
        head + textwrap.dedent(body), handle or builders.handle(BlockIndex()), allow_experimental=allow
    )


def refused(body: str, head: str = LLMD, *, allow: bool = True) -> str:
    with pytest.raises(config.ConfigError) as info:
        load(body, head, allow=allow)
    return str(info.value)


# ---- stability ---------------------------------------------------------------------------------


def test_alpha_plugins_need_the_flag_as_in_llm_d() -> None:
    body = "plugins:\n- {type: queue-scorer}\n- {name: t, type: topology-affinity-scorer}\n"
    message = refused(body, allow=False)
    assert message.startswith("plugins[1] (line 5): plugin 't' (type 'topology-affinity-scorer') has Alpha")
    assert "--allow-experimental-plugins is not set" in message
    assert load(body, allow=True).plugins["t"].type == "topology-affinity-scorer"


def test_every_llm_d_type_is_built_accepted_or_refused() -> None:
    handled = (
        set(registry.default.types())
        | set(config_compat.GIE_ONLY)
        | set(config_compat.REFUSED)
        | set(config_compat.FLOW_CONTROL)
        | set(token_producer.TYPES)
        | set(datalayer.TYPES)
    )
    parsers = {t for t in catalog.LLMD_TYPES if request_handler.is_parser_type(t)}
    assert set(catalog.LLMD_TYPES) - handled - parsers == set()


# ---- feature gates -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gate", "on"), [("flowControl", True), ("flowControl=TRUE", True), ("flowControl=f", False)]
)
def test_feature_gates_take_llm_ds_boolean_forms(gate: str, on: bool) -> None:
    flow = load(f"featureGates: [{gate!r}]\nplugins: [{{type: queue-scorer}}]\n").flow_control
    assert flow is not None and flow.enabled is on


def test_feature_gate_errors() -> None:
    assert "featureGates[0] (line 3): unknown feature gate 'flowcontrol'" in refused(
        "featureGates: [flowcontrol]\n"
    )
    assert "'maybe' is not a valid value for the feature gate flowControl" in refused(
        "featureGates: ['flowControl=maybe']\n"
    )
    cfg = load("featureGates: [haPopulateNonLeaderDatastore, 'haPopulateNonLeaderDatastore=false']\n")
    assert [w for w in cfg.warnings if "haPopulate" in w] == [
        "featureGates 'haPopulateNonLeaderDatastore=false' has no effect: epp's replicas always keep "
        "the pool listed, leading or not"
    ]


# ---- producers ---------------------------------------------------------------------------------


def test_a_bare_prefix_scorer_reads_llm_ds_default_producer_in_an_llm_d_document() -> None:
    cfg = load("plugins: [{type: prefix-cache-scorer}]\n")
    scorer = cfg.plugins["prefix-cache-scorer"]
    assert isinstance(scorer, PrefixMatchScorer)
    producer = cfg.plugins["approx-prefix-cache-producer"]
    assert scorer.source is producer and producer in cfg.pre_request
    # GIE's document keeps GIE v1.5's scorer, its own index with 16-token blocks.
    gie = load("plugins: [{type: prefix-cache-scorer}]\n", GIE).plugins["prefix-cache-scorer"]
    assert not isinstance(gie, PrefixMatchScorer) and gie.block_tokens == 16


def test_the_approx_producer_runs_with_llm_ds_defaults() -> None:
    handle = builders.handle()
    eps, _ = handle.datastore.sync(
        "t", [EndpointSpec("a", "10.0.0.1", 8000), EndpointSpec("b", "10.0.0.2", 8000)]
    )
    cfg = load(
        """
        plugins:
        - {type: approx-prefix-cache-producer, parameters: {maxPrefixTokensToMatch: 256}}
        - {type: prefix-cache-scorer}
        """,
        handle=handle,
    )
    producer = cfg.plugins["approx-prefix-cache-producer"]
    assert isinstance(producer, ApproxPrefixCacheProducer)
    request = builders.request()
    request.token_ids = list(range(1000))
    assert len(producer.block_hashes(request, eps)) == 4  # 256 tokens in 64-token blocks (the floor)
    request.token_ids = list(range(10))
    assert len(producer.block_hashes(request, eps)) == 1  # a partial block is hashed, as llm-d does
    eps[0].metrics.block_size = 128  # autoTune: the first candidate's block size
    request.token_ids = list(range(1000))
    assert len(producer.block_hashes(request, eps)) == 2
    # Routed once to a, the same prompt then matches all its blocks there.
    result = cfg.scheduler.schedule(request, eps)
    for hook in cfg.pre_request:
        hook.pre_request(request, result)
    again = cfg.scheduler.schedule(request, eps, explain=True)
    assert again.profiles["default"].scores[result.targets[0].name]["prefix-cache-scorer"] == 1.0


def test_match_length_weight_mixes_in_the_absolute_match() -> None:
    class Source:
        name = "p"

        def score(self, cycle: Any, request: Any, endpoints: Any) -> list[float]:
            return [0.0] * len(endpoints)

        def match_info(self, cycle: Any, endpoints: Any) -> list[tuple[float, int, int]]:
            return [(2.0, 4, 64), (0.0, 4, 64)]

        def explain(self, cycle: Any) -> dict[str, Any]:
            return {}

    scorer = PrefixMatchScorer("s", Source(), match_length_weight=0.5, match_length_scale_tokens=256)  # type: ignore[arg-type]
    a, b = builders.endpoint("a"), builders.endpoint("b")
    # 0.5 * 2/4 + 0.5 * min(1, 2*64/256)**2
    assert scorer.score({}, builders.request(), [a, b]) == [pytest.approx(0.25 + 0.125), 0.0]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            "plugins: [{type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: x}}]\n",
            "plugins[0].parameters.prefixMatchInfoProducerName (line 3): plugin 'prefix-cache-scorer' (type "
            "'prefix-cache-scorer') names producer 'x', which the configuration does not define",
        ),
        (
            "plugins:\n- {type: queue-scorer}\n"
            "- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: queue-scorer}}\n",
            "names producer 'queue-scorer' (type 'queue-scorer'), which is not a prefix producer",
        ),
        (
            "plugins: [{type: prefix-cache-scorer, parameters: "
            "{blockSizeTokens: 64, matchLengthWeight: 0.5}}]\n",
            "blockSizeTokens are GIE v1.x's scorer's and matchLengthWeight llm-d v0.9+'s",
        ),
        (
            "plugins: [{type: prefix-cache-scorer, parameters: {matchLengthWeight: 2}}]\n",
            "matchLengthWeight must be between 0.0 and 1.0",
        ),
        (
            "plugins: [{type: approx-prefix-cache-producer}]\n"
            "schedulingProfiles: [{name: d, plugins: [{pluginRef: approx-prefix-cache-producer}]}]\n",
            "is a data producer, not a filter, scorer or picker: list a prefix-cache-scorer with "
            "prefixMatchInfoProducerName: approx-prefix-cache-producer instead",
        ),
        (
            "plugins: [{type: approx-prefix-cache-producer, parameters: {maxPrefixBlocksToMatch: -1}}]\n",
            "parameter maxPrefixBlocksToMatch must be >= 0",
        ),
        (
            "plugins: [{type: precise-prefix-cache-producer, parameters: {gpuWeight: 0.5}}]\n",
            "unknown field `gpuWeight`",
        ),
        (
            "plugins: [{type: precise-prefix-cache-producer, parameters: "
            "{indexerConfig: {tokenizersPoolConfig: {modelName: m}}}}]\n",
            "configure a token-producer plugin instead",
        ),
    ],
)
def test_producer_errors(body: str, fragment: str) -> None:
    assert fragment in refused(body)


def test_the_precise_producer_has_llm_ds_defaults() -> None:
    cfg = load(
        """
        plugins:
        - {type: precise-prefix-cache-producer, parameters: {tokenProcessorConfig: {blockSize: 64}}}
        - type: prefix-cache-scorer
          parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
        """
    )
    producer = cfg.plugins["precise-prefix-cache-producer"]
    assert isinstance(producer, PrecisePrefixCacheProducer)
    assert producer._ttl == 0.0  # speculative indexing off, llm-d's default
    assert cfg.kv_events is not None and (cfg.kv_events.mode, cfg.kv_events.port) == ("connect", 5557)


# ---- the data layer ----------------------------------------------------------------------------


def test_the_metrics_source_and_engines_become_the_scrape() -> None:
    cfg = load(
        """
        plugins:
        - name: m
          type: metrics-data-source
          parameters: {scheme: https, path: /m, port: 9100, caCertPath: /ca.pem, interval: 200ms}
        - name: x
          type: core-metrics-extractor
          parameters:
            defaultEngine: sglang
            engineConfigs:
            - name: custom
              queuedRequestsSpec: q{kind="waiting"}
              customMetrics: [{attributeKey: Temp, metricSpec: gpu_temp}]
        dataLayer:
          sources: [{pluginRef: m, extractors: [{pluginRef: x}]}]
        """
    )
    scrape = cfg.data_layer.metrics
    assert (scrape.scheme, scrape.path, scrape.port, scrape.interval) == ("https", "/m", 9100, 0.2)
    assert scrape.tls is not None and scrape.tls.ca_cert == "/ca.pem"
    engines = scrape.engines
    assert engines is not None and engines.default is BUILTIN["sglang"]
    custom = engines.for_labels({"llm-d.ai/engine-type": "custom"})
    assert custom.queued == parse_spec('q{kind="waiting"}') and custom.running is None
    assert custom.custom == (("Temp", parse_spec("gpu_temp")),)
    # GIE's label is read when llm-d's is absent; an unknown engine gets the default.
    assert engines.for_labels({"inference.networking.k8s.io/engine-type": "vllm"}) is BUILTIN["vllm"]
    assert engines.for_labels({"llm-d.ai/engine-type": "unknown"}) is BUILTIN["sglang"]


def test_without_a_data_layer_the_flags_decide() -> None:
    scrape = load("plugins: [{type: queue-scorer}]\n").data_layer.metrics
    assert (scrape.scheme, scrape.path, scrape.engines) == (None, None, None)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            "dataLayer: {injectDefaults: false}\n",
            "dataLayer.injectDefaults (line 3): no metrics-data-source is listed and injectDefaults is false",
        ),
        (
            "plugins: [{name: a, type: metrics-data-source}, {name: b, type: metrics-data-source}, "
            "{type: core-metrics-extractor}]\n"
            "dataLayer: {sources: [{pluginRef: a, extractors: [{pluginRef: core-metrics-extractor}]}, "
            "{pluginRef: b, extractors: [{pluginRef: core-metrics-extractor}]}]}\n",
            "dataLayer.sources[1] (line 4): a second metrics source",
        ),
        (
            "plugins: [{type: metrics-data-source}]\n"
            "dataLayer: {sources: [{pluginRef: metrics-data-source}]}\n",
            "has no core-metrics-extractor: llm-d would read no metrics",
        ),
        (
            "plugins: [{type: core-metrics-extractor, parameters: {defaultEngine: tgi}}]\n",
            "plugins[0].parameters.defaultEngine (line 3): plugin 'core-metrics-extractor' (type "
            "'core-metrics-extractor'): defaultEngine 'tgi' not found in engineConfigs",
        ),
        (
            "plugins: [{type: core-metrics-extractor, parameters: "
            "{engineConfigs: [{name: v, kvUsageSpec: 'a b'}]}}]\n",
            "plugins[0].parameters.engineConfigs[0].kvUsageSpec (line 3)",
        ),
        (
            "dataLayer: {peerDiscovery: {pluginRef: p}}\n",
            "dataLayer.peerDiscovery (line 3): epp replicas share",
        ),
        ("plugins: [{type: file-discovery}]\n", "plugins[0].parameters (line 3): plugin 'file-discovery'"),
        (
            "plugins: [{type: k8s-notification-source, parameters: {kind: Pod}}]\n",
            "version and kind are required",
        ),
        (
            "plugins: [{type: dcgm-extractor}, {type: dcgm-data-source}]\n"
            "dataLayer: {sources: [{pluginRef: dcgm-extractor}]}\n",
            "plugin 'dcgm-extractor' (type 'dcgm-extractor') is not a metrics source or",
        ),
    ],
)
def test_data_layer_errors(body: str, fragment: str) -> None:
    assert fragment in refused(body)


def test_dcgm_topology_and_file_discovery_settings() -> None:
    cfg = load(
        """
        plugins:
        - {name: d, type: dcgm-data-source, parameters: {port: 9500, interval: 1s, useNodeAddress: true}}
        - {type: dcgm-extractor}
        - {type: topology-extractor, parameters: {zone: my/zone}}
        - {name: f, type: file-discovery, parameters: {path: /eps.yaml, watchFile: true}}
        dataLayer:
          sources: [{pluginRef: d, extractors: [{pluginRef: dcgm-extractor}]}]
          discovery: {pluginRef: f}
        """
    )
    (dcgm,) = cfg.data_layer.dcgm
    assert (dcgm.name, dcgm.port, dcgm.interval, dcgm.use_node_address) == ("d", 9500, 1.0, True)
    assert cfg.data_layer.topology["topology-extractor"].zone == "my/zone"
    assert cfg.data_layer.discovery is not None
    assert (cfg.data_layer.discovery.path, cfg.data_layer.discovery.watch) == ("/eps.yaml", True)


def test_a_source_not_listed_is_not_polled() -> None:
    cfg = load("plugins: [{type: dcgm-data-source}]\n")
    assert cfg.data_layer.dcgm == ()
    assert "plugin 'dcgm-data-source' (type 'dcgm-data-source') is not in dataLayer" in " ".join(cfg.warnings)
