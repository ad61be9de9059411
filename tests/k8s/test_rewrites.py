"""InferenceModelRewrites: parsing, and the operator's watch in either API group (llm-d's rule)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epp.datastore import endpoints
from epp.datastore.model_rewrites import ModelRewriteStore, Rule, Target
from epp.k8s import connections, operator, rewrites
from tests.k8s import fake_apiserver as fake
from tests.k8s.conftest import FAST, wait_for

LLMD = "inferencemodelrewrites.llm-d.ai"
LEGACY = "inferencemodelrewrites"

# ---- parsing ---------------------------------------------------------------------------------------


def test_parse_a_rewrite() -> None:
    obj = fake.rewrite(
        "canary",
        [fake.rule("llama", targets={"llama-v1": 90, "llama-v2": 10}), fake.rule(targets={"base": None})],
        created="2026-03-04T05:06:07Z",
    )
    parsed, notes = rewrites.parse_rewrite(obj, "pool")
    assert notes == []
    assert parsed is not None
    assert (parsed.name, parsed.created) == ("canary", "2026-03-04T05:06:07Z")
    assert parsed.rules == (
        Rule(frozenset({"llama"}), (Target("llama-v1", 90), Target("llama-v2", 10))),
        Rule(frozenset(), (Target("base"),)),
    )


def test_type_defaults_to_exact_and_another_pool_is_not_ours() -> None:
    obj = fake.rewrite("r", [{"matches": [{"model": {"value": "a"}}], "targets": [{"modelRewrite": "b"}]}])
    parsed, _ = rewrites.parse_rewrite(obj, "pool")
    assert parsed is not None and parsed.rules[0].models == {"a"}
    assert rewrites.parse_rewrite(obj, "other-pool") == (None, [])
    del obj["spec"]["poolRef"]["group"]  # left to the CRD's default
    assert rewrites.parse_rewrite(obj, "pool")[0] is not None
    obj["spec"]["poolRef"]["group"] = "inference.networking.x-k8s.io"
    assert rewrites.parse_rewrite(obj, "pool")[0] is None


def bad(change: Any) -> dict[str, Any]:
    obj = fake.rewrite("bad", [fake.rule("a", targets={"b": 1})])
    change(obj["spec"])
    return obj


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (bad(lambda s: s.pop("rules")), "spec.rules is not a list"),
        (bad(lambda s: s["rules"][0]["matches"][0]["model"].update(type="Prefix")), "'Prefix' is not Exact"),
        (bad(lambda s: s["rules"][0]["matches"][0]["model"].update(value="")), "value must be a non-empty"),
        (bad(lambda s: s["rules"][0]["matches"].append({})), "matches[1].model is missing"),
        (bad(lambda s: s["rules"][0]["targets"][0].pop("modelRewrite")), "modelRewrite must be"),
        (bad(lambda s: s["rules"][0]["targets"][0].update(weight=0)), "weight 0 is not an integer"),
        (bad(lambda s: s["rules"][0]["targets"][0].update(weight=2.5)), "weight 2.5 is not"),
        (bad(lambda s: s["rules"][0]["targets"][0].update(weight=True)), "weight True is not"),
    ],
)
def test_unreadable_rewrites_are_left_out_with_a_reason(obj: dict[str, Any], reason: str) -> None:
    good = fake.rewrite("good", [fake.rule("x", targets={"y": None})])
    found, problems = rewrites.rewrites([obj, good], "pool")
    assert [r.name for r in found] == ["good"]
    (problem,) = problems
    assert problem.startswith("InferenceModelRewrite bad is ignored: ") and reason in problem


def test_mixed_weights_and_no_targets_are_kept_and_reported() -> None:
    obj = fake.rewrite("r", [fake.rule("a", targets={"b": 5, "c": None}), fake.rule("d", targets={})])
    found, problems = rewrites.rewrites([obj], "pool")
    assert len(found) == 1
    assert problems == [
        "InferenceModelRewrite r: spec.rules[0] mixes weighted and unweighted targets: c never chosen "
        "(as llm-d)",
        "InferenceModelRewrite r: spec.rules[1] has no targets: requests it matches are refused with 400 "
        "(as llm-d)",
    ]


# ---- the watch through the operator ----------------------------------------------------------------


@pytest.fixture
async def watching(
    api: fake.FakeApiServer, connection: connections.Connection
) -> AsyncIterator[ModelRewriteStore]:
    api.create("inferencepools", fake.pool())
    store = ModelRewriteStore(random.Random(0))
    op = operator.PoolOperator(
        endpoints.Datastore(),
        connection=connection,
        namespace="default",
        pool_name="pool",
        settings=FAST,
        rewrite_store=store,
    )
    await op.start()
    await asyncio.wait_for(op.wait_synced(), 2.0)
    yield store
    await op.stop()


def target(store: ModelRewriteStore, model: str) -> str | None:
    decision = store.decide(model)
    return None if decision is None else decision.model


@pytest.mark.parametrize("group", [LLMD, LEGACY])
async def test_rewrites_are_added_changed_and_deleted(
    api: fake.FakeApiServer, connection: Any, group: str
) -> None:
    api.installed.discard(LEGACY if group == LLMD else LLMD)
    api.create("inferencepools", fake.pool())
    api.create(group, fake.rewrite("alias", [fake.rule("llama", targets={"llama-3.1-8b": None})]))
    store = ModelRewriteStore()
    op = operator.PoolOperator(
        endpoints.Datastore(), connection=connection, namespace="default", pool_name="pool", settings=FAST,
        rewrite_store=store,
    )  # fmt: skip
    await op.start()
    try:
        await wait_for(lambda: target(store, "llama") == "llama-3.1-8b")

        def retarget(obj: dict[str, Any]) -> None:
            obj["spec"]["rules"][0]["targets"] = [{"modelRewrite": "llama-3.2-1b"}]

        api.update(group, "alias", retarget)
        await wait_for(lambda: target(store, "llama") == "llama-3.2-1b")
        api.create(group, fake.rewrite("theirs", [fake.rule("x", targets={"y": None})], pool="other"))
        api.delete(group, "alias")
        await wait_for(lambda: not store)
        assert target(store, "x") is None
    finally:
        await op.stop()


async def test_both_groups_installed_reads_only_llm_d_ai(
    api: fake.FakeApiServer, watching: ModelRewriteStore, caplog: pytest.LogCaptureFixture
) -> None:
    store = watching
    api.create(LEGACY, fake.rewrite("old", [fake.rule("llama", targets={"from-legacy": None})]))
    api.create(LLMD, fake.rewrite("new", [fake.rule("llama", targets={"from-llm-d": None})]))
    await wait_for(lambda: target(store, "llama") == "from-llm-d")
    assert [r.name for r in store.rewrites] == ["new"]
    assert api.count(LEGACY, watch=False) == 0


async def test_a_bad_rewrite_is_logged_once_and_the_others_stay(
    api: fake.FakeApiServer, watching: ModelRewriteStore, caplog: pytest.LogCaptureFixture
) -> None:
    store = watching
    with caplog.at_level(logging.WARNING, logger="epp.k8s.operator"):
        api.create(LLMD, fake.rewrite("good", [fake.rule("a", targets={"b": None})]))
        broken = fake.rewrite("broken", [fake.rule("c", targets={"d": None})])
        broken["spec"]["rules"][0]["matches"][0]["model"]["type"] = "RegularExpression"
        api.create(LLMD, broken)
        api.create(LLMD, fake.rewrite("more", [fake.rule("e", targets={"f": None})]))
        await wait_for(lambda: [r.name for r in store.rewrites] == ["good", "more"])
    assert caplog.text.count("InferenceModelRewrite broken is ignored") == 1
    assert target(store, "a") == "b" and target(store, "c") is None
