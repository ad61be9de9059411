"""The engine's one-pass step is exactly the two-pass algorithm it replaced (a speedup, not a model
change): same step times, outputs, counters and KV events on loads with chunked prefill,
preemption, scripted outputs, adapters and duplicates.

`TwoPass` below is the straightforward reading of vLLM's scheduler that `Engine.step` used before
it was fused into one loop: schedule every request, then add up the step's cost, then apply the
outputs. If the model itself changes (a new scheduling rule), change both.
"""

from __future__ import annotations

import random

import pytest

from epp.sim import blocks, core, profiles


class TwoPass(core.Engine):
    """The reference: three passes over the scheduled requests, as vLLM's code reads."""

    def step(self, now: float) -> core.StepResult:
        prof, pool = self.profile, self._pool
        bs = prof.block_size
        budget = prof.max_num_batched_tokens
        running = self._running
        scheduled: list[core.EngineRequest] = []
        counts: list[int] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_tokens - req._num_computed, budget)
            need = (req._num_computed + n + bs - 1) // bs - len(req._blocks)
            while need > pool.num_free:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if req._state != core._RUNNING:
                break
            self._give(req, n, need)
            scheduled.append(req)
            counts.append(n)
            budget -= n
            i += 1
        if not preempted:
            waiting = self._waiting
            while waiting and budget > 0 and len(running) < prof.max_num_seqs:
                req = waiting[0]
                total = req.num_tokens
                hit = pool.lookup(req._digests, (total - 1) // bs)
                computed = len(hit) * bs
                n = min(total - computed, budget)
                need = (computed + n + bs - 1) // bs - len(hit)
                # The whole sequence must fit (vLLM's scheduler_reserve_full_isl).
                if (total + bs - 1) // bs - len(hit) + sum(1 for b in hit if b.ref == 0) > pool.num_free:
                    break
                waiting.popleft()
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = now
                pool.touch(hit)
                req._blocks, req._num_computed, req._num_cached_blocks = hit, computed, len(hit)
                if req.num_preemptions == 0:
                    req.num_cached_tokens = computed
                    self.prefix_cache_queries += total
                    self.prefix_cache_hits += computed
                req._state = core._RUNNING
                running.append(req)
                self._give(req, n, need)
                scheduled.append(req)
                counts.append(n)
                budget -= n
        prefill_tokens = prefill_pairs = decode_seqs = decode_context = 0
        for req, n in zip(scheduled, counts, strict=True):
            c = req._num_computed
            if n == 1 and c >= len(req.prompt_token_ids):
                decode_seqs += 1
                decode_context += c + 1
            else:
                prefill_tokens += n
                prefill_pairs += n * c + n * (n + 1) // 2
        busy = scheduled or self.has_unfinished()
        duration = prof.step_time(prefill_tokens, prefill_pairs, decode_seqs, decode_context) if busy else 0.0
        end = now + duration
        self.num_steps += 1
        self.prompt_tokens_total += prefill_tokens
        first: list[core.EngineRequest] = []
        done: list[core.EngineRequest] = []
        for req, n in zip(scheduled, counts, strict=True):
            req._num_computed += n
            if req._num_computed < req.num_tokens:
                continue
            k = req.num_output_tokens
            script = req._script
            req.output_token_ids.append(
                script[k] if script is not None and k < len(script) else core.default_output_token(k)
            )
            req.num_output_tokens = k + 1
            self.generation_tokens_total += 1
            if req.first_token_time is None:
                req.first_token_time = end
                first.append(req)
            if k + 1 >= req.max_tokens:
                req.finish_time = end
                done.append(req)
            elif req.num_tokens % bs == 0:
                blocks.extend_digests(
                    req._digests, req._tokens, bs, lora_name=req.lora_name, cache_salt=req.cache_salt
                )
        for req in done:
            del self._requests[req.request_id]
            self._release(req)
        self._running = [r for r in self._running if r._state == core._RUNNING]
        return core.StepResult(duration, first, done, prefill_tokens, decode_seqs)

    def _give(self, req: core.EngineRequest, n: int, need: int) -> None:
        if need > 0:
            req._blocks += self._pool.allocate(need)
        full = (req._num_computed + n) // self.profile.block_size
        if full > req._num_cached_blocks:
            self._pool.cache(
                req._blocks,
                req._digests,
                req._tokens,
                lora_id=req.lora_id,
                lora_name=req.lora_name,
                cache_salt=req.cache_salt,
                start=req._num_cached_blocks,
                end=full,
            )
            req._num_cached_blocks = full


def _trace(engine_type: type[core.Engine], prof: profiles.Profile, seed: int) -> list[object]:
    """Everything observable about a random load with shared prefixes, run step by step."""
    rnd = random.Random(seed)
    prefixes = [[rnd.randrange(1, 30_000) for _ in range(rnd.randint(40, 300))] for _ in range(4)]
    arrivals: list[tuple[float, core.EngineRequest]] = []
    t = 0.0
    for i in range(120):
        t += rnd.expovariate(30.0)
        out = rnd.randint(1, 80)
        prompt = [*rnd.choice(prefixes), *(rnd.randrange(1, 30_000) for _ in range(rnd.randint(1, 40)))]
        prompt = prompt[: prof.max_model_len - out]
        script = [rnd.randrange(1, 30_000) for _ in range(rnd.randint(0, out))]
        lora = "adapter" if rnd.random() < 0.1 else None
        req = core.EngineRequest(
            f"r{i}", prompt, out, output_token_ids=script if rnd.random() < 0.3 else None, lora_name=lora
        )
        arrivals.append((t, req))
    engine = engine_type(prof, record_events=True)
    out_trace: list[object] = []
    now, i = 0.0, 0
    while i < len(arrivals) or engine.has_unfinished():
        while i < len(arrivals) and arrivals[i][0] <= now:
            engine.add_request(arrivals[i][1], arrivals[i][0])
            i += 1
        if not engine.has_unfinished():
            now = arrivals[i][0]
            continue
        res = engine.step(now)
        now += res.duration
        out_trace.append(
            (
                res.duration,
                [r.request_id for r in res.first_tokens],
                [r.request_id for r in res.finished],
                res.num_prefill_tokens,
                res.num_decode_seqs,
                engine.num_running,
                engine.num_waiting,
                engine.num_free_blocks,
                engine.take_events(),
            )
        )
    for _, r in arrivals:
        out_trace.append(
            (r.first_token_time, r.finish_time, r.num_cached_tokens, r.num_preemptions, r.output_token_ids)
        )
    out_trace.append(engine.snapshot())
    return out_trace


@pytest.mark.parametrize(
    ("block_size", "num_blocks", "budget", "seqs"),
    [(32, 40, 2048, 128), (32, 30, 256, 12), (16, 70, 128, 16), (4, 200, 64, 8)],
)
def test_one_pass_step_equals_the_two_pass_reference(
    block_size: int, num_blocks: int, budget: int, seqs: int
) -> None:
    prof = profiles.get_profile("tiny").replace(
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        max_model_len=min(1024, block_size * (num_blocks - 1)),
    )
    fast, ref = _trace(core.Engine, prof, block_size), _trace(TwoPass, prof, block_size)
    assert fast == ref
    assert ref[-1]["preemptions"] > 0  # type: ignore[index]  # the load does exercise preemption
