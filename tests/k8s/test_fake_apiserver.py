"""The fake API server itself: selector parsing and watch semantics the operator tests rely on."""

from __future__ import annotations

import json

import aiohttp
import pytest

from tests.k8s import fake_apiserver as fake


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("app=vllm", {"app": "vllm"}, True),
        ("app==vllm,tier!=big", {"app": "vllm", "tier": "big"}, False),
        ("app in (vllm, sglang)", {"app": "sglang"}, True),
        ("app notin (vllm),gpu", {"app": "x", "gpu": ""}, True),
        ("!gpu", {"gpu": "a100"}, False),
        ("", {}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert fake.label_matcher(selector)(labels) is expected


async def test_list_watch_and_410(api: fake.FakeApiServer) -> None:
    api.create("pods", fake.pod("a"))
    url = api.url + "/api/v1/namespaces/default/pods"
    headers = {"Authorization": "Bearer s3cret"}
    async with aiohttp.ClientSession(headers=headers) as s:
        async with s.get(url) as r:
            assert r.status == 200
            doc = await r.json()
        assert [o["metadata"]["name"] for o in doc["items"]] == ["a"]
        rv = doc["metadata"]["resourceVersion"]
        api.create("pods", fake.pod("b", labels={"app": "other"}))
        api.update("pods", "a", lambda o: o["metadata"]["labels"].update(app="gone"))
        params = {"watch": "true", "resourceVersion": rv, "labelSelector": "app=vllm", "timeoutSeconds": "1"}
        async with s.get(url, params=params) as r:
            events = [json.loads(line) for line in (await r.read()).splitlines()]
        # "a" stopped matching: DELETED; "b" never matched: nothing.
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("DELETED", "a")]
        api.compact()
        async with s.get(url, params=params) as r:
            events = [json.loads(line) for line in (await r.read()).splitlines()]
        assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410
        async with s.get(url, params={"fieldSelector": "spec.nodeName=x"}) as r:
            assert r.status == 400
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 401
