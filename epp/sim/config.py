"""`SimConfig`: how one simulated replica behaves (`epp.sim.engine` runs it; `epp sim`'s flags
and the tests build it)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from epp.sim.blocks import HashAlgo
from epp.sim.profiles import Profile

LLMD_TOPIC = "kv@{address}@{model}"  # llm-d's KV-event topic convention (a SimConfig.kv_topic)


@dataclasses.dataclass(frozen=True, slots=True)
class SimConfig:
    """Behaviour of one simulated replica. Times are simulated seconds; `time_scale` turns them
    into wall seconds.

    The engine limits (`block_size`, `num_gpu_blocks`, `max_num_seqs`, `max_num_batched_tokens`,
    `max_model_len`) always come from these fields; step costs come from `profile` when it is set
    (`SimConfig.from_profile` copies a profile's limits into the fields too), else from the
    per-token knobs (`engine_profile` has the mapping).
    """

    name: str = ""  # value of x-sim-server; "" = "<host>:<port>"
    served_model: str = "sim-model"
    lora_adapters: tuple[str, ...] = ()
    max_loras: int = 4
    # Reject models other than served_model / lora_adapters with 404 (vLLM does); off by default
    # so tests can send any name and see it echoed (an unknown name is served as the base model).
    strict_models: bool = False
    # vLLM's --api-key (or $VLLM_API_KEY): requests to /v1, /v2, /inference and /cohere without
    # `Authorization: Bearer <one of these>` get vLLM's 401; () = open, vLLM's default.
    api_keys: tuple[str, ...] = ()
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048  # token budget per step (vLLM's default below 70 GiB GPUs)
    block_size: int = 16  # tokens per KV block, as reported in vllm:cache_config_info
    num_gpu_blocks: int = 4096
    # tokenizer.json, or a directory holding it; None = epp-tiny, epp's default tokenizer.
    tokenizer: str | None = None
    # Step costs from a named, calibrated profile; None = the per-token knobs below.
    profile: Profile | None = None
    base_latency: float = 0.01
    # Seconds per prompt token computed; None = prefill_per_char * chars_per_token (8e-5: a lone
    # cold 4k-token prompt takes 0.33 s with base_latency).
    prefill_per_token: float | None = None
    # The cost knob of the character model this simulator had; kept so callers that set it keep
    # their timing. chars_per_token only converts it: tokens are real now.
    prefill_per_char: float = 2.0e-5
    chars_per_token: int = 4
    decode_per_token: float = 0.02  # the floor of every step: a decode step's time
    time_scale: float = 1.0
    default_max_tokens: int = 16
    max_output_tokens: int = 4096
    max_model_len: int = 32768  # cut to the KV capacity when that is smaller
    embedding_dims: int = 16
    # Fault injection for gateway tests: answer inference requests with this status at once (0 =
    # off), or drop their connection without answering. Metrics and /health keep working.
    fault_status: int = 0
    fault_reset: bool = False
    # Added to the reported vllm:num_requests_waiting: makes this replica look busier to scorers.
    extra_waiting: int = 0
    # Whose names /metrics uses: vLLM's, or SGLang's (sglang:num_queue_reqs, ...) to stand for an
    # SGLang pod to routers that read each engine by its names (llm-d's core-metrics-extractor).
    metrics_engine: Literal["vllm", "sglang"] = "vllm"
    # KV events (vLLM's --kv-events-config): the PUB endpoint, bound when it has a wildcard or port
    # 0 ("tcp://127.0.0.1:0": an ephemeral port), connected otherwise; None = no events. The
    # replay ROUTER endpoint (always bound; None = no replay). The topic, a template whose
    # {address} is the HTTP address and {model} the served model: vLLM's default "" (connect mode
    # reads every topic), or llm-d's LLMD_TOPIC, which a single bound socket (epp's bind mode)
    # needs to tell the pods apart. The wire encoding: "map" (vLLM >= 0.24) or "array" (the legacy
    # layout of vLLM 0.22-0.23).
    kv_events: str | None = None
    kv_replay: str | None = None
    kv_topic: str = ""
    kv_encoding: Literal["map", "array"] = "map"
    # vLLM's --prefix-caching-hash-algo (its default, sha256, seeded as vLLM seeds it: from
    # $PYTHONHASHSEED, else vLLM's fixed seed), so routers that recompute vLLM's hashes match the
    # events; and whether events carry each hash's low 64 bits (vLLM's default) or the whole
    # digest (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
    hash_algo: HashAlgo = "sha256"
    kv_int_hashes: bool = True
    # The seed of NONE_HASH, vLLM's PYTHONHASHSEED; None = as vLLM: $PYTHONHASHSEED, else its fixed
    # seed. An in-process fleet sets it here (a router's docs may ask for PYTHONHASHSEED=0).
    hash_seed: str | None = None
    # vLLM's --enable-scale-out: the /render routes (and /inference/v1/generate) answer; without it
    # they answer 403, as vLLM's do. On by default: epp and vllm-router render through them.
    scale_out: bool = True
    # vLLM's --enable-server-load-tracking: GET /load counts the requests in flight, else 0.
    server_load_tracking: bool = False
    # P/D (vLLM's NixlConnector protocol, `kv_transfer_params`): KV bytes a token and the rate a
    # decode pod pulls them from a prefill pod of the same `epp sim` process.
    kv_bytes_per_token: int = 131072
    kv_link_bytes_per_s: float = 50e9

    @classmethod
    def fixed(cls, latency: float = 0.0, **overrides: Any) -> SimConfig:
        """Constant cost per request: `latency` before the engine, whose steps take no time."""
        fields: dict[str, Any] = {
            "base_latency": latency,
            "prefill_per_token": 0.0,
            "prefill_per_char": 0.0,
            "decode_per_token": 0.0,
            "time_scale": 1.0,
        }
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_profile(cls, profile: Profile, **overrides: Any) -> SimConfig:
        """A replica running `profile`: its limits and step costs, no base latency."""
        fields: dict[str, Any] = {
            "profile": profile,
            "block_size": profile.block_size,
            "num_gpu_blocks": profile.num_gpu_blocks,
            "max_num_seqs": profile.max_num_seqs,
            "max_num_batched_tokens": profile.max_num_batched_tokens,
            "max_model_len": profile.max_model_len,
            "base_latency": 0.0,
        }
        fields.update(overrides)
        return cls(**fields)

    @property
    def prefill_cost(self) -> float:
        """Seconds per prompt token computed (the per-token knob; unused with a profile)."""
        if self.prefill_per_token is not None:
            return self.prefill_per_token
        return self.prefill_per_char * self.chars_per_token

    def engine_profile(self) -> Profile:
        """The profile the engine runs: this config's limits, with `profile`'s step costs or these:
        a step takes max(decode_per_token, tokens computed x prefill_cost), which is
        `decode_per_token` for a decode step, `prefill_cost` per token for a long prefill, and the
        old per-request numbers for a request alone. `max_model_len` is cut to the KV capacity
        (`num_gpu_blocks - 1` blocks: vLLM's null block holds none; vLLM would refuse to start
        instead)."""
        limits: dict[str, Any] = {
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": max(1, min(self.max_model_len, self.block_size * (self.num_gpu_blocks - 1))),
        }
        if self.profile is not None:
            return self.profile.replace(**limits)
        return Profile(
            name="sim-config",
            step_overhead_s=0.0,
            weights_read_s=self.decode_per_token,
            token_s=self.prefill_cost,
            attention_pair_s=0.0,
            kv_read_token_s=0.0,
            description="SimConfig's per-token costs",
            **limits,
        )

    def lora_id(self, model: str) -> int | None:
        """vLLM's int id of an adapter (1-based, in `lora_adapters` order); None for the base model."""
        try:
            return self.lora_adapters.index(model) + 1
        except ValueError:
            return None
