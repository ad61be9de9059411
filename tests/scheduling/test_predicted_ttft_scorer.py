"""predicted-ttft-scorer: who wins when (cache vs queue vs decodes vs KV pressure), booking and
draining in virtual time, online learning of the prefill rate, explain facts, metrics and bad
parameters. Where it places prefixes (homes, copies): test_predicted_ttft_homes.py."""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

import pytest

from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Datastore, Endpoint
from epp.kvcache.events import BlockStored, EventBatch
from epp.observability import metrics
from epp.scheduling import interfaces, registry
from epp.scheduling.plugins import predicted_ttft_scorer as mod
from epp.sidecar.protocol import PREFILL_RESULT_HEADER

from . import builders, fleet

# `X as X`: re-exported, test_traffic_share and tests/rpc/test_explain import them from here
from .fleet import Clock as Clock
from .fleet import clock as clock  # the fixture
from .fleet import feed as feed
from .fleet import toks as toks

# epp's default with KV events before issue 18 (now request-latency-scorer's), kept as a bench policy.
CONFIG = Path(mod.__file__).parent.parent.parent / "bench" / "policies" / "epp-ttft.yaml"
RATE = 10000.0  # the default prior, tokens/s: 1e-4 s per token
_result = fleet.result  # the name test_traffic_share imports from here


def request(tokens: list[int] | None, *, rid: str = "r") -> InferenceRequest:
    req = builders.request(target_model="m")
    req.request_id = rid
    req.token_ids = tokens
    req.prompt_tokens_estimate = len(tokens or [])
    return req


class Stack(fleet.Stack):
    """The precise scorer (weight 0) and the TTFT scorer over one index, as default-precise-config.yaml."""

    def __init__(self, **params: Any) -> None:
        super().__init__("predicted-ttft-scorer", "ttft", **params)


def ttfts(stack: Stack, cycle: interfaces.CycleState) -> dict[str, float]:
    return {name: v[0] for name, v in cycle[stack.scorer.name].predictions.items()}


# --- who wins when ---------------------------------------------------------------------------


def test_idle_fleet_the_cache_holder_wins_by_its_saved_prefill(clock: Clock) -> None:
    s = Stack(missPenalty=0.0)
    prompt = toks(1000)
    feed(s.index, "pod-1", prompt[:800])  # 50 blocks
    scores, cycle = s.score(request(prompt), builders.pool(3))
    t = ttfts(s, cycle)
    # overhead 10 ms + uncached tokens at 1e-4 s: 1000 tokens -> 110 ms, 200 -> 30 ms.
    assert t["pod-0"] == pytest.approx(0.11) and t["pod-2"] == pytest.approx(0.11)
    assert t["pod-1"] == pytest.approx(0.03)
    assert scores == pytest.approx([0.03 / 0.11, 1.0, 0.03 / 0.11])


def test_a_queue_on_the_holder_sends_the_request_elsewhere_once_a_miss_is_faster(clock: Clock) -> None:
    s = Stack()
    prompt = toks(1000)
    feed(s.index, "pod-0", prompt)
    eps = builders.pool(2)
    # pod-0 holds the prompt's 62 full blocks (8 tokens left to compute) but has 0.6 s of other
    # misses queued: a full miss on idle pod-1 (0.11 s) is faster.
    picks = [s.route(request(toks(3000, start=10_000 * (i + 1))), [eps[0]]).name for i in range(2)]
    assert picks == ["pod-0", "pod-0"]  # 0.6 s of unrelated misses booked on pod-0
    _, cycle = s.score(request(prompt), eps)
    t = ttfts(s, cycle)
    assert t["pod-0"] == pytest.approx(0.01 + 0.6 + 8e-4)
    assert t["pod-1"] == pytest.approx(0.11)
    assert s.route(request(prompt), eps).name == "pod-1"


def test_the_fluid_queue_drains_with_virtual_time(clock: Clock) -> None:
    s = Stack()
    eps = builders.pool(1)
    s.route(request(toks(5000, start=1)), eps)  # 0.5 s of prefill booked
    _, cycle = s.score(request(toks(100, start=90_000)), eps)
    assert cycle["ttft"].predictions["pod-0"][2] == pytest.approx(0.5)
    clock.now += 0.3
    _, cycle = s.score(request(toks(100, start=90_000)), eps)
    assert cycle["ttft"].predictions["pod-0"][2] == pytest.approx(0.2)
    clock.now += 1.0
    _, cycle = s.score(request(toks(100, start=90_000)), eps)
    assert cycle["ttft"].predictions["pod-0"][2] == 0.0


def test_booking_needs_the_scored_request_and_books_only_the_primary(clock: Clock) -> None:
    s = Stack()
    eps = builders.pool(2)
    scored, other = request(toks(2000, start=1)), request(toks(2000, start=5))
    s.score(scored, eps)
    s.scorer.pre_request(other, _result(eps[0]))  # not the request scored last: nothing booked
    s.scorer.pre_request(scored, _result(eps[1]))
    s.scorer.pre_request(scored, _result(eps[1]))  # called twice: booked once
    _, cycle = s.score(request(toks(100, start=50_000)), eps)
    queues = {n: v[2] for n, v in cycle["ttft"].predictions.items()}
    assert queues == {"pod-0": 0.0, "pod-1": pytest.approx(0.2)}


def test_scraped_queue_depth_corrects_a_queue_epp_did_not_book(clock: Clock) -> None:
    s = Stack()
    eps = builders.pool(2)
    for i in range(40):  # learn the mean prefill a request brings: 1000 tokens
        s.route(request(toks(1000, start=100_000 * (i + 1))), eps)
    clock.now += 100.0  # all drained
    eps[0].metrics.waiting = 3  # another epp replica's requests
    _, cycle = s.score(request(toks(1000, start=7)), eps)
    q = {n: v[2] for n, v in cycle["ttft"].predictions.items()}
    assert q["pod-1"] == 0.0
    assert 0.25 < q["pod-0"] < 0.3  # 3 x ~1000 tokens (EWMA, not yet fully converged) x 1e-4 s


def test_running_decodes_slow_the_prefill(clock: Clock) -> None:
    s = Stack(decodeInterference=0.01)
    eps = builders.pool(2)
    eps[0].metrics.running = 50
    _, cycle = s.score(request(toks(1000, start=3)), eps)
    t = ttfts(s, cycle)
    assert t["pod-0"] == pytest.approx((0.01 + 0.1) * 1.5)  # a step and the prefill, both slowed
    assert t["pod-1"] == pytest.approx(0.11)
    # epp's own in-flight count (not yet scraped) counts too.
    eps[1].inflight_requests = 100
    _, cycle = s.score(request(toks(1000, start=3)), eps)
    assert ttfts(s, cycle)["pod-1"] == pytest.approx((0.01 + 0.1) * 2.0)


def test_kv_pressure_past_the_soft_limit_costs_part_of_a_decode(clock: Clock) -> None:
    s = Stack(decodeSeconds=5.0, kvSoftLimit=0.8)
    eps = builders.pool(3)
    for ep in eps:
        ep.metrics.num_gpu_blocks = 1000  # 16,000 tokens: the 1000-token miss fills 6.25%
    eps[0].metrics.kv_usage = 0.99
    eps[1].metrics.kv_usage = 0.5
    eps[2].metrics.kv_usage = 0.77  # below the limit, but not once its blocks are added
    scores, cycle = s.score(request(toks(1000, start=3)), eps)
    t = ttfts(s, cycle)
    assert t["pod-1"] == pytest.approx(0.11)
    assert t["pod-2"] == pytest.approx(0.11 + 5.0 * (0.77 + 0.0625 - 0.8) / 0.2)
    assert t["pod-0"] == pytest.approx(0.11 + 5.0 * 1.2625)
    assert scores[1] == 1.0 and scores[0] < scores[2] < 1.0
    # A hit needs no new blocks: the full pod is not penalised for it.
    feed(s.index, "pod-0", toks(1000, start=3))
    _, cycle = s.score(request(toks(1000, start=3)), eps)
    assert ttfts(s, cycle)["pod-0"] == pytest.approx(0.01 + 5.0 * (0.99 + 8 / 16000 - 0.8) / 0.2 + 8e-4)
    off = Stack(kvPressureWeight=0.0)
    _, cycle = off.score(request(toks(1000, start=3)), eps)
    assert ttfts(off, cycle)["pod-0"] == pytest.approx(0.11)


def test_a_split_requests_kv_counts_on_its_decode_pod_until_its_answer_starts(clock: Clock) -> None:
    # P/D: a split request books no prefill on its decode pod, but its whole prompt's KV lands
    # there after the transfer. Until then the pod's scraped KV usage does not show it, and a pod
    # that draws every split request's decode looked as empty as before (its queue too).
    s = Stack(decodeSeconds=5.0, kvSoftLimit=0.8)
    eps = builders.pool(2)
    for ep in eps:
        ep.metrics.num_gpu_blocks = 1000  # 16,000 tokens
        ep.metrics.kv_usage = 0.5
    split = request(toks(4000, start=1))
    s.score(split, eps)
    remote = interfaces.SchedulingResult(
        "decode",
        {"decode": interfaces.ProfileResult("decode", [eps[0]])},
        stages={"prefill": [eps[1]]},
    )
    s.scorer.pre_request(split, remote)
    _, cycle = s.score(request(toks(1000, start=50_000)), eps)
    terms = cycle["ttft"].terms
    assert terms["pod-0"].kv_price == pytest.approx(5.0 * (0.5 + 5000 / 16000 - 0.8) / 0.2)
    assert terms["pod-1"].kv_price == 0.0
    assert terms["pod-0"].queue_s == 0.0  # its prefill is the prefill pod's (book_prefill)
    # The decode pod's answer starts once the prefill pod has answered: the KV is there, and
    # its scraped usage shows it from then on.
    assert s.scorer.response_headers(split, remote, None, {":status": "200"}) == {}
    _, cycle = s.score(request(toks(1000, start=50_000)), eps)
    assert cycle["ttft"].terms["pod-0"].kv_price == 0.0
    s.scorer.response_complete(split, _outcome(eps[0], ttft=1.0, prompt=4000, cached=0))
    _, cycle = s.score(request(toks(1000, start=50_000)), eps)
    assert cycle["ttft"].terms["pod-0"].kv_price == 0.0  # counted off once
    # An answer that fails before its headers takes its KV off too.
    other = request(toks(4000, start=9000))
    s.score(other, eps)
    s.scorer.pre_request(other, remote)
    s.scorer.response_complete(other, interfaces.RequestOutcome(endpoint=eps[0], status=503))
    _, cycle = s.score(request(toks(1000, start=50_000)), eps)
    assert cycle["ttft"].terms["pod-0"].kv_price == 0.0


def test_a_split_request_prefilled_locally_after_its_prefill_pod_failed_queues_on_its_decode_pod(
    clock: Clock,
) -> None:
    # epp's sidecar answers `x-epp-prefill: local` when the prefill pod failed and it prefills on
    # the decode pod instead: that prefill joins the decode pod's queue (none was booked there).
    s = Stack(prefillTokensPerSecond=10_000.0, decodeInterference=0.0, overheadSeconds=0.0)
    eps = builders.pool(2)
    remote = interfaces.SchedulingResult(
        "decode",
        {"decode": interfaces.ProfileResult("decode", [eps[0]])},
        stages={"prefill": [eps[1]]},
    )
    split = request(toks(4000, start=1))
    s.score(split, eps)
    s.scorer.pre_request(split, remote)
    _, cycle = s.score(request(toks(1000, start=50_000)), eps)
    assert cycle["ttft"].terms["pod-0"].queue_s == 0.0
    s.scorer.response_headers(split, remote, None, {":status": "200", PREFILL_RESULT_HEADER: "local"})
    _, cycle = s.score(request(toks(1000, start=50_000)), eps)
    assert cycle["ttft"].terms["pod-0"].queue_s == pytest.approx(0.4)  # 4,000 tokens at 10,000/s
    assert cycle["ttft"].terms["pod-1"].queue_s == 0.0
    s.scorer.response_headers(split, remote, None, {":status": "200", PREFILL_RESULT_HEADER: "local"})
    _, cycle = s.score(request(toks(1000, start=50_000)), eps)
    assert cycle["ttft"].terms["pod-0"].queue_s == pytest.approx(0.4)  # booked once
    clock.now += 0.25
    _, cycle = s.score(request(toks(1000, start=50_000)), eps)
    assert cycle["ttft"].terms["pod-0"].queue_s == pytest.approx(0.15)
    # A prefill pod that answered: nothing is booked on the decode pod.
    other = request(toks(4000, start=9000))
    s.score(other, eps)
    s.scorer.pre_request(other, remote)
    s.scorer.response_headers(other, remote, None, {":status": "200", PREFILL_RESULT_HEADER: "10.0.0.2:8000"})
    _, cycle = s.score(request(toks(1000, start=50_000)), eps)
    assert cycle["ttft"].terms["pod-0"].queue_s == pytest.approx(0.15)


def test_offloaded_blocks_cost_a_fraction_of_a_miss(clock: Clock) -> None:
    s = Stack(offloadCost=0.5)
    prompt = toks(320)
    ev = BlockStored(
        block_hashes=list(range(20)),
        parent_block_hash=None,
        token_ids=prompt,
        block_size=16,
        lora_id=None,
        medium="CPU",
        lora_name=None,
        extra_keys=None,
    )
    s.index.apply("pod-0", EventBatch(0.0, [ev], 0), model="m")
    _, cycle = s.score(request([*prompt, *toks(80, start=9000)]), builders.pool(2))
    t = ttfts(s, cycle)
    assert t["pod-0"] == pytest.approx(0.01 + (80 + 320 * 0.5) * 1e-4)
    assert t["pod-1"] == pytest.approx(0.01 + 400 * 1e-4)


def test_exact_ties_are_broken_at_random(clock: Clock) -> None:
    s = Stack()
    prompt = toks(640)
    eps = builders.pool(3)
    feed(s.index, "pod-0", prompt)
    feed(s.index, "pod-2", prompt)
    random.seed(7)
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(200):
        scores, _ = s.score(request(prompt), eps)
        assert scores[0] == scores[2] == 1.0 and scores[1] < 1.0
        best = max(scores)
        counts[random.choice([ep.name for ep, sc in zip(eps, scores, strict=True) if sc == best])] += 1
    assert set(counts) == {"pod-0", "pod-2"} and min(counts.values()) > 70


def test_without_a_prefix_match_in_the_cycle_every_endpoint_pays_the_whole_prompt(clock: Clock) -> None:
    handle = builders.handle(None)
    plugin: Any = registry.default.build("predicted-ttft-scorer", "ttft", {"prefixScorer": "absent"}, handle)
    eps = builders.pool(2)
    eps[1].metrics.running = 100
    cycle: interfaces.CycleState = {}
    scores = plugin.score(cycle, request(toks(1000)), eps)
    assert scores[0] == 1.0 and scores[1] < 1.0  # slower by decodes: outside the home's slack
    assert plugin.explain(cycle)["endpoints"]["pod-0"]["uncached_tokens"] == 1000


# --- learning ----------------------------------------------------------------------------------


def test_learning_converges_to_the_true_rate_and_resists_outliers(clock: Clock) -> None:
    s = Stack()
    plugin = s.scorer
    rng = random.Random(3)
    true_cost = 1.0 / 2500.0  # a slower pod than the 10k tokens/s prior
    for _ in range(300):
        tokens = rng.randint(200, 8000)
        noise = rng.uniform(0.9, 1.1)
        plugin.learn("pod-0", 0.01 + tokens * true_cost * noise, tokens)
    assert plugin.prefill_tokens_per_second("pod-0") == pytest.approx(2500, rel=0.05)
    before = plugin.prefill_tokens_per_second("pod-0")
    plugin.learn("pod-0", 100.0, 1000)  # a 40x outlier (a stall): moves at most 2 ** 0.02
    assert plugin.prefill_tokens_per_second("pod-0") > before / 2**0.02 * 0.999
    # Other endpoints keep the prior.
    assert plugin.prefill_tokens_per_second("pod-1") == pytest.approx(RATE)


def test_the_prior_weighs_like_its_observations(clock: Clock) -> None:
    weak = Stack(priorObservations=1.0, maxUpdateRatio=100.0, learnShared=False)
    weak.scorer.learn("pod-0", 0.01 + 1000 / 5000, 1000)
    # Half the log error, scaled by the prefill's share of the prediction (0.1 of 0.11 s).
    expected = RATE * (0.11 / 0.21) ** (0.5 * 0.1 / 0.11)
    assert weak.scorer.prefill_tokens_per_second("pod-0") == pytest.approx(expected)
    strong = Stack(priorObservations=1000.0, maxUpdateRatio=100.0, minLearningRate=1e-4)
    strong.scorer.learn("pod-0", 0.01 + 1000 / 5000, 1000)
    assert strong.scorer.prefill_tokens_per_second("pod-0") == pytest.approx(RATE, rel=0.01)


def test_overhead_and_decode_interference_are_learned_until_predictions_fit(clock: Clock) -> None:
    s = Stack()
    plugin = s.scorer
    rng = random.Random(5)

    def truth(tokens: int, decodes: int) -> float:  # a slower step and stronger interference
        return (0.03 + tokens / 6000) * (1 + 0.06 * decodes)

    for _ in range(3000):
        tokens, decodes = rng.choice([0, 100, 500, 2000, 6000]), rng.randint(0, 60)
        plugin.learn("pod-0", truth(tokens, decodes) * rng.uniform(0.95, 1.05), tokens, decodes)
    assert plugin.overhead_seconds > 0.02 and plugin.decode_interference > 0.04
    for tokens, decodes in ((0, 0), (0, 50), (6000, 0), (6000, 50), (500, 20)):
        predicted = (plugin.overhead_seconds + tokens / plugin.prefill_tokens_per_second("pod-0")) * (
            1 + plugin.decode_interference * decodes
        )
        assert predicted == pytest.approx(truth(tokens, decodes), rel=0.15)


def test_the_decode_length_is_learned_from_response_durations(clock: Clock) -> None:
    s = Stack(decodeSeconds=5.0)
    eps = builders.pool(1)
    for i in range(60):
        req = request(toks(100, start=1000 * i))
        s.route(req, eps)
        outcome = _outcome(eps[0], ttft=0.05, prompt=100, cached=0)
        outcome.duration_s = 20.05
        s.scorer.response_complete(req, outcome)
    assert s.scorer.decode_seconds == pytest.approx(20.0, rel=0.05)


def test_response_complete_learns_from_the_reported_uncached_tokens_and_the_queue(clock: Clock) -> None:
    s = Stack(priorObservations=1.0, maxUpdateRatio=100.0)
    eps = builders.pool(1)
    first = request(toks(4000, start=1), rid="a")
    s.route(first, eps)  # 0.4 s booked
    second = request(toks(1000, start=50_000), rid="b")
    s.route(second, eps)  # queued behind 4000 tokens
    errors_before = _histogram_count()
    # The server reports 500 of the 1000 tokens cached (the prediction said none): it ran 4500
    # tokens in 0.46 s -> 10k tokens/s, the prior; had it used the predicted 5000 it would read 11.1k.
    s.scorer.response_complete(second, _outcome(eps[0], ttft=0.01 + 0.45, prompt=1000, cached=500))
    assert s.scorer.prefill_tokens_per_second("pod-0") == pytest.approx(RATE)
    assert _histogram_count() == errors_before + 1
    # Reported twice (cannot happen, but must not learn twice) or rerouted: ignored.
    s.scorer.response_complete(second, _outcome(eps[0], ttft=5.0, prompt=1000, cached=0))
    other = builders.endpoint("elsewhere")
    s.scorer.response_complete(first, _outcome(other, ttft=5.0, prompt=4000, cached=0))
    assert s.scorer.prefill_tokens_per_second("pod-0") == pytest.approx(RATE)
    assert _histogram_count() == errors_before + 1


def test_failed_requests_teach_nothing(clock: Clock) -> None:
    s = Stack()
    eps = builders.pool(1)
    req = request(toks(1000, start=1))
    s.route(req, eps)
    s.scorer.response_complete(
        req, interfaces.RequestOutcome(endpoint=eps[0], status=500, ok=False, ttft_s=9.0)
    )
    assert s.scorer.prefill_tokens_per_second("pod-0") == pytest.approx(RATE)


def test_learned_rate_changes_the_decision(clock: Clock) -> None:
    s = Stack()
    eps = builders.pool(2)
    for _ in range(100):  # pod-0 turns out 4x slower than the prior
        s.scorer.learn("pod-0", 0.01 + 1000 / 2500, 1000)
    prompt = toks(1600)
    feed(s.index, "pod-0", prompt[:800])  # half the prompt cached on the slow pod
    _, cycle = s.score(request(prompt), eps)
    t = ttfts(s, cycle)
    assert t["pod-0"] > t["pod-1"]  # 800 tokens at ~2.5k/s lose to 1600 at 10k/s


# --- explain, metrics, lifecycle, parameters -----------------------------------------------------


def test_explain_gives_each_term_of_each_endpoints_prediction(clock: Clock) -> None:
    s = Stack(popularityWindowSeconds=0)  # the full miss penalty, whatever the prefix's share
    eps = builders.pool(2)
    s.route(request(toks(5000, start=1)), [eps[1]])  # 0.5 s of prefill booked on pod-1
    busy = eps[1].metrics
    busy.waiting, busy.running, busy.kv_usage, busy.num_gpu_blocks = 2, 5, 0.9, 1000
    prompt = toks(320)
    feed(s.index, "pod-0", prompt)
    _, cycle = s.score(request(prompt), eps)
    facts = s.scorer.explain(cycle)
    assert facts["request"] == {
        "miss_penalty": 1.0,
        "overhead_seconds": 0.01,
        "decode_interference": 0.02,
        "decode_seconds": 5.0,
        "kv_wait_scale": 1.0,
        # trafficShare defaults to a pinned 1: each booking counts once.
        "traffic_share": {"booking_scale": 1.0, "share": 1.0, "source": "pinned"},
    }
    # pod-0: idle, holds the prompt's 20 blocks; vLLM computes the last block again (16 tokens).
    assert facts["endpoints"]["pod-0"] == {
        "predicted_ttft_s": pytest.approx(0.01 + 16e-4),
        "objective_s": pytest.approx(0.01 + 2 * 16e-4),  # plus missPenalty (1) x its own prefill
        "overhead_s": pytest.approx(0.01),
        "queue_s": 0.0,
        "queue_tokens": 0.0,
        "uncached_tokens": 16,
        "prefill_tokens_per_second": pytest.approx(RATE),
        "prefill_s": pytest.approx(16e-4),
        "decodes": 0,
        "decode_slowdown": 1.0,
        "kv_wait_s": 0.0,
        "kv_price_s": 0.0,
        "incoming_kv_tokens": 0,
        "miss_penalty_s": pytest.approx(16e-4),
    }
    # pod-1: a miss, behind 0.5 s booked (at the 1.1x slowdown of 5 running decodes), with 2
    # waiting (the penalty x 3) and its KV cache past the soft limit: 0.9 + 320 / (16 x 1000) =
    # 0.92, 0.6 of the room above 0.8, x decodeSeconds 5.
    slow = 1.0 + 0.02 * 5
    prefill = 320 * 1e-4 * slow
    got = facts["endpoints"]["pod-1"]
    assert got == {
        "predicted_ttft_s": pytest.approx(0.01 * slow + 0.5 + prefill + 3.0),
        "objective_s": pytest.approx(0.01 * slow + 0.5 + prefill + 3.0 + 3 * prefill),
        "overhead_s": pytest.approx(0.01 * slow),
        "queue_s": pytest.approx(0.5),
        "queue_tokens": pytest.approx(5000 / slow),  # the queue in tokens at the slowed rate
        "uncached_tokens": 320,
        "prefill_tokens_per_second": pytest.approx(RATE),
        "prefill_s": pytest.approx(prefill),
        "decodes": 5,
        "decode_slowdown": pytest.approx(slow),
        "kv_wait_s": pytest.approx(3.0),
        "kv_price_s": pytest.approx(3.0),
        "incoming_kv_tokens": 0,
        "miss_penalty_s": pytest.approx(3 * prefill),
    }
    assert s.scorer.explain({}) == {}


def test_explain_shows_the_learned_rate_and_the_home(clock: Clock) -> None:
    s = Stack(popularityWindowSeconds=0)
    for _ in range(100):  # pod-0 turns out 4x slower than the prior
        s.scorer.learn("pod-0", 0.01 + 1000 / 2500, 1000)
    _, cycle = s.score(request(toks(320, start=7)), builders.pool(2))  # held nowhere: a home decides
    facts = s.scorer.explain(cycle)
    rate = s.scorer.prefill_tokens_per_second("pod-0")
    assert rate < RATE / 2
    assert facts["endpoints"]["pod-0"]["prefill_tokens_per_second"] == pytest.approx(rate)
    assert facts["endpoints"]["pod-0"]["prefill_s"] == pytest.approx(320 / rate)
    assert facts["request"]["ttft_home"] == "pod-1"  # the only endpoint near the minimum


def test_the_config_file_builds_the_policy_and_explains_through_the_scheduler(clock: Clock) -> None:
    cfg, eps = fleet.configured(CONFIG, toks(640))
    assert cfg.warnings == []
    assert [p.name for p in cfg.response_complete] == ["predicted-ttft-scorer"]
    result = cfg.scheduler.schedule(request(toks(640)), eps, explain=True)
    assert result.targets[0].name == "10.0.0.2:8000"
    facts = result.profiles["default"].facts["endpoints"]
    assert facts["10.0.0.2:8000"]["matched_blocks"] == 40
    assert facts["10.0.0.2:8000"]["predicted_ttft_s"] < facts["10.0.0.1:8000"]["predicted_ttft_s"]


def test_the_learned_rate_is_a_gauge_dropped_with_its_endpoint(clock: Clock) -> None:
    store = Datastore()
    plugin: Any = registry.default.build(
        "predicted-ttft-scorer", "gauge-test", {}, interfaces.Handle(datastore=store)
    )
    spec = fleet.specs(1)[0]
    store.sync("static", [spec])
    plugin.learn(spec.name, 0.01 + 0.4, 1000)
    labels = {"plugin": "gauge-test", "endpoint": spec.name}
    value = metrics.REGISTRY.get_sample_value("epp_predicted_ttft_prefill_tokens_per_second", labels)
    assert value == pytest.approx(plugin.prefill_tokens_per_second(spec.name))
    store.sync("static", [])
    assert metrics.REGISTRY.get_sample_value("epp_predicted_ttft_prefill_tokens_per_second", labels) is None
    assert plugin.prefill_tokens_per_second(spec.name) == pytest.approx(RATE)  # state dropped too


@pytest.mark.parametrize(
    ("params", "culprit"),
    [
        ({"prefillTokensPerSecond": 0}, "prefillTokensPerSecond"),
        ({"priorObservations": 0.5}, "priorObservations"),
        ({"minLearningRate": 1.5}, "minLearningRate"),
        ({"maxUpdateRatio": 1.0}, "maxUpdateRatio"),
        ({"overheadSeconds": -0.1}, "overheadSeconds"),
        ({"decodeInterference": float("inf")}, "decodeInterference"),
        ({"offloadCost": 2}, "offloadCost"),
        ({"homeTolerance": "wide"}, "homeTolerance"),
        ({"homeWaitShare": -0.5}, "homeWaitShare"),
        ({"prefillRate": 5}, "prefillRate"),
    ],
)
def test_bad_parameters_are_config_errors_naming_the_parameter(params: dict[str, Any], culprit: str) -> None:
    with pytest.raises(registry.ConfigError, match=culprit) as err:
        builders.plugin("predicted-ttft-scorer", params, name="ttft")
    assert "ttft" in str(err.value)


# --- helpers ------------------------------------------------------------------------------------


def _outcome(ep: Endpoint, *, ttft: float, prompt: int, cached: int) -> interfaces.RequestOutcome:
    return interfaces.RequestOutcome(
        endpoint=ep, status=200, ok=True, prompt_tokens=prompt, cached_tokens=cached, ttft_s=ttft
    )


def _histogram_count() -> float:
    value = metrics.REGISTRY.get_sample_value("epp_predicted_ttft_error_seconds_count", {"plugin": "ttft"})
    return value or 0.0


def test_the_kv_wait_is_predicted_as_observed_while_the_choice_pays_its_full_price(clock: Clock) -> None:
    s = Stack(decodeSeconds=5.0, minLearningRate=0.2)
    eps = builders.pool(1)
    eps[0].metrics.num_gpu_blocks, eps[0].metrics.kv_usage = 1000, 0.9  # price 5 x (0.9 + 0.0063 - 0.8) / 0.2
    price = 5.0 * (0.9 + 100 / 16000 - 0.8) / 0.2
    _, before = s.score(request(toks(100, start=7)), eps)
    ttft0, objective0 = before["ttft"].predictions["pod-0"][:2]
    assert ttft0 == pytest.approx(0.01 + 0.01 + price)
    for i in range(40):  # every request waited a tenth of the price
        req = request(toks(100, start=1000 * (i + 10)))
        s.route(req, eps)
        clock.now += 10.0
        outcome = _outcome(eps[0], ttft=0.02 + 0.1 * price, prompt=100, cached=0)
        outcome.duration_s = 5.0 + outcome.ttft_s  # type: ignore[operator]
        s.scorer.response_complete(req, outcome)
    _, after = s.score(request(toks(100, start=7)), eps)
    ttft1, objective1 = after["ttft"].predictions["pod-0"][:2]
    assert ttft1 == pytest.approx(0.02 + 0.1 * price, rel=0.05)
    assert objective1 == pytest.approx(objective0, rel=0.01)


def test_a_miss_is_dearer_where_requests_wait_behind_it(clock: Clock) -> None:
    s = Stack(popularityWindowSeconds=0, missPenaltyPerWaiting=0.5)
    eps = builders.pool(2)
    eps[1].metrics.waiting = 4  # no booked prefill known yet: the scraped queue adds no time
    _, cycle = s.score(request(toks(1000, start=3)), eps)
    facts = s.scorer.explain(cycle)["endpoints"]
    assert facts["pod-0"]["objective_s"] == pytest.approx(0.11 + 0.1)
    assert facts["pod-1"]["predicted_ttft_s"] == pytest.approx(0.11)
    assert facts["pod-1"]["objective_s"] == pytest.approx(0.11 + 0.1 * (1 + 0.5 * 4))
