"""Pre-warms in fast mode: the planned one-token completions run in the simulated pods (their
prefill work, their KV events), no client's figures count them, and the requests the objective
moves off their prefix's holder stay there instead."""

from __future__ import annotations

import re
from pathlib import Path

from epp.bench import hard, report
from epp.bench.fast import START, FastRun
from epp.bench.fast_prewarm import EnginePrewarmer
from epp.bench.policies import config_file
from epp.bench.records import RunResult
from epp.bench.workload import Fleet
from epp.scheduling import config as sched_config
from epp.sim.profiles import get_profile

A100 = get_profile("codellama-13b-a100")
FLEET = Fleet(8, A100.num_gpu_blocks * A100.block_size, A100.max_model_len)


def run(tmp_path: Path, prewarm: bool, *, bound: int = 16) -> tuple[FastRun, RunResult]:
    text = sched_config.default_config_text(precise=True)
    text, n = re.subn(r"^(\s+)prewarm: \w+$", rf"\1prewarm: {str(prewarm).lower()}", text, flags=re.M)
    assert n == 1  # the default config names it
    path = tmp_path / f"prewarm-{prewarm}.yaml"
    path.write_text(text)
    # bursty: tenants' bursts load their prefix's holders until the objective moves requests off.
    wl = hard.BurstyTenants(seed=1, scale=0.3, fleet=FLEET)
    r = FastRun(wl, config_file(str(path)), profile=A100, pods=8, seed=1)
    r.prewarms = r.director.prewarmer = EnginePrewarmer(
        r.engines, r._pod_of, r.wake, max_inflight=bound, group_of=r._routing_groups.get, start=START
    )
    return r, r.run()


def moved(result: RunResult) -> int:
    """Requests sent where less than half of what the best holder held was cached."""
    return sum(1 for x in result.records if x.held_best > 0 and x.held_chosen < 0.5 * x.held_best)


def test_prewarms_run_in_the_pods_and_replace_the_moves(tmp_path: Path) -> None:
    off_run, off = run(tmp_path, False)
    on_run, on = run(tmp_path, True)
    assert off_run.prewarms.sent == 0 and moved(off) > 0
    assert on_run.prewarms.sent > 0
    assert moved(on) < moved(off) / 4
    for r, result in ((off_run, off), (on_run, on)):
        assert not result.stopped_early
        assert all(x.status == 200 and x.first_token is not None for x in result.records)
        assert all(ep.inflight_requests == 0 and ep.prefill_tokens == 0 for ep in r.endpoints)
    # The same requests, each counted once; the pre-warms are in no record.
    assert len(on.records) == len(off.records)
    # They ran: the fleet computed more prompt tokens than the requests' own uncached ones.
    computed = sum(e.prompt_tokens_total for e in on_run.engines)
    own = sum(x.prompt_tokens - x.cached_tokens for x in on.records)
    assert computed > own
    # Each is logged with the group of the request it was planned for, and later requests of
    # those groups found the copies.
    assert on.prewarm_log is not None and len(on.prewarm_log) == on_run.prewarms.sent
    assert {w.group for w in on.prewarm_log} <= {x.group for x in on.records} - {""}
    used = report.summarize(on, [])
    assert 0.5 < used["prewarms_used"] <= 1.0 and used["requests_per_prewarm"] > 1.0
    assert 0.0 < used["prewarm_token_share"] < 0.1
    assert report.summarize(off, [])["prewarm_token_share"] == 0.0


def test_a_prewarm_held_back_leaves_its_request_on_the_holder(tmp_path: Path) -> None:
    """One pre-warm at a time per pod: a plan for a pod computing one waits, and its request stays
    on the holder rather than queueing its cold prefill behind that copy. Moved instead, such
    requests stacked cold prompts onto a pod just back from a restart (BENCHMARKS.md#prewarm)."""
    r, result = run(tmp_path, True)
    assert r.prewarms.held_back > 0
    assert moved(result) == 0


def test_a_prewarm_the_sender_cannot_send_becomes_the_move_it_replaced(tmp_path: Path) -> None:
    """With no room to send (bound 0) the Director turns every plan back into its move before the
    plugins book anything: the run is the run without pre-warms, request for request."""
    _, off = run(tmp_path, False)
    r, result = run(tmp_path, True, bound=0)
    assert r.prewarms.sent == 0 and result.prewarms == 0
    assert [(x.pod, x.cached_tokens, x.first_token, x.finish) for x in result.records] == [
        (x.pod, x.cached_tokens, x.first_token, x.finish) for x in off.records
    ]
