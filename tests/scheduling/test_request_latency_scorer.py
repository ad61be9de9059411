"""request-latency-scorer: the step model learned from the pods' own per-token times, decode load
and the slowdown imposed on others deciding a pick that TTFT alone gets wrong, hot prefixes
replicated, term-by-term explain, the default configuration, and bad parameters."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import request_latency_scorer as mod
from epp.scheduling.plugins.step_model import StepModel

from . import builders, fleet
from .fleet import Clock, feed, toks
from .fleet import clock as clock  # the fixture

CONFIG = Path(mod.__file__).parent.parent / "default-precise-config.yaml"


def request(tokens: list[int], *, max_tokens: int | None = 200, rid: str = "r") -> InferenceRequest:
    req = builders.request(target_model="m")
    req.request_id = rid
    req.token_ids = tokens
    req.prompt_tokens_estimate = len(tokens)
    req.max_output_tokens = max_tokens
    return req


class Stack(fleet.Stack):
    """precise-prefix-cache-scorer (weight 0) and one latency-pricing scorer, as the default config."""

    def __init__(self, kind: str = "request-latency-scorer", **params: Any) -> None:
        super().__init__(kind, "lat", **params)


def teach(model: StepModel, a: float, b: float, c: float, n: int = 200) -> None:
    rng = random.Random(3)
    for _ in range(n):
        batch = rng.uniform(1, 40)
        ctx = batch * rng.uniform(500, 6000)
        model.observe(batch, ctx, a + b * batch + c * ctx)


# --- the step model ------------------------------------------------------------------------------


def test_the_step_model_learns_the_roofline_terms() -> None:
    model = StepModel(0.02, 0.999)
    assert model.coefficients == (0.02, 0.0, 0.0)  # the prior: a lightly loaded pod's step
    teach(model, 0.018, 2e-4, 4.7e-7)
    a, b, c = model.coefficients
    assert a == pytest.approx(0.018, rel=0.05)
    assert b == pytest.approx(2e-4, rel=0.05)
    assert c == pytest.approx(4.7e-7, rel=0.05)
    assert model.step(25, 125_000) == pytest.approx(0.018 + 25 * 2e-4 + 125_000 * 4.7e-7, rel=0.02)


def test_a_negative_fit_is_never_a_reward_for_a_bigger_batch() -> None:
    model = StepModel(0.02, 0.999)
    teach(model, 0.05, -1e-3, -1e-7)  # nonsense data: bigger batches faster
    _, b, c = model.coefficients
    assert b == 0.0 and c == 0.0


# --- who wins when -------------------------------------------------------------------------------


def _load_holder(s: Stack, eps: list[Endpoint], holder: int, prompt: list[int], n: int) -> None:
    """`n` requests of 4,000-token prompts in flight on eps[holder], which also holds `prompt`."""
    for i in range(n):
        s.route(request(toks(4000, start=100_000 * (i + 1)), rid=f"bg{i}"), [eps[holder]])
    feed(s.index, eps[holder].name, prompt)


def test_a_busy_decoder_loses_a_hit_that_ttft_alone_would_send_there(clock: Clock) -> None:
    eps = builders.pool(2)
    prompt = toks(2000, start=1)
    ttft_only = Stack("predicted-ttft-scorer")
    latency = Stack()
    teach(latency.scorer.step_model, 0.018, 0.0, 4.7e-7)
    for s in (ttft_only, latency):
        _load_holder(s, eps, 1, prompt, 30)
        clock.now += 10.0  # their prefills drained: only their decode remains
    # TTFT: a hit on pod-1 beats a 2,000-token miss on idle pod-0.
    scores, _ = ttft_only.score(request(prompt), eps)
    assert scores[1] > scores[0]
    # Whole request: 30 sequences of ~4,100 tokens make every pod-1 step ~60 ms slower; 200
    # tokens there cost seconds, against a 0.2 s prefill on pod-0.
    scores, cycle = latency.score(request(prompt), eps)
    assert scores[0] > scores[1]
    facts = latency.scorer.explain(cycle)["endpoints"]
    assert facts["pod-1"]["batch"] == 30 and facts["pod-0"]["batch"] == 0
    assert facts["pod-1"]["step_s"] > facts["pod-0"]["step_s"] + 0.05


def test_at_equal_load_the_hit_still_wins(clock: Clock) -> None:
    eps = builders.pool(2)
    prompt = toks(2000, start=1)
    s = Stack()
    teach(s.scorer.step_model, 0.018, 0.0, 4.7e-7)
    _load_holder(s, eps, 0, toks(16, start=7_000_000), 3)
    _load_holder(s, eps, 1, prompt, 3)
    clock.now += 10.0
    scores, _ = s.score(request(prompt), eps)
    assert scores[1] > scores[0]


def test_the_slowdown_on_others_and_the_prefill_stall_are_priced(clock: Clock) -> None:
    """Two endpoints with the same batch: the one whose running sequences a long prefill would
    stall costs more by that stall; the slowdown term is n x overlap x the step's increase."""
    eps = builders.pool(1)
    s = Stack(meanOutputTokens=100, ttftWeight=3)
    teach(s.scorer.step_model, 0.02, 1e-3, 1e-7)
    for i in range(10):
        s.route(request(toks(1000, start=10_000 * (i + 1)), max_tokens=100, rid=f"bg{i}"), eps)
    clock.now += 10.0
    eps[0].metrics.running, eps[0].metrics.waiting = 10, 0
    _, cycle = s.score(request(toks(3000, start=1), max_tokens=100), eps)
    row = s.scorer.explain(cycle)["endpoints"]["pod-0"]
    a, b, c = s.scorer.step_model.coefficients
    size = 3000 + 50  # prompt + half its expected output
    ctx = 10 * (1000 + 50)
    assert row["context_tokens"] == pytest.approx(ctx)
    assert row["step_s"] == pytest.approx(a + b * 11 + c * (ctx + size))
    assert row["decode_s"] == pytest.approx(100 * row["step_s"])
    # overlap: min(100 of its own, half the mean output of 100) = 50 steps
    assert row["slowdown_others_s"] == pytest.approx(10 * 50 * (b + c * size))
    assert row["prefill_stall_others_s"] == pytest.approx(10 * row["prefill_s"])
    half = Stack(meanOutputTokens=100, ttftWeight=3, stallWeight=0.5)
    teach(half.scorer.step_model, 0.02, 1e-3, 1e-7)
    for i in range(10):
        half.route(request(toks(1000, start=10_000 * (i + 1)), max_tokens=100, rid=f"bg{i}"), eps)
    _, cycle = half.score(request(toks(3000, start=1), max_tokens=100), eps)
    halved = half.scorer.explain(cycle)["endpoints"]["pod-0"]["prefill_stall_others_s"]
    assert halved == pytest.approx(0.5 * row["prefill_stall_others_s"])
    assert row["objective_s"] == pytest.approx(
        3 * row["ttft_objective_s"]
        + row["decode_s"]
        + row["slowdown_others_s"]
        + row["prefill_stall_others_s"]
    )
    parts = row["overhead_s"] + row["queue_s"] + row["prefill_s"] + row["kv_price_s"] + row["miss_penalty_s"]
    assert row["ttft_objective_s"] == pytest.approx(parts)
    assert row["e2e_s"] == pytest.approx(row["predicted_ttft_s"] + row["decode_s"])


def test_a_hot_prefix_is_replicated_once_its_holders_decode_slowly(clock: Clock) -> None:
    """One prefix takes all the traffic and nothing completes: the whole-request price spreads it
    over the fleet as its holders' batches grow; priced for the first token only (decode and
    others' terms off), it stays on fewer pods."""
    eps = builders.pool(6)
    prefix = toks(3000, start=1)
    used: dict[str, int] = {}
    for weights in ((1.0, 1.0), (0.0, 0.0)):
        s = Stack(decodeWeight=weights[0], othersWeight=weights[1], popularityWindowSeconds=0)
        teach(s.scorer.step_model, 0.018, 0.0, 4.7e-7)
        holders = set()
        for i in range(60):
            clock.now += 0.2
            pick = s.route(request([*prefix, *toks(300, start=1_000_000 * (i + 1))], rid=f"h{i}"), eps)
            if pick.name not in holders:
                holders.add(pick.name)
                feed(s.index, pick.name, prefix)
        used[str(weights)] = len(holders)
    assert used["(1.0, 1.0)"] >= 5
    assert used["(0.0, 0.0)"] <= 2


@pytest.mark.parametrize(
    ("queued", "ahead"),
    [
        ((16, 4_000), "a prefill queued on pod-1 only: 0.4 s, twice the first token on pod-0"),
        ((300_000, 360_000), "past capacity: 30 s queued on pod-0, 36 s on pod-1"),
    ],
)
def test_an_unseen_prompt_is_not_sent_home_behind_a_longer_queue(
    clock: Clock, queued: tuple[int, int], ahead: str
) -> None:
    """A prompt no pod holds goes to its rendezvous home only among the pods within 20% of its
    own first token (0.21 s here) of the best: 20% of the whole objective (20 s of its own decode
    and 4x the TTFT with its queue) would admit pod-1 in both cases, and send half of the
    prompts, by their hash, behind the longer queue."""
    eps = builders.pool(2)

    def stack(tokens: tuple[int, int]) -> Stack:
        s = Stack(ttftWeight=4)
        for i, n in enumerate(tokens):  # one request each: the same recent traffic
            s.route(request(toks(n, start=10_000_000 * (i + 1)), rid=f"q{i}"), [eps[i]])
        return s

    idle, busy = stack((16, 16)), stack(queued)
    homes = set()
    for i in range(40):
        prompt = toks(2000, start=10_000 * (i + 1))
        _, cycle = idle.score(request(prompt, max_tokens=1000), eps)
        homes.add(cycle["lat"].home)  # pods alike: the hash spreads homes over both
        scores, cycle = busy.score(request(prompt, max_tokens=1000), eps)
        assert scores[0] > scores[1], ahead
        facts = busy.scorer.explain(cycle)
        assert facts["request"]["ttft_home"] == "pod-0"
        rows = facts["endpoints"]
        own = rows["pod-0"]["overhead_s"] + rows["pod-0"]["prefill_s"]
        assert rows["pod-1"]["objective_s"] - rows["pod-0"]["objective_s"] > 0.2 * 4 * own
        assert rows["pod-1"]["objective_s"] < 1.2 * rows["pod-0"]["objective_s"]  # within 20% of it
    assert homes == {"pod-0", "pod-1"}


@pytest.mark.parametrize(("share", "on_idle"), [(0.5, 2), (1e9, 4)])
def test_prompts_nobody_holds_do_not_queue_on_an_idle_pod_behind_each_other(
    clock: Clock, share: float, on_idle: int
) -> None:
    """rolling-restart's herd: pod-2 is back from a restart, idle; pods 0 and 1 decode 12 streams
    each. A 3000-token prompt no pod holds stalls those streams for its prefill (~0.37 s each), so
    the objective prefers queueing it on pod-2 behind the others' prefills: without
    `homeWaitShare` four of them, 20 ms apart, all go there (the fourth behind ~0.9 s). With it
    (0.5), a home is no pod where a prompt waits more than half its own prefill, and more than
    `homeSlackSeconds` beyond the least wait: the second and third go to the busy pods, the
    fourth, with a queue on every pod, to the shortest."""
    eps = builders.pool(3)
    for ep in eps[:2]:
        ep.metrics.running = 12
    s = Stack(ttftWeight=4, homeWaitShare=share)
    picks = []
    for i in range(4):
        clock.now += 0.02
        prompt = toks(3000, start=1_000_000 * (i + 1))
        picks.append(s.route(request(prompt, rid=f"c{i}"), eps).name)
    assert picks[0] == "pod-2"
    assert picks.count("pod-2") == on_idle, picks
    if on_idle < 4:
        assert picks[1:3] in (["pod-0", "pod-1"], ["pod-1", "pod-0"]), picks
    # Explain names the pods where the next one would queue: pod-2, two prefills deep, with the rule.
    _, cycle = s.score(request(toks(3000, start=9_000_000), rid="c5"), eps)
    queued = s.scorer.explain(cycle)["request"].get("ttft_home_queued", [])
    assert ("pod-2" in queued) == (on_idle < 4), queued


def test_a_queue_waiting_for_kv_blocks_drains_at_the_decode_rate(clock: Clock) -> None:
    """Past the KV soft limit, waiting requests are admitted as running ones finish: the wait is
    waiting x the mean decode time / running, which a prefill-rate queue estimate misses."""
    eps = builders.pool(2)
    s = Stack()
    full = eps[1].metrics
    full.waiting, full.running, full.kv_usage, full.num_gpu_blocks = 6, 12, 0.97, 1000
    _, cycle = s.score(request(toks(500, start=1)), eps)
    rows = s.scorer.explain(cycle)["endpoints"]
    decode_s = s.scorer.decode_seconds  # the prior, 5 s
    assert rows["pod-1"]["admission_wait_s"] == pytest.approx(6 * decode_s / 12)
    assert rows["pod-0"]["admission_wait_s"] == 0.0
    assert rows["pod-1"]["e2e_s"] == pytest.approx(
        rows["pod-1"]["predicted_ttft_s"] + rows["pod-1"]["admission_wait_s"] + rows["pod-1"]["decode_s"]
    )
    # Below the soft limit the same queue is priced as prefill work only.
    full.kv_usage = 0.5
    _, cycle = s.score(request(toks(500, start=1)), eps)
    assert s.scorer.explain(cycle)["endpoints"]["pod-1"]["admission_wait_s"] == 0.0


# --- learning ------------------------------------------------------------------------------------


def test_the_step_model_is_learned_from_completed_responses(clock: Clock) -> None:
    """Responses whose time per output token is 10 ms + 1 us per context token of their pod's
    batch teach the scorer that context costs (a, c), and the output ratio of max_tokens."""
    eps = builders.pool(1)
    s = Stack()
    rng = random.Random(1)
    flying: list[tuple[InferenceRequest, float]] = []
    for i in range(400):
        req = request(toks(rng.randint(500, 4000), start=10_000 * i), max_tokens=100, rid=f"q{i}")
        s.route(req, eps)
        flying.append((req, clock.now))
        clock.now += 0.05
        if len(flying) > rng.randint(2, 12):
            done, start = flying.pop(0)
            load = s.scorer._loads[eps[0].name]
            mine = s.scorer._active[id(done)]
            span = clock.now - start
            # The pod's step at the context it had on average over the request's life.
            area = load.area_ctx + load.ctx * (clock.now - load.at) - mine.area_ctx
            tpot = 0.01 + 1e-6 * area / span
            s.scorer.response_complete(
                done,
                interfaces.RequestOutcome(
                    endpoint=eps[0],
                    status=200,
                    ok=True,
                    completion_tokens=50,
                    ttft_s=span - 49 * tpot,
                    duration_s=span,
                ),
            )
    model = s.scorer.step_model
    assert model.seen > 300
    a, _, c = model.coefficients
    assert c == pytest.approx(1e-6, rel=0.35)
    assert a == pytest.approx(0.01, abs=0.006)
    assert s.scorer.expected_output(request(toks(10), max_tokens=100)) == pytest.approx(50, rel=0.05)


def test_failed_responses_and_unknown_requests_teach_nothing(clock: Clock) -> None:
    eps = builders.pool(1)
    s = Stack()
    req = request(toks(100))
    s.route(req, eps)
    clock.now += 1.0
    s.scorer.response_complete(req, interfaces.RequestOutcome(endpoint=eps[0], status=500, ok=False))
    s.scorer.response_complete(request(toks(100), rid="x"), interfaces.RequestOutcome(endpoint=eps[0]))
    assert s.scorer.step_model.seen == 0
    assert s.scorer._loads[eps[0].name].n == 0  # the failed one is released all the same


# --- configuration -------------------------------------------------------------------------------


def test_the_default_config_with_kv_events_prices_the_whole_request(clock: Clock) -> None:
    cfg, eps = fleet.configured(CONFIG, toks(640))
    assert cfg.warnings == []
    assert [p.name for p in cfg.response_complete] == ["request-latency-scorer"]
    result = cfg.scheduler.schedule(request(toks(640)), eps, explain=True)
    assert result.targets[0].name == "10.0.0.2:8000"
    facts = result.profiles["default"].facts
    row = facts["endpoints"]["10.0.0.2:8000"]
    assert {"e2e_s", "decode_s", "step_s", "slowdown_others_s", "prefill_stall_others_s"} <= set(row)
    assert facts["request"]["step_model"]["observations"] == 0


@pytest.mark.parametrize(("running", "near_tie"), [(140, True), (180, False)])
def test_the_default_config_keeps_a_request_on_the_pod_holding_the_prompt(
    clock: Clock, running: int, near_tie: bool
) -> None:
    """The holder decodes `running` sequences: at 140 a full miss on an idle pod is better by ~2% of
    the objective (within the default's 5%: the request stays), at 180 by ~12%: the request stays
    too, and the pod it would have moved to is pre-warmed with the prompt's blocks."""
    cfg, eps = fleet.configured(CONFIG, toks(2000))
    holder = eps[1]
    holder.metrics.running = running
    holder.metrics.updated_at = 1.0
    result = cfg.scheduler.schedule(request(toks(2000)), eps, explain=True)
    facts = result.profiles["default"].facts
    objective = {name: row["objective_s"] for name, row in facts["endpoints"].items()}
    gain = objective[holder.hostport] / min(objective.values())
    assert 1.0 < gain < 1.05 if near_tie else gain > 1.05
    assert result.targets[0].name == holder.hostport
    assert (facts["request"].get("ttft_holder") == holder.hostport) is near_tie
    prewarmed = facts["request"].get("prewarm")
    if near_tie:
        assert prewarmed is None
    else:
        best = min(objective, key=objective.__getitem__)
        assert prewarmed == {"endpoint": best, "tokens": 1984}


@pytest.mark.parametrize(
    ("params", "culprit"),
    [
        ({"stepSeconds": 0}, "stepSeconds"),
        ({"decodeWeight": -1}, "decodeWeight"),
        ({"othersWeight": float("inf")}, "othersWeight"),
        ({"stallWeight": -0.5}, "stallWeight"),
        ({"tpotForgetting": 0.5}, "tpotForgetting"),
        ({"meanOutputTokens": 0}, "meanOutputTokens"),
        ({"missPenalty": -1}, "missPenalty"),  # predicted-ttft-scorer's parameters are checked too
        ({"decodeWeigth": 1}, "decodeWeigth"),
    ],
)
def test_bad_parameters_are_config_errors_naming_the_parameter(params: dict[str, Any], culprit: str) -> None:
    with pytest.raises(registry.ConfigError, match=culprit):
        builders.plugin("request-latency-scorer", params, name="lat")
