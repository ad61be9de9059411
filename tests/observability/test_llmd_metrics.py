"""epp's /metrics against llm-d Router's: the canonical `llm_d_epp_*` series and the deprecated
twins llm-d still writes, with llm-d's names, types, label names and buckets (`llmd_metrics`), the
same numbers under both names, and label values capped as llm-d caps them.

As in test_gie_metrics, the exposition is read from epp's real metrics app after real requests
went through a Director, with a pool and a KV-event source (a real BlockIndex) registered.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
from prometheus_client import generate_latest

from epp.kvcache.events import BlockRemoved, BlockStored, EventBatch
from epp.kvcache.index import BlockIndex
from epp.kvcache.keys import block_keys, seed_for
from epp.observability import collectors, llmd_metrics, metrics
from epp.scheduling.disagg import runner
from epp.workers import merge
from tests.observability import llmd_metrics as llmd
from tests.observability.test_gie_metrics import Family, drive, families, make_director, pool_source, scrape

INDEX = BlockIndex()


def kv_source() -> collectors.KVSnapshot:
    counts = collectors.KVPodCounts(
        1, 2, 1, 0, 0, {"ok": 1, "partial": 0, "failed": 0}, {}, 0.5, messages=3, reconnections=1,
        zmq_errors={"connect": 1, "replay-incomplete": 0},
    )  # fmt: skip
    st = INDEX.stats()
    return collectors.KVSnapshot(
        {"pod-a": counts}, {}, st.entries, st.keys, st.evictions, index=st,
        lookup_seconds=INDEX.lookup_seconds, subscribers=1,
    )  # fmt: skip


def feed_index() -> None:
    """Two blocks stored (one of them twice: a copy), the copy and a block removed, two lookups."""
    tokens = list(range(32))
    stored = BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=tokens, block_size=16)
    INDEX.apply("pod-a", EventBatch(ts=0.0, events=[stored, stored]), model="m")
    INDEX.apply("pod-a", EventBatch(ts=1.0, events=[BlockRemoved(block_hashes=[2, 2, 9])]), model="m")
    keys = block_keys(tokens, 16, seed=seed_for("m"))
    assert INDEX.match(keys)["pod-a"].blocks == 1
    assert INDEX.match(keys[1:]) == {}


@pytest.fixture
def sources() -> Iterator[None]:
    collectors.pool_collector.add(pool_source)
    collectors.kv_collector.add(kv_source)
    metrics.ready_endpoints.labels(name="pool").set(1)
    yield
    collectors.pool_collector.discard(pool_source)
    collectors.kv_collector.discard(kv_source)
    metrics.ready_endpoints.remove("pool")


@pytest.fixture
async def exposed(sources: None) -> dict[str, Family]:
    await drive(make_director())
    feed_index()
    runner.disagg_decisions.labels("pd", "disagg-profile-handler", "m", "prefill-decode").inc()
    runner.pd_decisions.labels("pd", "pd-profile-handler", "m", "decode-only").inc()
    metrics.datalayer_poll_errors.labels(metrics.METRICS_DATA_SOURCE).inc()
    llmd_metrics.register_stream_metrics()  # as --enable-grpc-stream-metrics does
    llmd_metrics.extproc_streams_inflight.inc()
    llmd_metrics.stream_finished("OK", 0.2)
    return families(await scrape())


def test_the_transcription_has_no_duplicates() -> None:
    names = [s.name for s in llmd.SERIES]
    assert len(names) == len(set(names))
    assert set(llmd.NOT_EXPORTED) <= set(names)


@pytest.mark.parametrize("series", llmd.SERIES, ids=lambda s: s.name)
async def test_epp_exports_llm_ds_series_as_llm_d_does(
    series: llmd.Series, exposed: dict[str, Family]
) -> None:
    if series.name in llmd.NOT_EXPORTED:
        assert series.name not in exposed  # listed as not exported: really absent
        return
    fam = exposed.get(series.name)
    assert fam is not None, f"{series.name} is not exported"
    assert fam.samples, f"{series.name} has no samples: its labels could not be compared"
    assert fam.kind == series.kind
    assert fam.labels == tuple(sorted(series.labels))
    assert fam.buckets == tuple(float(b) for b in series.buckets)
    if series.name.startswith("llm_d_epp_kv_cache_"):  # v0.10.0's names as well
        released = exposed.get(series.name.replace("llm_d_epp_kv_cache_", llmd.RELEASED_KV_PREFIX))
        assert released is not None and released.kind == fam.kind and released.labels == fam.labels


def value(metric: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(metric, labels) or 0.0


def total(name: str) -> float:
    """The sum of a family's samples named `name`, whatever their labels."""
    return sum(
        s.value for fam in metrics.REGISTRY.collect() for s in fam.samples if s.name == name
    )  # fmt: skip


async def test_both_generations_count_the_same_requests(sources: None) -> None:
    pairs = [
        ("inference_objective_request_total", "llm_d_epp_request_total"),
        ("inference_objective_request_error_total", "llm_d_epp_request_error_total"),
        ("inference_objective_input_tokens_sum", "llm_d_epp_request_input_tokens_sum"),
        ("inference_objective_prompt_cached_tokens_count", "llm_d_epp_request_cached_tokens_count"),
        ("inference_objective_request_sizes_sum", "llm_d_epp_request_size_bytes_sum"),
        ("inference_extension_scheduler_attempts_total", "llm_d_epp_scheduler_attempts_total"),
        (
            "inference_extension_scheduler_e2e_duration_seconds_count",
            "llm_d_epp_scheduler_e2e_duration_seconds_count",
        ),
    ]
    before = {name: total(name) for pair in pairs for name in pair}
    await drive(make_director())
    for gie, ours in pairs:
        assert total(gie) - before[gie] == total(ours) - before[ours] > 0, (gie, ours)
    # llm-d's labels: the fairness ID (default-flow without the header) and the priority.
    labels = {"model_name": "m", "target_model_name": "m", "fairness_id": "default-flow", "priority": "0"}
    assert value("llm_d_epp_request_total", **labels)
    assert value(
        "llm_d_epp_scheduler_attempts_total",
        status="success", target_model_name="m", endpoint_name="pod-a", namespace="", port="8000",
    ) == value(
        "inference_extension_scheduler_attempts_total",
        status="success", target_model_name="m", pod_name="pod-a", namespace="", port="8000",
    )  # fmt: skip


async def test_the_fairness_header_labels_llm_ds_series() -> None:
    director = make_director()
    body = msgspec.json.encode({"model": "m", "prompt": "hi"})
    labels = {"model_name": "m", "target_model_name": "m", "fairness_id": "tenant-a", "priority": "0"}
    before = value("llm_d_epp_request_total", **labels)
    for header in ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id"):  # llm-d's, GIE's
        ctx = await director.route(
            path="/v1/completions", headers={header: "tenant-a"}, body=body, subset=None
        )
        ctx.finish(complete=True)
    assert value("llm_d_epp_request_total", **labels) == before + 2


def test_kv_index_counts(sources: None) -> None:
    st = INDEX.stats()
    before = (st.admissions, st.removals, st.deduplicated, st.lookups, st.lookup_hits)
    feed_index()
    st = INDEX.stats()
    # 4 blocks stored (2 + 2 copies), 1 record removed, 1 removal a copy, 2 lookups hitting 1 block.
    assert (st.admissions, st.removals, st.deduplicated, st.lookups, st.lookup_hits) == tuple(
        b + d for b, d in zip(before, (4, 1, 1, 2, 1), strict=True)
    )
    assert value("llm_d_epp_kv_cache_index_lookup_requests_total") == st.lookups
    assert value("kvcache_index_lookup_requests_total") == st.lookups
    assert value("llm_d_router_epp_kv_cache_index_lookup_hits_total") == st.lookup_hits
    assert value("llm_d_epp_kv_cache_events_dedup_removed_hashes_suppressed_total") == st.deduplicated
    # forwarded: every removal that was not a copy, known to the index or not (hash 9)
    assert value("llm_d_epp_kv_cache_events_dedup_removed_hashes_forwarded_total") == (
        st.removals + st.missed_removals
    )
    assert value("llm_d_epp_kv_cache_index_lookup_latency_seconds_count") == st.lookups
    assert value("llm_d_epp_kv_cache_events_messages_received_total", pod_identifier="pod-a") == 3


def test_pool_series_under_llm_ds_names(sources: None) -> None:
    def snap() -> collectors.PoolSnapshot:
        return collectors.PoolSnapshot(
            "p2", [collectors.PodLoad("a", 1, 2, 0.5, True), collectors.PodLoad("b", 4, 2, 0.25, True)]
        )

    collectors.pool_collector.add(snap)
    try:
        assert value("llm_d_epp_average_queue_size", name="p2") == value(
            "inference_pool_average_queue_size", name="p2"
        )
        assert value("llm_d_epp_average_kv_cache_utilization", name="p2") == 0.38  # rounded, as llm-d
        assert value("llm_d_epp_std_dev_queue_size", name="p2") == 2.12  # sqrt(4.5): over n - 1
        assert value("llm_d_epp_std_dev_running_requests", name="p2") == 0.0
        assert value("llm_d_epp_per_endpoint_queue_size", name="p2", model_server_endpoint="b") == 4
    finally:
        collectors.pool_collector.discard(snap)


# --- label caps ----------------------------------------------------------------------------------


def test_model_names_share_one_cap_of_1000_as_in_llm_d() -> None:
    labels = metrics.ModelLabels(limit=10_000, budget=10**9)
    for i in range(500):
        assert labels(f"model-{i}", f"target-{i}") == (f"model-{i}", f"target-{i}")
    assert labels("one-more", "t") == ("other", "other")  # 1,000 names between the two labels
    labels.pin("configured", "configured-v2")  # InferenceModelRewrite's names: always themselves
    assert labels("configured", "configured-v2") == ("configured", "configured-v2")
    assert metrics.MAX_LABEL_VALUES == 1000


def test_fairness_ids_are_capped_and_label_sets_too() -> None:
    sets = llmd_metrics.LabelSets(limit=3)
    sets.fairness = metrics.LabelCap(limit=2)
    assert sets("m", "m", "tenant-a", 0) == ("m", "m", "tenant-a", "0")
    assert sets("m", "m", "", 0) == ("m", "m", "default-flow", "0")  # llm-d's default flow
    assert sets("m", "m", "tenant-b", 0) == ("m", "m", "other", "0")  # a third fairness ID
    # a fourth set: every label but the priority folds
    assert sets("m2", "m2", "tenant-a", 5) == ("other", "other", "other", "5")
    assert sets("m", "m", "tenant-a", 0) == ("m", "m", "tenant-a", "0")  # kept sets stay themselves


def test_the_worker_merge_folds_llm_ds_series(exposed: dict[str, Family]) -> None:
    page = generate_latest(metrics.REGISTRY).decode()
    one = {f.name: f for f in merge.parse(page)}
    both = {f.name: f for f in merge.merge([merge.parse(page), merge.parse(page)])}

    def sample(families: dict[str, object], family: str, name: str) -> float:
        fam = families[family]
        return sum(s.value for s in fam.samples if s.name == name)  # type: ignore[attr-defined]

    # Each worker counts its own requests and lookups: summed.
    for family, name in (
        ("llm_d_epp_request", "llm_d_epp_request_total"),
        ("llm_d_epp_request_duration_seconds", "llm_d_epp_request_duration_seconds_count"),
        ("llm_d_epp_kv_cache_index_lookup_requests", "llm_d_epp_kv_cache_index_lookup_requests_total"),
        ("llm_d_epp_request_running", "llm_d_epp_request_running"),
    ):
        assert sample(both, family, name) == 2 * sample(one, family, name), name
    # Every worker sees every KV event and the same pool: the largest.
    for family, name in (
        ("llm_d_epp_kv_cache_events_messages_received", "llm_d_epp_kv_cache_events_messages_received_total"),
        ("kvcache_index_admissions", "kvcache_index_admissions_total"),
        ("llm_d_epp_ready_endpoints", "llm_d_epp_ready_endpoints"),
    ):
        assert sample(both, family, name) == sample(one, family, name), name


def test_docs_list_every_llm_d_series_and_why_some_are_not_written() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text(encoding="utf-8")
    section = text[text.index("## llm-d's series") : text.index("## epp's own series")]
    for s in llmd.SERIES:
        assert f"`{s.name}`" in section, s.name
    for name in llmd.NOT_EXPORTED:
        assert f"- `{name}`: " in section, name
