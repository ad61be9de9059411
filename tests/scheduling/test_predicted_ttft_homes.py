"""predicted-ttft-scorer's placement of prefixes: the rendezvous home of an unseen prefix
(agreeing across instances and processes, among near-minimum endpoints only), a popular prefix
copied to more endpoints, homes on the endpoints that wrote the least new KV lately, an empty
endpoint warming up, and a near-tie kept on the endpoint holding the prompt (`holderTolerance`)."""

from __future__ import annotations

import collections
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from epp.scheduling import interfaces, registry
from epp.scheduling.plugins.ttft_homes import Homes, holder

from . import builders, fleet
from .fleet import Clock, feed, toks
from .fleet import clock as clock  # the fixture
from .test_predicted_ttft_scorer import Stack, request

# --- rendezvous home for unseen prefixes -------------------------------------------------------


def test_an_unseen_prefix_goes_to_the_same_home_in_independent_instances(clock: Clock) -> None:
    eps = builders.pool(4)
    homes: collections.Counter[str] = collections.Counter()
    for i in range(400):
        prompt = toks(200, start=1000 * i)
        a, b = Stack(), Stack()
        shuffled = eps[::-1]
        sa, ca = a.score(request(prompt), eps)
        _, cb = b.score(request(prompt), shuffled)
        home = ca["ttft"].home
        assert home and home == cb["ttft"].home
        assert sa[[ep.name for ep in eps].index(home)] == 1.0 and sorted(sa)[-2] < 1.0
        homes[home] += 1
    assert set(homes) == {ep.name for ep in eps}
    assert min(homes.values()) > 70  # ~100 each: the hash spreads prefixes


def test_the_home_is_chosen_among_near_minimum_endpoints_only(clock: Clock) -> None:
    eps = builders.pool(4)
    prompt = toks(2000, start=424242)
    _, cycle = Stack().score(request(prompt), eps)
    home = cycle["ttft"].home
    loaded = next(ep for ep in eps if ep.name == home)
    loaded.metrics.running = 200  # 2x slower prefill: 0.41 s, outside 20% / 100 ms of 0.21 s
    scores, cycle = Stack().score(request(prompt), eps)
    assert cycle["ttft"].home not in ("", home)
    assert scores[eps.index(loaded)] < 0.9


def test_a_prefix_held_somewhere_uses_no_home(clock: Clock) -> None:
    s = Stack()
    prompt = toks(320)
    feed(s.index, "pod-3", prompt)
    scores, cycle = s.score(request(prompt), builders.pool(4))
    assert cycle["ttft"].home == ""
    assert scores[3] == 1.0


def test_a_burst_of_a_new_prefix_stays_on_its_home(clock: Clock) -> None:
    s = Stack()
    eps = builders.pool(4)
    prompt = toks(2000, start=77)
    picks = {s.route(request([*prompt, *toks(20, start=900_000 + i)]), eps).name for i in range(3)}
    assert len(picks) == 1  # the home, then the speculative entries of the precise scorer


def test_the_home_is_the_same_in_another_process_with_another_hash_seed(clock: Clock) -> None:
    code = (
        "import epp.scheduling.plugins\n"
        "from tests.scheduling import builders\n"
        "from epp.scheduling import registry\n"
        "p = registry.default.build('predicted-ttft-scorer', 'ttft', {}, builders.handle(None))\n"
        "homes = []\n"
        "for i in range(20):\n"
        "    r = builders.request(target_model='m'); r.token_ids = list(range(1000 * i, 1000 * i + 200))\n"
        "    c = {}; p.score(c, r, builders.pool(4)); homes.append(c['ttft'].home)\n"
        "print(','.join(homes))\n"
    )
    root = Path(__file__).parent.parent.parent
    env = {"PYTHONHASHSEED": "12345", "PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=env
    ).stdout.strip()
    plugin: Any = registry.default.build("predicted-ttft-scorer", "ttft", {}, builders.handle(None))
    here = []
    for i in range(20):
        cycle: interfaces.CycleState = {}
        plugin.score(cycle, request(toks(200, start=1000 * i)), builders.pool(4))
        here.append(cycle["ttft"].home)
    assert out.split(",") == here


# --- popularity and recent traffic ---------------------------------------------------------------


def test_a_popular_prefix_is_copied_to_more_endpoints_than_a_rare_one(clock: Clock) -> None:
    """The miss penalty shrinks while fewer endpoints hold a prefix than its share of the traffic
    needs: with 4 endpoints, a prefix taking all the traffic is worth copying, one of many is not."""
    hot = toks(2000, start=1)
    eps = builders.pool(4)
    # The holder is busy: slowdown 1 + 0.02 x 1000 = 21, so a hit there (16 tokens left) takes
    # 0.0116 x 21 = 0.244 s, objective + 0.0016 x 21 x penalty; a miss on an idle endpoint takes
    # 0.2116 s, objective + 0.2016 x penalty. Full penalty: the holder wins (0.277 vs 0.413).
    eps[0].metrics.running = 1000

    def pick_after(history: list[list[int]]) -> str:
        s = Stack()
        feed(s.index, "pod-0", hot)
        for prompt in history:  # traffic seen before, on the holder alone
            s.route(request([*prompt, *toks(16, start=900_000)]), [eps[0]])
        clock.now += 100.0  # their prefill drained; their share decays but remains
        return s.route(request([*hot, *toks(16, start=800_000)]), eps).name

    # All the traffic on this prefix: it needs 4 endpoints, 1 holds it, penalty x (1/4)^2.
    assert pick_after([hot] * 10) != "pod-0"
    # One prefix among many: its share needs less than the one holder it has; full penalty.
    assert pick_after([toks(100, start=10_000 * (i + 2)) for i in range(30)]) == "pod-0"
    # Without the popularity rule the full penalty always applies.
    s = Stack(popularityWindowSeconds=0)
    feed(s.index, "pod-0", hot)
    assert s.route(request([*hot, *toks(16, start=800_000)]), eps).name == "pod-0"


def _prompt_homed_on_pod_0(eps: list[Any]) -> list[int]:
    """A new prefix whose rendezvous home is pod-0 when nothing has been routed yet."""
    return next(
        p
        for p in (toks(64, start=1000 * i) for i in range(100))
        if Stack().score(request(p), eps)[1]["ttft"].home == "pod-0"
    )


def test_homes_go_to_the_endpoints_that_wrote_the_least_new_kv_recently(clock: Clock) -> None:
    """Not the fewest requests: pod-0 served most of them, but hits, which write no new KV, so its
    least recently used blocks are the oldest in the fleet."""
    eps = builders.pool(4)
    prompt = _prompt_homed_on_pod_0(eps)
    s = Stack()
    for _ in range(6):  # one prefix, so hits after the first
        s.route(request(toks(64, start=7_000_000)), [eps[0]])
    for i in (1, 2, 3):  # one new 2000-token prompt each
        s.route(request(toks(2000, start=8_000_000 + 10_000 * i)), [eps[i]])
    clock.now += 10.0  # drained: the predictions are equal again
    assert s.score(request(prompt), eps)[1]["ttft"].home == "pod-0"
    # Once pod-0 has written the most new KV, it is no home; of the others, the least written.
    for _ in range(2):
        s.route(request(toks(3000, start=9_000_000 + int(clock.now))), [eps[0]])
        clock.now += 1.0
    s.route(request(toks(500, start=9_500_000)), [eps[2]])
    s.route(request(toks(500, start=9_600_000)), [eps[3]])
    clock.now += 10.0
    assert s.score(request(prompt), eps)[1]["ttft"].home == "pod-1"
    # Without the recent view (popularity off) the hash alone decides.
    s = Stack(popularityWindowSeconds=0)
    for _ in range(2):
        s.route(request(toks(3000, start=9_000_000 + int(clock.now))), [eps[0]])
        clock.now += 1.0
    clock.now += 10.0
    assert s.score(request(prompt), eps)[1]["ttft"].home == "pod-0"


def test_a_pre_warm_counts_as_new_kv_on_the_endpoint_it_warms() -> None:
    homes = Homes(60.0)
    eps = builders.pool(2)
    homes.routed("pod-0", 0.0, 1000.0)
    homes.written("pod-1", 0.0, 3000.0)  # a pre-warm: no request of its own
    assert homes.home(12345, eps, [1.0, 1.0], 1.0, 1.0) == 0
    assert homes.warming(eps, 1.0) == frozenset()  # too few requests to tell


@pytest.mark.parametrize("kind", ["predicted-ttft-scorer", "request-latency-scorer"])
def test_an_empty_endpoint_far_below_its_share_warms_up(clock: Clock, kind: str) -> None:
    """DEGRADE's case (issue 19): 8 prefixes all held by endpoints 0 and 1, which have carried the
    recent traffic; endpoint 2 (restarted: empty, nothing routed there lately) gets its share of
    the next picks at moderate load instead of idling until the holders' queues exceed a prefill."""
    eps = builders.pool(3)
    s = fleet.Stack(kind, "ttft")
    prefixes = [toks(800, start=10_000 * (g + 1)) for g in range(8)]
    for g, prefix in enumerate(prefixes):
        feed(s.index, "pod-0", prefix, base=100_000 * (g + 1))
        feed(s.index, "pod-1", prefix, base=100_000 * (g + 1) + 50_000)
    rng = random.Random(5)
    for i in range(120):  # the recent past: the holders served everything
        clock.now += 0.1
        s.route(
            request([*prefixes[rng.randrange(8)], *toks(64, start=900_000 + 64 * i)], rid=f"w{i}"), eps[:2]
        )
    for ep in eps[:2]:
        ep.metrics.waiting, ep.metrics.running = 6, 4  # TTFT alone: warms up from 10 waiting without this
    picks: collections.Counter[str] = collections.Counter()
    held: set[int] = set()
    for i in range(300):
        clock.now += 0.1
        g = rng.randrange(8)
        pick = s.route(request([*prefixes[g], *toks(64, start=2_000_000 + 64 * i)], rid=f"r{i}"), eps)
        picks[pick.name] += 1
        if pick.name == "pod-2" and g not in held:  # it now caches that prefix
            held.add(g)
            feed(s.index, "pod-2", prefixes[g], base=100_000 * (g + 1) + 70_000)
    assert picks["pod-2"] >= 300 / 6, picks


# --- a near-tie keeps the request on its holder ---------------------------------------------------


def _holder_case(tolerance: float) -> tuple[str, float, dict[str, Any]]:
    """pod-0 holds the prompt but has ~0.1 s of another prompt's prefill booked; idle pod-1 would
    compute all 1,000 tokens (0.11 s): a miss there is a little faster. Returns the pick, the
    objectives' ratio (holder / best) and explain's request facts."""
    s = Stack(missPenalty=0.0, holderTolerance=tolerance)
    prompt = toks(1000)
    feed(s.index, "pod-0", prompt)
    eps = builders.pool(2)
    assert s.route(request(toks(1050, start=50_000)), [eps[0]]).name == "pod-0"
    scores, cycle = s.score(request(prompt), eps)
    objectives = {name: v[1] for name, v in cycle["ttft"].predictions.items()}
    pick = eps[scores.index(max(scores))].name
    return pick, objectives["pod-0"] / objectives["pod-1"], s.scorer.explain(cycle)["request"]


def test_a_near_tie_keeps_the_request_on_the_endpoint_holding_its_prompt(clock: Clock) -> None:
    pick, ratio, facts = _holder_case(0.2)
    assert 1.0 < ratio < 1.2  # the miss is the better objective, within the tolerance
    assert pick == "pod-0"
    assert facts["ttft_holder"] == "pod-0"


@pytest.mark.parametrize("tolerance", [0.0, 0.01])
def test_a_clear_gain_or_no_tolerance_moves_the_request(clock: Clock, tolerance: float) -> None:
    pick, ratio, facts = _holder_case(tolerance)
    assert ratio > 1.0 + tolerance
    assert pick == "pod-1"
    assert "ttft_holder" not in facts


def test_the_holder_rule_picks_the_endpoint_holding_the_most_within_the_tolerance() -> None:
    # index 0 is the best objective; 1 and 3 hold more, 3 the most but beyond the limit
    assert holder([500.0, 100.0, 800.0, 0.0], [1.0, 1.04, 1.02, 1.5], limit=1.05) == 1
    assert holder([0.0, 100.0], [1.0, 1.01], limit=1.05) == -1  # the best holds the most already
    assert holder([500.0, 100.0], [1.0, 1.06], limit=1.05) == -1
    assert holder([500.0, 100.0, 100.0], [1.0, 1.04, 1.02], limit=1.05) == 2  # as much: the lesser objective
