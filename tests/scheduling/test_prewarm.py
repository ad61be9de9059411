"""Pre-warms (epp.scheduling.prewarm): a move off the pod holding the prompt becomes a stay there
plus a pre-warm of the pod the objective chose, booked by both scorers of the default config."""

from __future__ import annotations

import random
from typing import Any

import pytest

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces, prewarm, registry

from . import builders, fleet
from .fleet import Clock, feed, toks
from .fleet import clock as clock  # the fixture
from .test_request_latency_scorer import request, teach


class Stack(fleet.Stack):
    """The default config's pair: precise-prefix-cache-scorer (weight 0), request-latency-scorer."""

    def __init__(self, **params: Any) -> None:
        super().__init__("request-latency-scorer", "lat", **params)

    def decide(
        self, req: InferenceRequest, eps: list[Endpoint]
    ) -> tuple[Endpoint, interfaces.SchedulingResult]:
        """Score, pick the best, run both pre-request hooks on a result that carries the cycle."""
        scores, cycle = self.score(req, eps)
        best = max(scores)
        pick = random.choice([ep for ep, s in zip(eps, scores, strict=True) if s == best])
        result = interfaces.SchedulingResult(
            "default", {"default": interfaces.ProfileResult("default", [pick])}, cycle
        )
        self.precise.pre_request(req, result)
        self.scorer.pre_request(req, result)
        return pick, result


def busy_holder(s: Stack, eps: list[Endpoint], prompt: list[int], clock: Clock) -> None:
    """eps[1] holds `prompt` and decodes 30 long sequences; eps[0] is idle: the whole-request
    objective prefers a miss on eps[0] (test_request_latency_scorer's busy decoder)."""
    teach(s.scorer.step_model, 0.018, 0.0, 4.7e-7)
    for i in range(30):
        s.route(request(toks(4000, start=100_000 * (i + 1)), rid=f"bg{i}"), [eps[1]])
    feed(s.index, eps[1].name, prompt)
    clock.now += 10.0  # their prefills drained: only their decode remains


def test_without_prewarm_the_request_moves_off_the_busy_holder(clock: Clock) -> None:
    eps = builders.pool(2)
    prompt = toks(2000, start=1)
    s = Stack()
    busy_holder(s, eps, prompt, clock)
    pick, result = s.decide(request(prompt), eps)
    assert pick is eps[0] and prewarm.planned(result) is None


def test_a_move_becomes_a_stay_on_the_holder_and_a_prewarm_of_the_chosen_pod(clock: Clock) -> None:
    eps = builders.pool(2)
    prompt = toks(2000, start=1)
    s = Stack(prewarm=True)
    busy_holder(s, eps, prompt, clock)
    _, before = s.score(request(toks(16, start=9_000_000)), eps)
    queue_before = before["lat"].predictions["pod-0"][2]
    pick, result = s.decide(request(prompt, rid="moved"), eps)
    assert pick is eps[1]  # stays where its prefix is
    warmup = prewarm.planned(result)
    # The holder has the prompt's 125 blocks but the last token (vLLM computes at least one):
    # the pre-warm covers the whole blocks of what it holds.
    assert warmup == prewarm.Warmup(eps[0], "pod-1", 1984)
    facts = s.scorer.explain(result.cycle)["request"]
    assert facts["prewarm"] == {"endpoint": "pod-0", "tokens": 1984}
    # Booked as a routed prefill: pod-0's fluid queue grows by the pre-warm's ~0.2 s...
    _, after = s.score(request(toks(16, start=9_000_000)), eps)
    assert after["lat"].predictions["pod-0"][2] == pytest.approx(queue_before + 1984e-4, rel=0.05)
    # ...and the prompt's next request finds pod-0 holding it (speculative entries, until the
    # pre-warm's own KV events confirm them).
    s.score(request(prompt, rid="next"), eps)
    _, cycle = s.score(request(prompt, rid="next"), eps)
    match = cycle["precise-prefix-cache-scorer"]
    assert match.matches["pod-0"].blocks == 1984 // 16 and "pod-0" in match.speculative


def test_no_prewarm_when_the_holder_holds_little_more_than_the_chosen_pod(clock: Clock) -> None:
    eps = builders.pool(2)
    prompt = toks(2000, start=1)
    s = Stack(prewarm=True, prewarmMinShare=1.0)  # it holds 99%, not all
    busy_holder(s, eps, prompt, clock)
    pick, result = s.decide(request(prompt), eps)
    assert pick is eps[0] and prewarm.planned(result) is None


@pytest.mark.parametrize(("share", "planned"), [(None, True), (0.5, False)])
def test_by_default_a_quarter_of_the_prompt_more_on_the_holder_is_enough(
    clock: Clock, share: float | None, planned: bool
) -> None:
    """The chosen pod holds the prompt's first 1,200 tokens, the holder 1,984: 39% of the prompt
    more, which the default (0.25) pre-warms (as a conversation's history on top of its system
    prompt: BENCHMARKS.md#prewarm, chat) and 0.5 leaves to the move."""
    eps = builders.pool(2)
    prompt = toks(2000, start=1)
    s = Stack(prewarm=True) if share is None else Stack(prewarm=True, prewarmMinShare=share)
    busy_holder(s, eps, prompt, clock)
    feed(s.index, eps[0].name, prompt[:1200])
    pick, result = s.decide(request(prompt), eps)
    if planned:
        assert pick is eps[1] and prewarm.planned(result) == prewarm.Warmup(eps[0], "pod-1", 1984)
    else:
        assert pick is eps[0] and prewarm.planned(result) is None


def test_a_prewarm_not_sent_moves_its_request_only_where_latency_targets_hold(clock: Clock) -> None:
    """With latency targets, a pre-warm the Director cannot send moves its request where the
    scorer prefers without the plan: here it stays on the holder, the one pod predicted to meet
    the request's TTFT target. Moved to the objective's favourite, as before, requests piled
    cold prompts onto a pod just back from a restart (rolling-restart: 1.5-2.6 s first tokens
    against a 1 s target other pods met)."""
    eps = builders.pool(2)
    prompt = toks(2000, start=1)
    s = Stack(prewarm=True)
    busy_holder(s, eps, prompt, clock)
    clock.now += 3.0  # pod-1's queue of prefills gone too
    req = request(prompt, rid="targeted")
    req.slo_ttft = 0.1  # pod-0 computes the 2,000 tokens in ~0.2 s; pod-1 holds them
    pick, result = s.decide(req, eps)
    facts = s.scorer.explain(result.cycle)
    assert facts["request"]["slo"]["meeting"] == ["pod-1"]
    objective = {name: row["objective_s"] for name, row in facts["endpoints"].items()}
    assert objective["pod-0"] < objective["pod-1"]  # the objective alone would move it
    warmup = prewarm.planned(result)
    assert pick is eps[1] and warmup == prewarm.Warmup(eps[0], "pod-1", 1984, move_to=eps[1])
    prewarm.move(result, warmup)  # what the Director does with a plan it cannot send
    assert result.targets == [eps[1]]
    assert prewarm.planned(result) is None


def test_a_plan_holds_only_where_the_request_went_as_planned(clock: Clock) -> None:
    eps = builders.pool(2)
    plan = prewarm.Warmup(eps[0], "pod-1", 64)

    def result(pick: Endpoint, **extra: Any) -> interfaces.SchedulingResult:
        profiles = {"default": interfaces.ProfileResult("default", [pick])}
        return interfaces.SchedulingResult("default", profiles, {prewarm.KEY: plan}, **extra)

    assert prewarm.planned(result(eps[1])) == plan
    assert prewarm.planned(result(eps[0])) is None  # another picker decided otherwise
    assert prewarm.planned(result(eps[1], stages={"prefill": [eps[0]]})) is None  # a split request
    unsent = result(eps[1])
    prewarm.move(unsent, plan)  # what the Director does with a plan it cannot send
    assert prewarm.planned(unsent) is None
    assert unsent.targets == [eps[0]]  # where the objective chose, alone as the picker's pick was
    eps3 = builders.pool(3)
    plan3 = prewarm.Warmup(eps3[0], "pod-1", 64)
    fallbacks = interfaces.SchedulingResult(
        "default", {"default": interfaces.ProfileResult("default", [eps3[1], eps3[2]])}, {prewarm.KEY: plan3}
    )
    prewarm.move(fallbacks, plan3)
    assert fallbacks.targets == [eps3[0], eps3[1]]  # a picker's two: the holder the first fallback


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_bad_prewarm_share_is_a_config_error(share: float) -> None:
    with pytest.raises(registry.ConfigError, match="prewarmMinShare"):
        Stack(prewarm=True, prewarmMinShare=share)
