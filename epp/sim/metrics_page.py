"""The /metrics page of a simulated replica: Prometheus text with vLLM's metric names for the
series a picker scrapes (SGLang's with `SimConfig.metrics_engine` "sglang"), and the histograms
the replica keeps for it; `restrict` is prometheus_client's `name[]` filter, which vLLM honours
at `/metrics/` (not at `/metrics`)."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp.sim.engine import SimState


class Histogram:
    """Just enough of a Prometheus histogram to render realistic exposition text."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        """`times` observations of `value` (a step's tokens share one inter-token time)."""
        self.total += value * times
        self.count += times
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += times

    def render(self, name: str, labels: str) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        for bound, count in zip(self.buckets, self.counts, strict=True):
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(count)}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        lines.append(f"{name}_count{{{labels}}} {float(self.count)}")
        lines.append(f"{name}_sum{{{labels}}} {self.total}")
        return lines


LATENCY_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1),
    *(0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
)
# vLLM 0.32's buckets for its per-request phase times, per-token times and prompt-token counts.
REQUEST_TIME_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
TOKEN_TIME_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0),
    *(2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
TOKEN_COUNT_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5))


def render_metrics(state: SimState) -> str:
    """Prometheus text with vLLM's metric names for the series a picker scrapes (SGLang's with
    `SimConfig.metrics_engine` "sglang")."""
    if state.config.metrics_engine == "sglang":
        return _render_sglang(state)
    cfg, prof, e = state.config, state.profile, state.engine
    m = f'model_name="{cfg.served_model}"'
    s = state.stats
    running_lora, waiting_lora = state.lora_adapters()
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{m}}} {float(e.num_running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{m}}} {float(e.num_waiting + cfg.extra_waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{m}}} {e.kv_usage}",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{prof.block_size}",cache_dtype="auto",enable_prefix_caching="True",'
        f'num_gpu_blocks="{prof.num_gpu_blocks}",num_cpu_blocks="0"}} 1.0',
        "# HELP vllm:lora_requests_info Running stats on lora requests.",
        "# TYPE vllm:lora_requests_info gauge",
        f'vllm:lora_requests_info{{max_lora="{cfg.max_loras}",running_lora_adapters="{",".join(running_lora)}",'
        f'waiting_lora_adapters="{",".join(waiting_lora)}"}} {time.time()}',
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{m}}} {float(e.num_preemptions)}",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{m}}} {float(s.prompt_tokens)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{m}}} {float(s.generation_tokens)}",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{m}}} {float(e.prefix_cache_queries)}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{m}}} {float(e.prefix_cache_hits)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
    ]
    for reason in ("length", "stop"):
        lines.append(
            f'vllm:request_success_total{{finished_reason="{reason}",{m}}} {float(state.success[reason])}'
        )
    lines += state.ttft.render("vllm:time_to_first_token_seconds", m)
    lines += state.e2e.render("vllm:e2e_request_latency_seconds", m)
    lines += state.queue_time.render("vllm:request_queue_time_seconds", m)
    lines += state.prefill_time.render("vllm:request_prefill_time_seconds", m)
    lines += state.decode_time.render("vllm:request_decode_time_seconds", m)
    lines += state.token_time.render("vllm:inter_token_latency_seconds", m)
    lines += state.prefill_computed.render("vllm:request_prefill_kv_computed_tokens", m)
    return "\n".join(lines) + "\n"


def _render_sglang(state: SimState) -> str:
    """The same state under SGLang's names (its `--enable-metrics` page): queue, running, token
    usage, the cache config llm-d's SGLang mapping reads (page_size, num_pages), counters and the
    TTFT / E2E histograms."""
    cfg, prof, e = state.config, state.profile, state.engine
    m = f'model_name="{cfg.served_model}"'
    s = state.stats
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{m}}} {float(e.num_running)}",
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{{{m}}} {float(e.num_waiting + cfg.extra_waiting)}",
        "# HELP sglang:token_usage The token usage.",
        "# TYPE sglang:token_usage gauge",
        f"sglang:token_usage{{{m}}} {e.kv_usage}",
        "# HELP sglang:cache_config_info Information of the cache config.",
        "# TYPE sglang:cache_config_info gauge",
        f'sglang:cache_config_info{{{m},page_size="{prof.block_size}",'
        f'num_pages="{prof.num_gpu_blocks}"}} 1.0',
        "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE sglang:prompt_tokens_total counter",
        f"sglang:prompt_tokens_total{{{m}}} {float(s.prompt_tokens)}",
        "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
        "# TYPE sglang:generation_tokens_total counter",
        f"sglang:generation_tokens_total{{{m}}} {float(s.generation_tokens)}",
    ]
    lines += state.ttft.render("sglang:time_to_first_token_seconds", m)
    lines += state.e2e.render("sglang:e2e_request_latency_seconds", m)
    return "\n".join(lines) + "\n"


def as_vllm_serves(page: str, path: str, names: Collection[str]) -> str:
    """What vLLM 0.32 answers to `GET path` with these `name[]` query values: `/metrics/` is
    prometheus_client's app, which keeps only the series named; `/metrics` is
    prometheus-fastapi-instrumentator's handler, which writes everything whatever the query."""
    return restrict(page, set(names)) if path == "/metrics/" and names else page


def restrict(page: str, names: Collection[str]) -> str:
    """`page` with only the samples named in `names`, as prometheus_client's `name[]` filter writes
    it: a family's comment lines (`# HELP`, `# TYPE`) are kept where one of its samples is, the
    family left out where none is. A histogram's `_sum` sample is named as such (its buckets not
    with it).

    The samples after a comment line are skipped unread where no name asked for starts with the
    name that line gives (less a counter's `_total`): the simulator's filtered page then costs
    less to write than its whole page, as vLLM's does."""
    out: list[str] = []
    header: list[str] = []  # the comment lines before the samples being read
    for i, piece in enumerate(page.split("\n#")):
        if i or piece.startswith("#"):  # a comment line ("#" split off but on the first), samples
            comment, _, samples = piece.partition("\n")
            comment = comment if i == 0 else "#" + comment
            header.append(comment)
        else:  # samples before any comment
            comment, samples = "", piece
        if not samples.strip():
            continue
        words = comment.split(maxsplit=3)
        base = words[2].removesuffix("_total") if len(words) > 2 else ""
        if not base or any(name.startswith(base) for name in names):
            kept = [line for line in samples.split("\n") if line and _sample_name(line) in names]
            if kept:
                out += header
                out += kept
        header = []
    return "\n".join(out) + "\n" if out else ""


def _sample_name(line: str) -> str:
    end = len(line)
    for stop in ("{", " "):
        j = line.find(stop)
        if j != -1:
            end = min(end, j)
    return line[:end]
