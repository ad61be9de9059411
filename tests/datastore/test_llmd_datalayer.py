"""llm-d's data layer in epp's datastore: engines' metric names (parsed pages, the scraper choosing
each endpoint's engine), DCGM's GPU utilization, and the file-discovery endpoints file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from epp.datastore import engines, promtext
from epp.datastore.dcgm import GPU_UTILIZATION, DcgmError, DcgmPoller, DcgmSource, utilization
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.datastore.file_discovery import DiscoveryFileError, FileDiscovery, FileDiscoverySource, parse
from epp.datastore.scraper import MetricsScraper

from .fake_vllm import FakeVLLM, until

SGLANG = b"""# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",engine_type="unified"} 3.0
sglang:num_running_reqs{model_name="m",engine_type="unified"} 5.0
sglang:token_usage{model_name="m"} 0.25
sglang:cache_config_info{page_size="32",num_pages="4096"} 1.0
"""
TRITON_TRTLLM = b"""nv_trt_llm_request_metrics{model="m",request_type="waiting",version="1"} 4
nv_trt_llm_request_metrics{model="m",request_type="scheduled",version="1"} 6
nv_trt_llm_request_metrics{model="m",request_type="max",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="m"} 0.5
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="m"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="m"} 1000
"""
TRTLLM_SERVE = b"""trtllm_num_requests_waiting 2
trtllm_num_requests_running 1
trtllm_kv_cache_utilization 0.125
trtllm_kv_cache_tokens_per_block 32
trtllm_kv_cache_max_blocks 777
"""


@pytest.mark.parametrize(
    ("engine", "page", "expected"),
    [
        ("sglang", SGLANG, (3, 5, 0.25, 32, 4096)),
        ("triton-tensorrt-llm", TRITON_TRTLLM, (4, 6, 0.5, 64, 1000)),
        ("trtllm-serve", TRTLLM_SERVE, (2, 1, 0.125, 32, 777)),
    ],
)
def test_each_engines_page_reads_with_llm_ds_names(
    engine: str, page: bytes, expected: tuple[int, int, float, int, int]
) -> None:
    m = promtext.parse(page, engines.BUILTIN[engine])
    assert (m.waiting, m.running, m.kv_usage, m.block_size, m.num_gpu_blocks) == expected
    with pytest.raises(promtext.PromTextError, match="no vllm series found"):
        promtext.parse(page)  # vLLM's names are not on another engine's page


def test_triton_reads_queue_and_executions_only() -> None:
    page = b'nv_inference_pending_request_count{model="m"} 7\nnv_inference_exec_count{model="m"} 11\n'
    m = promtext.parse(page, engines.BUILTIN["triton"])
    assert (m.waiting, m.running, m.kv_usage) == (7, 11, 0.0)


def test_custom_metrics_and_label_matchers() -> None:
    mapping = engines.EngineMapping(
        "x",
        queued=engines.parse_spec("q{kind=waiting}"),
        custom=(("Temp", engines.parse_spec("gpu_temp")),),
    )
    m = promtext.parse(b'q{kind="waiting"} 2\nq{kind="running"} 9\ngpu_temp{gpu="0"} 71\n', mapping)
    assert m.waiting == 2 and m.custom == {"Temp": 71.0}


def test_metric_specs_are_llm_ds_syntax() -> None:
    assert engines.parse_spec('a{b=c, d="e"}') == engines.MetricSpec(b"a", (("b", "c"), ("d", "e")))
    assert engines.parse_spec("") is None
    for bad in ("1abc", "a{b}", "a b"):
        with pytest.raises(engines.MetricSpecError):
            engines.parse_spec(bad)


def test_gie_flags_replace_the_default_engines_names() -> None:
    sglang = engines.BUILTIN["sglang"]
    flags = {
        "total-queued-requests-metric": ("queued", sglang.queued),
        "kv-cache-usage-percentage-metric": ("kv_usage", sglang.kv_usage),
    }
    changed = engines.with_default_overrides(engines.DEFAULT_ENGINES, flags)
    assert changed.default.queued == sglang.queued and changed.default.running == engines.VLLM.running
    assert changed.for_labels({}) is changed.default
    assert changed.for_labels({"llm-d.ai/engine-type": "sglang"}) is sglang


async def test_the_scraper_reads_each_endpoint_by_its_engine_label() -> None:
    vllm, sgl = FakeVLLM(), FakeVLLM()
    sgl.body = SGLANG
    vllm.waiting = 1
    await vllm.start()
    await sgl.start()
    ds = Datastore()
    ds.sync(
        "t",
        [
            EndpointSpec("v", "127.0.0.1", vllm.port),
            EndpointSpec("s", "127.0.0.1", sgl.port, labels={"llm-d.ai/engine-type": "sglang"}),
        ],
    )
    v, s = ds.get("v"), ds.get("s")
    assert v is not None and s is not None
    try:
        async with MetricsScraper(ds, pool_name="p", interval=0.01, engines=engines.DEFAULT_ENGINES):
            await until(lambda: v.metrics.waiting == 1 and s.metrics.waiting == 3, "both engines read")
            assert (s.metrics.running, s.metrics.block_size) == (5, 32) and not s.excluded
    finally:
        await vllm.stop()
        await sgl.stop()


# ---- DCGM --------------------------------------------------------------------------------------

DCGM_PAGE = b"""DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="p1"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="1",pod="p1"} 90
DCGM_FI_DEV_GPU_UTIL{gpu="2",pod="p2"} 10
"""


def test_dcgm_utilization_is_the_pods_busiest_gpu() -> None:
    assert utilization(DCGM_PAGE, "p1") == 0.9
    assert utilization(DCGM_PAGE, "p2") == 0.1
    assert utilization(b'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 55\n', "p9") == 0.55  # a sidecar's: no pod label
    with pytest.raises(DcgmError, match="no samples for pod 'p3'"):
        utilization(DCGM_PAGE, "p3")
    with pytest.raises(DcgmError, match="not found"):
        utilization(b"other 1\n", "p1")


async def test_the_dcgm_poller_sets_the_attribute() -> None:
    exporter = FakeVLLM()
    exporter.body = DCGM_PAGE
    await exporter.start()
    ds = Datastore()
    ds.sync("t", [EndpointSpec("p1-rank-0", "127.0.0.1", 8000, pod="p1")])
    ep = ds.get("p1-rank-0")
    assert ep is not None
    poller = DcgmPoller(ds, DcgmSource(port=exporter.port, interval=0.01))
    try:
        await poller.start()
        await until(lambda: ep.attributes.get(GPU_UTILIZATION) == 0.9, "GPU utilization")
        exporter.status = 500  # a failed poll keeps the last value, as llm-d does
        await asyncio.sleep(0.05)
        assert ep.attributes[GPU_UTILIZATION] == 0.9
    finally:
        await poller.stop()
        await exporter.stop()


# ---- file discovery ----------------------------------------------------------------------------

FILE = """endpoints:
  - {name: vllm-0, address: "10.0.0.1", port: "8000", labels: {zone: a}}
  - {name: vllm-1, namespace: ns, address: "10.0.0.2", port: 8001}
  - {name: bad-ip, address: "vllm.local", port: "8000"}
  - {name: bad-port, address: "10.0.0.3", port: "0"}
"""


def test_llm_ds_endpoints_file_skips_bad_entries() -> None:
    specs, problems = parse(FILE)
    assert [(s.name, s.address, s.port, s.namespace) for s in specs] == [
        ("vllm-0", "10.0.0.1", 8000, "default"),
        ("vllm-1", "10.0.0.2", 8001, "ns"),
    ]
    assert specs[0].labels == {"zone": "a"} and specs[0].pod == "vllm-0"
    assert problems == [
        "endpoint 'bad-ip': invalid IPv4 address 'vllm.local'",
        "endpoint 'bad-port': invalid port '0'",
    ]
    with pytest.raises(DiscoveryFileError, match="`endpoints` must be a list"):
        parse("endpoints: {a: 1}\n")


async def test_a_watched_file_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(FILE)
    ds = Datastore()
    discovery = FileDiscovery(FileDiscoverySource(str(path), watch=True), ds, poll_interval=0.01)
    discovery.load()
    assert sorted(ep.name for ep in ds.endpoints()) == ["vllm-0", "vllm-1"]
    await discovery.start()
    try:
        replacement = tmp_path / "new.yaml"
        replacement.write_text('endpoints: [{name: vllm-9, address: "10.0.0.9", port: "9000"}]\n')
        os.replace(replacement, path)  # an atomic rename, as editors and ConfigMaps do
        await until(lambda: [ep.name for ep in ds.endpoints()] == ["vllm-9"], "the new endpoints")
        path.write_text("endpoints: [")  # a broken edit keeps the last endpoints
        await asyncio.sleep(0.05)
        assert [ep.name for ep in ds.endpoints()] == ["vllm-9"]
    finally:
        await discovery.stop()


def test_a_file_that_cannot_be_read_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryFileError, match="cannot read"):
        FileDiscovery(FileDiscoverySource(str(tmp_path / "none.yaml")), Datastore()).load()
    big = tmp_path / "big.yaml"
    big.write_text("#" * (1 << 20 | 1))
    with pytest.raises(DiscoveryFileError, match="1 MiB"):
        FileDiscovery(FileDiscoverySource(str(big)), Datastore()).load()
