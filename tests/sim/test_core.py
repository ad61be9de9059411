"""The step-based engine (epp.sim.core): vLLM V1's scheduling, prefix cache and preemption rules."""

from __future__ import annotations

import pytest

from epp.kvcache.events import AllBlocksCleared, BlockStored
from epp.sim import blocks, core, profiles

BS = 4


def prof(**changes: object) -> profiles.Profile:
    """A small, cheap profile: 4-token blocks, 64 usable blocks, budget 16, 4 sequences."""
    base = profiles.get_profile("tiny").replace(
        name="test",
        block_size=BS,
        num_gpu_blocks=65,  # 64 usable beside the null block
        max_num_seqs=4,
        max_num_batched_tokens=16,
        max_model_len=256,
    )
    return base.replace(**changes)


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def run(engine: core.Engine, now: float = 0.0, *, max_steps: int = 10_000) -> float:
    steps = 0
    while engine.has_unfinished():
        now += engine.step(now).duration
        steps += 1
        assert steps < max_steps
    return now


def test_chunked_prefill_spans_steps_and_times_add_up() -> None:
    engine = core.Engine(prof())
    req = core.EngineRequest("a", toks(0, 40), 3)
    engine.add_request(req, 1.0)
    assert (engine.num_waiting, engine.num_running) == (1, 0)
    now, chunks = 1.0, []
    while req.first_token_time is None:
        res = engine.step(now)
        chunks.append(res.num_prefill_tokens)
        now += res.duration
    assert chunks == [16, 16, 8]  # the budget cuts the prompt into chunks
    assert req.first_token_time == pytest.approx(now) and req.num_output_tokens == 1
    res = engine.step(now)
    assert (res.num_prefill_tokens, res.num_decode_seqs) == (0, 1)
    end = run(engine, now + res.duration)
    assert req.finished and req.finish_time == pytest.approx(end) and req.num_output_tokens == 3
    assert req.arrival_time == 1.0
    assert engine.kv_usage == 0.0 and not engine.has_unfinished()


def test_decodes_go_first_and_share_the_budget_with_a_prefill() -> None:
    engine = core.Engine(prof())
    engine.add_request(core.EngineRequest("d1", toks(0, 4), 50), 0.0)
    engine.add_request(core.EngineRequest("d2", toks(100, 4), 50), 0.0)
    now = engine.step(0.0).duration  # both prefill in one step
    big = core.EngineRequest("big", toks(200, 40), 1)
    engine.add_request(big, now)
    res = engine.step(now)
    assert (res.num_decode_seqs, res.num_prefill_tokens) == (2, 14)  # 16 - 2 decode tokens


def test_max_num_seqs_caps_running_and_the_rest_wait() -> None:
    engine = core.Engine(prof(max_num_seqs=2, max_num_batched_tokens=100))
    for i in range(5):
        engine.add_request(core.EngineRequest(f"r{i}", toks(10 * i, 4), 5), 0.0)
    engine.step(0.0)
    assert (engine.num_running, engine.num_waiting) == (2, 3)
    run(engine)
    assert engine.num_running == engine.num_waiting == 0


def test_fifo_head_of_line_blocks_a_smaller_request_behind_it() -> None:
    # 16 blocks: a running request holds 10; the head of the queue needs 8, the next only 1.
    engine = core.Engine(prof(num_gpu_blocks=17, max_num_batched_tokens=64, max_model_len=64))
    first = core.EngineRequest("first", toks(0, 40), 20)
    engine.add_request(first, 0.0)
    now = engine.step(0.0).duration
    head, small = core.EngineRequest("head", toks(100, 32), 1), core.EngineRequest("small", toks(200, 3), 1)
    engine.add_request(head, now)
    engine.add_request(small, now)
    engine.step(now)
    assert (engine.num_running, engine.num_waiting) == (1, 2)  # small waits behind head
    run(engine)
    assert head.first_token_time is not None and small.first_token_time is not None
    assert small.first_token_time >= head.first_token_time


def test_prefix_hits_take_full_blocks_and_always_compute_the_last_token() -> None:
    engine = core.Engine(prof())
    engine.add_request(core.EngineRequest("a", toks(0, 16), 1), 0.0)
    now = run(engine)
    assert (engine.prefix_cache_queries, engine.prefix_cache_hits) == (16, 0)
    same = core.EngineRequest("same", toks(0, 16), 1)  # 4 cached blocks, but the last token is computed
    longer = core.EngineRequest("longer", [*toks(0, 13), 999, 998], 1)  # shares 3 full blocks
    engine.add_request(same, now)
    now = run(engine, now)
    engine.add_request(longer, now)
    run(engine, now)
    assert (same.num_cached_tokens, longer.num_cached_tokens) == (12, 12)
    assert (engine.prefix_cache_queries, engine.prefix_cache_hits) == (16 + 16 + 15, 24)
    assert core.EngineRequest("x", [1], 1).num_cached_tokens == 0


def test_salts_and_adapters_do_not_share_blocks() -> None:
    engine = core.Engine(prof())
    engine.add_request(core.EngineRequest("a", toks(0, 16), 1), 0.0)
    now = run(engine)
    salted = core.EngineRequest("s", toks(0, 16), 1, cache_salt="tenant")
    adapter = core.EngineRequest("l", toks(0, 16), 1, lora_name="ad", lora_id=1)
    engine.add_request(salted, now)
    engine.add_request(adapter, now)
    run(engine, now)
    assert salted.num_cached_tokens == adapter.num_cached_tokens == 0


def test_blocks_filled_by_generated_tokens_are_cached_and_hit() -> None:
    engine = core.Engine(prof(), record_events=True)
    req = core.EngineRequest("a", toks(0, 6), 5, output_token_ids=[50, 51, 52, 53, 54])
    engine.add_request(req, 0.0)
    now = run(engine)
    stored = [e for e in engine.take_events() if isinstance(e, BlockStored)]
    # Block 0 at prefill; block 1 (2 prompt + 2 generated tokens) once its last token is computed.
    assert [e.token_ids for e in stored] == [toks(0, 4), [4, 5, 50, 51]]
    assert stored[1].parent_block_hash == stored[0].block_hashes[0]
    follow_up = core.EngineRequest("b", [*toks(0, 6), 50, 51, 52, 53, 7], 1)
    engine.add_request(follow_up, now)
    run(engine, now)
    # The generated block was hit; block 2 (50..53) never was computed (53 was sampled last).
    assert follow_up.num_cached_tokens == 8


def test_preemption_recomputes_the_last_admitted_request() -> None:
    # 12 blocks; two requests of 16 prompt tokens (4 blocks each) decode 24 tokens (6 more each).
    engine = core.Engine(
        prof(num_gpu_blocks=13, max_num_batched_tokens=64, max_model_len=48), record_events=True
    )
    a, b = core.EngineRequest("a", toks(0, 16), 24), core.EngineRequest("b", toks(100, 16), 24)
    engine.add_request(a, 0.0)
    engine.add_request(b, 0.0)
    late = core.EngineRequest("late", toks(200, 3), 1)
    now, preempted_at = 0.0, None
    while engine.has_unfinished():
        before = engine.num_preemptions
        res = engine.step(now)
        if engine.num_preemptions > before and preempted_at is None:
            preempted_at = now
            assert b.num_preemptions == 1 and a.num_preemptions == 0  # the later one goes
            assert engine.num_waiting >= 1
            engine.add_request(late, now)  # arrives after the preempting step
        now += res.duration
    assert preempted_at is not None
    assert a.finished and b.finished and late.finished
    assert a.num_output_tokens == b.num_output_tokens == 24
    assert b.num_cached_tokens == 0  # usage reports the first admission's hit, not the resume's
    # b resumed first (front of the queue) and hit its own cached blocks.
    assert late.first_token_time is not None and b.finish_time is not None
    assert engine.prefix_cache_queries == 16 + 16 + 3  # resumed requests are not counted again


def test_a_step_that_preempts_admits_nothing() -> None:
    engine = core.Engine(prof(num_gpu_blocks=13, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=48))
    a, b = core.EngineRequest("a", toks(0, 16), 24), core.EngineRequest("b", toks(100, 16), 24)
    late = core.EngineRequest("late", toks(200, 3), 1)  # waits for a running slot
    for r in (a, b, late):
        engine.add_request(r, 0.0)
    now = 0.0
    while engine.num_preemptions == 0:
        now += engine.step(now).duration
    # b was preempted, a slot is free and a block too, yet late was not admitted in that step.
    assert (engine.num_running, engine.num_waiting) == (1, 2) and late.first_token_time is None
    # b is at the front of the queue: late never overtakes it, even while b waits for blocks.
    count, resumed = b.num_output_tokens, None
    while engine.has_unfinished():
        now += engine.step(now).duration
        if resumed is None and b.num_output_tokens > count:
            resumed = now
    assert b.num_preemptions == 1 and resumed is not None
    assert late.first_token_time is not None and late.first_token_time >= resumed


def test_rejects_what_vllm_rejects() -> None:
    engine = core.Engine(prof(max_model_len=32))
    with pytest.raises(
        core.RequestRejected, match=r"maximum context length is 32 tokens.*33 tokens \(30 in the messages, 3"
    ):
        engine.add_request(core.EngineRequest("a", toks(0, 30), 3), 0.0)
    with pytest.raises(core.RequestRejected, match="empty"):
        engine.add_request(core.EngineRequest("b", [], 3), 0.0)
    with pytest.raises(core.RequestRejected, match="max_tokens"):
        engine.add_request(core.EngineRequest("c", [1], 0), 0.0)
    ok = core.EngineRequest("d", toks(0, 29), 3)
    engine.add_request(ok, 0.0)
    with pytest.raises(ValueError, match="already added"):
        engine.add_request(ok, 0.0)
    assert not engine.has_unfinished() or engine.num_waiting == 1


def test_abort_frees_blocks_and_is_idempotent() -> None:
    engine = core.Engine(prof())
    running = core.EngineRequest("run", toks(0, 12), 100)
    waiting = core.EngineRequest("wait", toks(100, 12), 1)
    engine.add_request(running, 0.0)
    now = engine.step(0.0).duration
    assert engine.kv_usage > 0
    engine.add_request(waiting, now)
    engine.abort("wait")
    engine.abort("run")
    engine.abort("run")
    engine.abort("nobody")
    assert running.finished and waiting.finished and running.finish_time is None
    assert engine.kv_usage == 0.0 and not engine.has_unfinished()
    again = core.EngineRequest("again", toks(0, 12), 1)
    engine.add_request(again, now)
    run(engine, now)
    assert again.num_cached_tokens == 8  # the aborted request's computed blocks stayed cached


def test_reset_prefix_cache_is_refused_while_blocks_are_held() -> None:
    engine = core.Engine(prof(), record_events=True)
    req = core.EngineRequest("a", toks(0, 12), 5)
    engine.add_request(req, 0.0)
    now = engine.step(0.0).duration
    assert engine.reset_prefix_cache() is False
    now = run(engine, now)
    assert engine.reset_prefix_cache() is True
    assert isinstance(engine.take_events()[-1], AllBlocksCleared)
    again = core.EngineRequest("b", toks(0, 12), 1)
    engine.add_request(again, now)
    run(engine, now)
    assert again.num_cached_tokens == 0


def test_idle_step_takes_no_time_and_repr_shows_state() -> None:
    engine = core.Engine(prof(), name="pod-0")
    res = engine.step(5.0)
    assert res == core.StepResult(0.0, [], [], 0, 0)
    engine.add_request(core.EngineRequest("a", toks(0, 8), 2), 5.0)
    assert "pod-0" in repr(engine) and "waiting=1" in repr(engine)
    assert engine.snapshot()["waiting"] == 1
    assert "new" in repr(core.EngineRequest("x", [1], 1))


def test_identical_runs_are_identical() -> None:
    def trace() -> list[tuple[str, float | None, float | None, int]]:
        engine = core.Engine(prof(num_gpu_blocks=25, max_model_len=96))
        reqs = [core.EngineRequest(f"r{i}", toks(7 * (i % 3), 10 + i), 3 + i % 5) for i in range(12)]
        now = 0.0
        for r in reqs:
            engine.add_request(r, now)
            now += engine.step(now).duration
        run(engine, now)
        return [(r.request_id, r.first_token_time, r.finish_time, r.num_preemptions) for r in reqs]

    assert trace() == trace()


def test_prefix_digests_from_the_caller_equal_hashing_the_whole_prompt() -> None:
    engine = core.Engine(prof(), record_events=True)
    system = toks(0, 8)
    first = core.EngineRequest("a", [*system, 50, 51, 52, 53, 54], 1)
    engine.add_request(first, 0.0)
    now = run(engine)
    shared = blocks.block_digests(system, BS)
    second = core.EngineRequest("b", [*system, 50, 51, 52, 53, 99], 1, prefix_digests=shared)
    engine.add_request(second, now)
    run(engine, now)
    assert second.num_cached_tokens == 12  # both system blocks and the next one, hashed by the engine
