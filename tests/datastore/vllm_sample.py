"""Realistic vLLM /metrics pages for tests and the parser benchmark.

The page is rendered by prometheus_client, the library vLLM itself exposes its metrics with, using
vLLM's metric names, label sets (`engine`, `model_name`), bucket boundaries and the process/GC
collectors a real server also shows, so line shapes, label order, `_created` series and number
formatting match a real vLLM (0.11-0.32). Values come from a seeded RNG: the page is
deterministic. With two engines the page is about 50 KB, the size the parser was designed for.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

_TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_ITL = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_E2E = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_ITER = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _one_two_five(limit: int) -> tuple[float, ...]:
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > limit:
                return tuple(out)
            out.append(float(v))
        exp += 1


def vllm_metrics_page(
    *,
    engines: int = 2,
    model: str = "tiny",
    waiting: Sequence[int] = (3, 1),
    running: Sequence[int] = (8, 4),
    kv_usage: Sequence[float] = (0.25, 0.5),
    block_size: int = 16,
    num_gpu_blocks: int = 2048,
    lora: bool = True,
    seed: int = 7,
) -> bytes:
    """One /metrics page. `waiting`/`running`/`kv_usage` give per-engine values (cycled)."""
    rng = random.Random(seed)
    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)
    labels = ["model_name", "engine"]

    def gauge(name: str, doc: str, extra: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, [*labels, *extra], registry=reg)

    g_run = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
    g_wait = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
    g_reason = gauge("vllm:num_requests_waiting_by_reason", "Waiting requests by reason.", ["reason"])
    g_kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
    g_sleep = gauge("vllm:engine_sleep_state", "Engine sleep state", ["sleep_state"])
    counters = [
        (Counter(f"vllm:{n}", f"{n} counter", [*labels, *extra], registry=reg), bool(extra))
        for n, extra in [
            ("num_preemptions", ()),
            ("prompt_tokens", ()),
            ("generation_tokens", ()),
            ("prefix_cache_queries", ()),
            ("prefix_cache_hits", ()),
            ("prompt_tokens_cached", ()),
            ("request_success", ("finished_reason",)),
        ]
    ]
    hists = [
        Histogram(f"vllm:{n}", f"Histogram of {n}.", labels, buckets=b, registry=reg)
        for n, b in [
            ("time_to_first_token_seconds", _TTFT),
            ("inter_token_latency_seconds", _ITL),
            ("time_per_output_token_seconds", _ITL),
            ("e2e_request_latency_seconds", _E2E),
            ("request_queue_time_seconds", _E2E),
            ("request_inference_time_seconds", _E2E),
            ("request_prefill_time_seconds", _E2E),
            ("request_decode_time_seconds", _E2E),
            ("request_prefill_kv_computed_tokens", _one_two_five(1024)),
            ("request_prompt_tokens", _one_two_five(1024)),
            ("request_generation_tokens", _one_two_five(1024)),
            ("request_max_num_generation_tokens", _one_two_five(1024)),
            ("request_params_n", _one_two_five(1024)),
            ("request_params_max_tokens", _one_two_five(1024)),
            ("iteration_tokens_total", _ITER),
        ]
    ]
    http = Histogram(
        "http_request_duration_seconds",
        "Latency of HTTP requests.",
        ["handler", "method"],
        registry=reg,
    )
    for handler in ("/v1/completions", "/v1/chat/completions", "/metrics", "/health"):
        http.labels(handler, "GET" if handler in ("/metrics", "/health") else "POST").observe(0.01)

    for e in range(engines):
        lv = (model, str(e))
        g_run.labels(*lv).set(running[e % len(running)])
        g_wait.labels(*lv).set(waiting[e % len(waiting)])
        g_reason.labels(*lv, "capacity").set(waiting[e % len(waiting)])
        g_reason.labels(*lv, "deferred").set(0)
        g_kv.labels(*lv).set(kv_usage[e % len(kv_usage)])
        g_sleep.labels(*lv, "awake").set(1)
        for c, by_reason in counters:
            if by_reason:
                for reason in ("stop", "length", "abort"):
                    c.labels(*lv, reason).inc(rng.randint(0, 500))
            else:
                c.labels(*lv).inc(rng.randint(0, 100_000))
        for h in hists:
            child = h.labels(*lv)
            for _ in range(20):
                child.observe(rng.expovariate(1.0) * 3)

    text = generate_latest(reg)
    # Info-style series vLLM registers separately (their label sets are not engine/model_name).
    extra = [
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
    ]
    for e in range(engines):
        extra.append(
            f'vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",'
            'calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",'
            f'engine="{e}",gpu_memory_utilization="0.9",is_attention_free="False",'
            f'num_cpu_blocks="None",num_gpu_blocks="{num_gpu_blocks}",'
            f'num_gpu_blocks_override="{num_gpu_blocks}",prefix_caching_hash_algo="sha256",'
            'sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0\n'
        )
    if lora:
        extra.append(
            "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
            "# TYPE vllm:lora_requests_info gauge\n"
            'vllm:lora_requests_info{max_lora="4",running_lora_adapters="",'
            'waiting_lora_adapters=""} 1.7301234e+09\n'
            'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora,tweet-lora",'
            'waiting_lora_adapters="chat-lora"} 1.7301239e+09\n'
        )
    return text + "".join(extra).encode()
