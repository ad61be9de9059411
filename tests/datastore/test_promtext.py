"""promtext: the fast vLLM /metrics extractor, against realistic pages and hostile ones."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.datastore import promtext
from epp.datastore.endpoints import LatencyTotals, ModelServerMetrics

from . import vllm_sample

# Lines as a real vLLM 0.32 (CPU, one engine, no LoRA) prints them (see vllm-cpu.md section 5).
REAL_VLLM_EXCERPT = b"""\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12834.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 3.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="deferred"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0625
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 24000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7631e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",engine="0",\
num_cpu_blocks="None",num_gpu_blocks="2048",num_gpu_blocks_override="2048",\
prefix_caching_hash_algo="sha256"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 24.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 24.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 3.2
"""


def test_real_vllm_excerpt() -> None:
    m = promtext.parse(REAL_VLLM_EXCERPT)
    assert m == ModelServerMetrics(waiting=3, running=4, kv_usage=0.0625, block_size=32, num_gpu_blocks=2048)


def test_generated_page_sums_counts_and_maxes_usage_across_engines() -> None:
    page = vllm_sample.vllm_metrics_page(
        engines=2, waiting=(3, 1), running=(8, 4), kv_usage=(0.25, 0.5), block_size=16, num_gpu_blocks=4096
    )
    assert len(page) > 40_000  # the size class the parser is designed for
    m = promtext.parse(page)
    assert (m.waiting, m.running, m.kv_usage) == (4, 12, 0.5)
    assert (m.block_size, m.num_gpu_blocks) == (16, 4096)
    # The LoRA series with the latest timestamp wins, whatever its position.
    assert m.max_lora == 4
    assert m.running_loras == {"sql-lora", "tweet-lora"}
    assert m.waiting_loras == {"chat-lora"}
    assert m.updated_at == 0.0  # the caller's to set


def test_agrees_with_prometheus_client_parser() -> None:
    """The reference parser, summed/maxed the same way, must give the same numbers."""
    page = vllm_sample.vllm_metrics_page(
        engines=3, waiting=(5, 0, 2), running=(1, 2, 3), kv_usage=(0.1, 0.9, 0.3)
    )
    values: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(page.decode()):
        for s in fam.samples:
            values.setdefault(s.name, []).append(s.value)
    m = promtext.parse(page)
    assert m.waiting == sum(values["vllm:num_requests_waiting"]) == 7
    assert m.running == sum(values["vllm:num_requests_running"]) == 6
    assert m.kv_usage == max(values["vllm:kv_cache_usage_perc"]) == 0.9


def test_str_input_and_crlf_and_timestamps_and_exponents() -> None:
    text = (
        "# TYPE vllm:num_requests_waiting gauge\r\n"
        'vllm:num_requests_waiting{model_name="m"} 1.2e+01 1700000000000\r\n'
        "vllm:num_requests_running 7\r\n"
        "vllm:kv_cache_usage_perc\t5E-1\r\n"
    )
    m = promtext.parse(text)
    assert (m.waiting, m.running, m.kv_usage) == (12, 7, 0.5)


def test_first_and_last_line_without_newline() -> None:
    m = promtext.parse(b"vllm:num_requests_running 2\nvllm:num_requests_waiting 9")
    assert (m.running, m.waiting) == (2, 9)


def test_longer_names_are_not_matched() -> None:
    page = (
        b'vllm:num_requests_waiting_by_reason{reason="capacity"} 50\n'
        b"vllm:num_requests_waiting 2\n"
        b'vllm:num_requests_waiting_by_reason{reason="deferred"} 60\n'
        b"vllm:num_requests_running_total 99\n"
        b"vllm:kv_cache_usage_perc_created 1.7e9\n"
    )
    m = promtext.parse(page)
    assert (m.waiting, m.running, m.kv_usage) == (2, 0, 0.0)


def test_labels_with_braces_quotes_and_escapes() -> None:
    page = (
        b'vllm:num_requests_waiting{model_name="we}ird {model} \\"q\\" \\\\",engine="0"} 3\n'
        b'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a\\\\b, c ,,",'
        b'waiting_lora_adapters=""} 10\n'
    )
    m = promtext.parse(page)
    assert m.waiting == 3
    assert m.max_lora == 2
    assert m.running_loras == {"a\\b", "c"}
    assert m.waiting_loras == frozenset()


def test_parse_labels() -> None:
    got = promtext.parse_labels(b'a="1", b = "x\\ny" ,c="{}=,",')
    assert got == {"a": "1", "b": "x\ny", "c": "{}=,"}
    with pytest.raises(promtext.PromTextError):
        promtext.parse_labels(b'a="1",b=2')


def test_nan_and_inf() -> None:
    page = (
        b'vllm:num_requests_waiting{engine="0"} NaN\n'
        b'vllm:num_requests_waiting{engine="1"} 4\n'
        b"vllm:num_requests_running +Inf\n"
        b"vllm:kv_cache_usage_perc -Inf\n"
    )
    m = promtext.parse(page)
    assert (m.waiting, m.running, m.kv_usage) == (4, 0, 0.0)


def test_usage_is_clamped_and_counts_never_negative() -> None:
    m = promtext.parse(b"vllm:kv_cache_usage_perc 1.7\nvllm:num_requests_waiting -3\n")
    assert (m.kv_usage, m.waiting) == (1.0, 0)


def test_old_vllm_gpu_cache_usage_fallback() -> None:
    old = b'vllm:gpu_cache_usage_perc{model_name="m"} 0.75\nvllm:num_requests_running 1\n'
    assert promtext.parse(old).kv_usage == 0.75
    both = old + b'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
    assert promtext.parse(both).kv_usage == 0.25  # the new name wins


def test_missing_series_keep_defaults() -> None:
    m = promtext.parse(b"# only one\nvllm:num_requests_running 5\n")
    assert m == ModelServerMetrics(running=5)


def test_cache_info_none_values_are_absent() -> None:
    m = promtext.parse(b'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n')
    assert (m.block_size, m.num_gpu_blocks) == (16, 0)


def test_lora_latest_series_wins_even_first() -> None:
    page = (
        b'vllm:lora_requests_info{max_lora="8",running_lora_adapters="new",waiting_lora_adapters=""} 2e9\n'
        b'vllm:lora_requests_info{max_lora="8",running_lora_adapters="old",waiting_lora_adapters="x"} 1e9\n'
    )
    m = promtext.parse(page)
    assert (m.max_lora, m.running_loras, m.waiting_loras) == (8, frozenset({"new"}), frozenset())


@pytest.mark.parametrize(
    "page",
    [
        b"",
        b"<html><body>404 Not Found</body></html>",
        b"# HELP vllm:num_requests_waiting but no samples\n",
        b"process_cpu_seconds_total 1.0\n",
        bytes(range(256)) * 10,
    ],
)
def test_pages_without_vllm_series_raise(page: bytes) -> None:
    with pytest.raises(promtext.PromTextError):
        promtext.parse(page)


@pytest.mark.parametrize(
    "line",
    [
        b'vllm:num_requests_waiting{model_name="m" 3',  # unterminated labels
        b"vllm:num_requests_waiting{} three",
        b"vllm:num_requests_waiting{}",
        b"vllm:num_requests_waiting 1 2 3",
        b"vllm:cache_config_info{block_size=16} 1",  # unquoted label value
    ],
)
def test_malformed_wanted_line_raises(line: bytes) -> None:
    with pytest.raises(promtext.PromTextError, match=r"vllm:|label"):
        promtext.parse(b"vllm:num_requests_running 1\n" + line + b"\n")


def test_random_garbage_never_escapes_as_another_exception() -> None:
    rng = random.Random(1)
    page = vllm_sample.vllm_metrics_page(engines=1)
    for _ in range(300):
        # Corrupt a real page: flip bytes, truncate, splice.
        b = bytearray(page)
        for _ in range(rng.randint(1, 40)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cut = bytes(b[: rng.randrange(len(b))])
        try:
            m = promtext.parse(cut)
        except promtext.PromTextError:
            continue
        assert m.waiting >= 0 and m.running >= 0
        assert 0.0 <= m.kv_usage <= 1.0 and not math.isnan(m.kv_usage)


def test_huge_counts_do_not_overflow() -> None:
    m = promtext.parse(b'vllm:num_requests_waiting{e="0"} 1e308\nvllm:num_requests_waiting{e="1"} 1e308\n')
    assert m.waiting == 0


def test_latency_totals_from_a_real_vllm_page() -> None:
    """vLLM 0.32's page (a capture, scripts/capture_vllm_metrics.py): the sums and counts of its
    decode-latency histograms (vLLM's decode time is its tokens' inter-token times, summed) and of
    its time to first token."""
    page = (Path(promtext.__file__).parents[1] / "bench" / "data" / "vllm-0.32-metrics.txt").read_bytes()
    m = promtext.parse(page)
    assert m.latency == LatencyTotals(
        token_seconds=3.0486851190007656,
        tokens=636.0,
        decode_seconds=3.0486851190007656,
        decodes=24.0,
        ttft_seconds=0.613983154296875,
        ttfts=24.0,
    )
    assert promtext.parse(page, latency=False).latency is None


def test_latency_totals_are_summed_over_engines_as_the_reference_parser_reads_them() -> None:
    page = vllm_sample.vllm_metrics_page(engines=3)
    values: dict[str, float] = {}
    for fam in text_string_to_metric_families(page.decode()):
        for s in fam.samples:
            values[s.name] = values.get(s.name, 0.0) + s.value
    got = promtext.parse(page).latency
    assert got is not None
    assert got.token_seconds == pytest.approx(values["vllm:inter_token_latency_seconds_sum"])
    assert got.tokens == values["vllm:inter_token_latency_seconds_count"]
    assert got.decode_seconds == pytest.approx(values["vllm:request_decode_time_seconds_sum"])
    assert got.decodes == values["vllm:request_decode_time_seconds_count"] == 60
    assert got.ttft_seconds == pytest.approx(values["vllm:time_to_first_token_seconds_sum"])
    assert got.ttfts == values["vllm:time_to_first_token_seconds_count"] > 0


def test_latency_totals_need_every_series_and_sane_values() -> None:
    page = vllm_sample.vllm_metrics_page(engines=1)
    assert promtext.parse(page).latency is not None
    # One family missing (an older vLLM): none, rather than totals that mix definitions.
    without = b"\n".join(
        line for line in page.split(b"\n") if not line.startswith(b"vllm:request_decode_time_seconds")
    )
    assert promtext.parse(without).latency is None
    # The TTFT histogram missing: the decode totals still read, its own zero (nothing learned).
    no_ttft = b"\n".join(
        line for line in page.split(b"\n") if not line.startswith(b"vllm:time_to_first_token_seconds")
    )
    got = promtext.parse(no_ttft).latency
    assert got is not None and got.decodes > 0 and got.ttft_seconds == got.ttfts == 0.0
    # The sum written elsewhere than right after its count (another exporter): found all the same.
    lines = page.split(b"\n")
    at = next(i for i, line in enumerate(lines) if line.startswith(b"vllm:inter_token_latency_seconds_sum"))
    moved = lines[:at] + lines[at + 1 :] + [lines[at]]
    assert promtext.parse(b"\n".join(moved)).latency == promtext.parse(page).latency
    # A negative or non-finite sum: none (a broken page teaches nothing), the rest still read.
    for bad in (b"-1.0", b"NaN", b"+Inf"):
        broken = re.sub(rb"(vllm:request_decode_time_seconds_sum\{[^}]*\}) \S+", rb"\1 " + bad, page)
        m = promtext.parse(broken)
        assert m.latency is None and m.running == 8
    # A page of another server: no totals, no error.
    assert promtext.parse(b"vllm:num_requests_running 3\n").latency is None
