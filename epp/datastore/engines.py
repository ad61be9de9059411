"""Which metric names each inference engine's /metrics page uses for what epp routes on.

llm-d's `core-metrics-extractor` maps five quantities per engine (queued requests, running
requests, KV-cache usage, LoRA info, cache config) to metric specs, PromQL instant selectors with
optional label matchers (`nv_trt_llm_request_metrics{request_type=waiting}`), and picks each
endpoint's engine by a pod label. `BUILTIN` holds the mappings llm-d v0.10 ships (its
`defaultEngineConfigs`): vLLM, SGLang, TensorRT-LLM's `trtllm-serve`, Triton with TensorRT-LLM,
and plain Triton. `Engines` is one configuration of them: the default engine, the label read
(`llm-d.ai/engine-type`, then GIE's `inference.networking.k8s.io/engine-type`), and the mappings
by name; `EngineMapping` also carries the custom scalar metrics an engine config names, which
become endpoint attributes (read by `endpoint-attribute-filter` / `-scorer`).

How each quantity is read is `promtext`'s (sums of the matching series for queues, the largest
value for usage and cache sizes, the most recent LoRA series): one port may front several
engine processes (data parallelism), whose series epp adds up where llm-d reads the first one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

ENGINE_LABEL = "llm-d.ai/engine-type"  # llm-d's DefaultEngineTypeLabelKey
GIE_ENGINE_LABEL = "inference.networking.k8s.io/engine-type"  # GIE's, read when the first is absent
DEFAULT_ENGINE = "vllm"

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SPEC = re.compile(r"^\s*(\S+?)\s*(?:\{([^}]*)\})?\s*$")
_QUOTE = re.compile(r"(\w+)\s*=\s*([^\",}\s]+)")
_PAIR = re.compile(r'^\s*(\S+?)\s*=\s*"([^"]*)"\s*$')


class MetricSpecError(ValueError):
    """Not a metric specification; the message says why."""


@dataclasses.dataclass(frozen=True, slots=True)
class MetricSpec:
    """A metric name and the labels its series must carry (PromQL `name{label="value",...}`)."""

    name: bytes
    labels: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        if not self.labels:
            return self.name.decode()
        return self.name.decode() + "{" + ",".join(f'{k}="{v}"' for k, v in self.labels) + "}"


def parse_spec(text: str) -> MetricSpec | None:
    """llm-d's metric specification syntax: `name`, `name{label=value}` or `name{label="value"}`,
    label pairs separated by commas. "" is no spec (the quantity is not read)."""
    if not text:
        return None
    quoted = _QUOTE.sub(r'\1="\2"', text)  # llm-d quotes bare label values first
    match = _SPEC.match(quoted)
    if match is None or not _NAME.fullmatch(match[1]):
        raise MetricSpecError(f"not a valid metric specification: {text!r}")
    labels: list[tuple[str, str]] = []
    block = (match[2] or "").strip()
    if block:
        for pair in block.split(","):
            found = _PAIR.match(pair)
            if found is None or not _LABEL_NAME.fullmatch(found[1]):
                raise MetricSpecError(f"invalid label pair {pair!r} in specification {text!r}")
            labels.append((found[1], found[2]))
    return MetricSpec(match[1].encode(), tuple(labels))


@dataclasses.dataclass(frozen=True, slots=True)
class EngineMapping:
    """One engine's metric names. None: the engine does not expose that quantity."""

    name: str
    queued: MetricSpec | None = None
    running: MetricSpec | None = None
    kv_usage: MetricSpec | None = None
    lora: MetricSpec | None = None
    cache_info: MetricSpec | None = None  # an info gauge carrying block size and count as labels
    cache_block_size_label: str = "block_size"
    cache_num_blocks_label: str = "num_gpu_blocks"
    cache_block_size: MetricSpec | None = None  # block size as a gauge's value (TensorRT-LLM)
    cache_num_blocks: MetricSpec | None = None
    custom: tuple[tuple[str, MetricSpec], ...] = ()  # (endpoint attribute, spec)

    def specs(self) -> list[MetricSpec]:
        """Every spec this mapping reads."""
        fixed = (
            self.queued,
            self.running,
            self.kv_usage,
            self.lora,
            self.cache_info,
            self.cache_block_size,
            self.cache_num_blocks,
        )
        return [s for s in fixed if s is not None] + [s for _, s in self.custom]


def _spec(text: str) -> MetricSpec | None:
    return parse_spec(text)


VLLM = EngineMapping(
    "vllm",
    queued=_spec("vllm:num_requests_waiting"),
    running=_spec("vllm:num_requests_running"),
    kv_usage=_spec("vllm:kv_cache_usage_perc"),
    lora=_spec("vllm:lora_requests_info"),
    cache_info=_spec("vllm:cache_config_info"),
)

BUILTIN: dict[str, EngineMapping] = {
    "vllm": VLLM,
    "sglang": EngineMapping(
        "sglang",
        queued=_spec("sglang:num_queue_reqs"),
        running=_spec("sglang:num_running_reqs"),
        kv_usage=_spec("sglang:token_usage"),
        cache_info=_spec("sglang:cache_config_info"),
        cache_block_size_label="page_size",
        cache_num_blocks_label="num_pages",
    ),
    "trtllm-serve": EngineMapping(
        "trtllm-serve",
        queued=_spec("trtllm_num_requests_waiting"),
        running=_spec("trtllm_num_requests_running"),
        kv_usage=_spec("trtllm_kv_cache_utilization"),
        cache_block_size=_spec("trtllm_kv_cache_tokens_per_block"),
        cache_num_blocks=_spec("trtllm_kv_cache_max_blocks"),
    ),
    "triton-tensorrt-llm": EngineMapping(
        "triton-tensorrt-llm",
        queued=_spec("nv_trt_llm_request_metrics{request_type=waiting}"),
        running=_spec("nv_trt_llm_request_metrics{request_type=scheduled}"),
        kv_usage=_spec("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"),
        cache_block_size=_spec("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}"),
        cache_num_blocks=_spec("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}"),
    ),
    # Triton for non-LLM models (KServe v2): queue and executions only, no KV cache.
    "triton": EngineMapping(
        "triton",
        queued=_spec("nv_inference_pending_request_count"),
        running=_spec("nv_inference_exec_count"),
    ),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Engines:
    """The engine mappings of one pool: each endpoint's engine is its pod label's value (the first
    of `label_key`, GIE's label), else `default`; an engine without a mapping gets `default`'s."""

    default: EngineMapping = VLLM
    by_name: Mapping[str, EngineMapping] = dataclasses.field(default_factory=lambda: dict(BUILTIN))
    label_key: str = ENGINE_LABEL

    def for_labels(self, labels: Mapping[str, str]) -> EngineMapping:
        if not labels:
            return self.default
        engine = labels.get(self.label_key) or labels.get(GIE_ENGINE_LABEL)
        if not engine:
            return self.default
        return self.by_name.get(engine, self.default)


DEFAULT_ENGINES = Engines()


def with_default_overrides(
    engines: Engines, overrides: Mapping[str, tuple[str, MetricSpec | None]]
) -> Engines:
    """`engines` with the default engine's specs replaced per GIE's metric-name flags
    (flag -> (EngineMapping field, spec)): what GIE v1.0-1.4 read for every endpoint."""
    fields: dict[str, Any] = {field: spec for field, spec in overrides.values()}
    default = dataclasses.replace(engines.default, **fields)
    by_name = {name: default if m is engines.default else m for name, m in engines.by_name.items()}
    return Engines(default, by_name, engines.label_key)
