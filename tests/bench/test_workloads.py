"""Workload shapes: sharing ratios, QPS, prompt sizes, determinism, trace loading."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from epp.bench import trace, workloads
from epp.bench.workload import VOCAB, ClosedLoop, Fleet, OpenLoop, Prompt
from epp.sim.profiles import get_profile

from . import helpers


def fleet_of(cls: type[workloads.Workload]) -> Fleet:
    p = get_profile(cls.default_profile)
    return Fleet(cls.default_pods, p.num_gpu_blocks * p.block_size, p.max_model_len)


def drive(wl: ClosedLoop, service_s: float = 0.5) -> list[tuple[int, float, Prompt]]:
    """Every user's requests, as if each took `service_s` to serve: (user, time, prompt)."""
    out = []
    for user in range(wl.users):
        now = 0.0
        while (nxt := wl.next_request(user, now)) is not None:
            t, prompt = nxt
            assert t >= now
            out.append((user, t, prompt))
            now = t + service_s
    return out


def test_seed_stress_sharing_ratio_per_stage_and_prompt_sizes() -> None:
    fleet = fleet_of(workloads.SeedStress)
    wl = workloads.SeedStress(seed=3, scale=0.1, fleet=fleet)
    assert [s.sharing for s in wl.stages] == [0.5, 0.7, 0.9]
    assert wl.duration == pytest.approx(180.0)
    lengths = [len(p) for p in wl.prefixes]
    assert min(lengths) >= 4096 and max(lengths) <= 16384
    # The prefixes fill about 55% of the fleet's KV cache, as sized.
    assert sum(lengths) / (fleet.pods * fleet.kv_tokens_per_pod) == pytest.approx(0.55, abs=0.1)
    by_stage = collections.defaultdict(list)
    for _, _, p in drive(wl):
        by_stage[p.stage].append(p)
        assert len(p.token_ids) + p.max_tokens <= fleet.max_model_len
        if p.group:
            assert p.token_ids[: p.shared_tokens] == wl.prefixes[int(p.group.split("-")[1])]
    for i, ratio in enumerate((0.5, 0.7, 0.9)):
        shared = [p.group != "" for p in by_stage[i]]
        assert len(shared) > 500
        assert sum(shared) / len(shared) == pytest.approx(ratio, abs=0.06)


def test_llm_d_qps_ladder_prompts_and_kv_demand() -> None:
    wl = workloads.LlmD(seed=1, scale=1.0, fleet=fleet_of(workloads.LlmD))
    assert wl.kv_demand() == pytest.approx(0.732, abs=0.001)  # the published 73%
    assert [s.qps for s in wl.stages][:3] == [15.0, 3.0, 10.0] and wl.stages[-1].qps == 60.0
    counts: collections.Counter[int] = collections.Counter()
    distinct: set[int] = set()
    last = 0.0
    for t, p in wl.arrivals():
        assert t >= last
        last = t
        counts[p.stage] += 1
        assert (len(p.token_ids), p.shared_tokens, p.max_tokens) == (7200, 6000, 200)
        distinct.add(id(p.token_ids))
    assert len(distinct) == 750  # 150 groups x 5 users, each prompt a shared list
    for i, stage in enumerate(wl.stages):
        expected = stage.qps * stage.duration
        assert abs(counts[i] - expected) < 5 * expected**0.5  # Poisson: within 5 sd


def test_hotspot_puts_80_percent_on_one_prefix() -> None:
    wl = workloads.Hotspot(seed=2, scale=0.5, fleet=fleet_of(workloads.Hotspot))
    groups = collections.Counter(p.group for _, p in wl.arrivals())
    total = sum(groups.values())
    assert total == pytest.approx(wl.qps * 300, rel=0.1)
    assert groups["prefix-0"] / total == pytest.approx(0.8, abs=0.03)
    assert len(groups) == 32


def test_unique_prompts_share_no_block() -> None:
    wl = workloads.Unique(seed=2, scale=0.1, fleet=fleet_of(workloads.Unique))
    firsts = set()
    for _, p in wl.arrivals():
        assert 1024 <= len(p.token_ids) <= 4096 and p.shared_tokens == 0 and p.group == ""
        firsts.add(tuple(p.token_ids[:16]))
    assert len(firsts) > 300 and all(0 <= i < VOCAB for i in next(iter(firsts)))


def test_unique_saturating_runs_past_the_fleets_capacity() -> None:
    """At unique's 6 QPS the fleet keeps up (nothing waits); the saturating variant's queues grow,
    so output tokens/s falls short of what arrives."""
    from epp.bench import fast, report
    from epp.bench.policies import POLICIES

    out = {}
    for cls in (workloads.Unique, workloads.UniqueSaturating):
        profile = get_profile(cls.default_profile)
        wl = cls(seed=1, scale=0.2, fleet=fleet_of(cls))
        r = fast.FastRun(wl, POLICIES["round-robin"], profile=profile, pods=cls.default_pods, seed=1).run()
        s = report.summarize(r, wl.stages)
        offered = cls.qps * sum(cls.output_tokens) / 2
        out[cls.name] = (s["mean_queue"], s["output_tok_per_s"] / offered)
    assert out["unique"][0] < 0.02 and out["unique"][1] > 0.85
    assert out["unique-saturating"][0] > 0.1 and out["unique-saturating"][1] < 0.75


def test_chat_turns_extend_the_conversation_with_the_reply() -> None:
    wl = workloads.Chat(seed=5, scale=0.2, fleet=fleet_of(workloads.Chat))
    previous: dict[int, Prompt] = {}
    turns = 0
    for user, _, p in drive(wl, service_s=2.0):
        assert p.output_token_ids is not None and len(p.output_token_ids) == p.max_tokens
        before = previous.get(user)
        if p.group.startswith("conv-"):
            assert before is not None
            history = [*before.token_ids, *before.output_token_ids]  # type: ignore[misc]
            assert p.shared_tokens == len(history) and list(p.token_ids[: len(history)]) == history
            turns += 1
        else:
            assert p.group.startswith("app-") and p.shared_tokens == wl.system_tokens
        previous[user] = p
    assert turns > 100


class _FewGroups(workloads.LlmD):
    groups = 6  # llm-d's shape with fewer prompts to generate


@pytest.mark.parametrize(
    "cls", [_FewGroups if w is workloads.LlmD else w for w in workloads.WORKLOADS.values()]
)
def test_a_seed_fixes_the_workload(cls: type[workloads.Workload]) -> None:
    def first(seed: int) -> list[tuple[float, tuple[int, ...]]]:
        wl = cls(seed=seed, scale=0.01, fleet=helpers.FLEET if cls is workloads.SeedStress else fleet_of(cls))
        if isinstance(wl, OpenLoop):
            items = [(t, p) for t, p in wl.arrivals()][:20]
        else:
            assert isinstance(wl, ClosedLoop)
            items = [(t, p) for _, t, p in drive(wl)][:20]
        return [(t, tuple(p.token_ids[-8:])) for t, p in items]

    assert first(1) == first(1)
    assert first(1) != first(2)


def test_every_workload_names_a_known_profile() -> None:
    for cls in workloads.WORKLOADS.values():
        assert get_profile(cls.default_profile).name == cls.default_profile
        assert cls.default_pods > 0 and cls.description


# --- trace ---------------------------------------------------------------------------------------


def write(path: Path, *lines: object) -> str:
    path.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines) + "\n")
    return str(path)


def test_trace_tokenizes_text_sorts_by_time_and_finds_shared_prefixes(tmp_path: Path) -> None:
    ids = list(range(100, 164))
    path = write(
        tmp_path / "t.jsonl",
        {"t": 2.0, "prompt_token_ids": [*ids, 1, 2], "max_tokens": 4, "group": "a"},
        {"t": 0.5, "prompt_token_ids": [*ids, 3], "max_tokens": 8},
        "",
        {"t": 1.0, "prompt": "hello there, how are you?", "max_tokens": 16},
    )
    wl = trace.Trace(path, seed=1, scale=1.0, fleet=helpers.FLEET)
    got = list(wl.arrivals())
    assert [t for t, _ in got] == [0.5, 1.0, 2.0]
    assert [p.shared_tokens for _, p in got] == [64, 0, 64]
    assert got[2][1].group == "a" and got[1][1].max_tokens == 16
    assert len(got[1][1].token_ids) > 3  # tokenized by epp-tiny
    assert wl.name == f"trace:{path}"
    half = trace.Trace(path, seed=1, scale=0.5, fleet=helpers.FLEET)
    assert [t for t, _ in half.arrivals()] == [0.5, 1.0]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"t": 1, "max_tokens": 4}, "exactly one of `prompt` and `prompt_token_ids`"),
        ({"t": 1, "prompt": "x", "prompt_token_ids": [1], "max_tokens": 4}, "exactly one"),
        ({"t": 1, "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"t": -1, "prompt": "x", "max_tokens": 3}, "`$.t`"),
        ({"t": 1, "prompt": "x", "max_tokens": 3, "tokens": 1}, "unknown field `tokens`"),
        ("{not json", "line 1"),
    ],
)
def test_trace_errors_name_the_line_and_field(tmp_path: Path, line: object, message: str) -> None:
    path = write(tmp_path / "bad.jsonl", line)
    with pytest.raises(trace.TraceError, match="line 1") as err:
        trace.load(path)
    assert message in str(err.value)


def test_trace_missing_or_empty(tmp_path: Path) -> None:
    with pytest.raises(trace.TraceError, match="cannot read"):
        trace.load(str(tmp_path / "nope.jsonl"))
    with pytest.raises(trace.TraceError, match="no requests"):
        trace.load(write(tmp_path / "empty.jsonl", ""))


def test_shared_prefixes_is_the_longest_common_prefix_with_any_other() -> None:
    prompts = [[1, 2, 3, 4], [1, 2, 9], [7], [1, 2, 3, 5, 6], []]
    assert trace.shared_prefixes(prompts) == [3, 2, 0, 3, 0]
