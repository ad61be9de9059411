"""The Director fills a request's token ids before scheduling, as the model server will compute them,
and only when a configured plugin consumes them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from epp.api import errors
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.kvcache.index import BlockIndex
from epp.observability import collectors
from epp.requestcontrol.director import Director
from epp.rpc import http as rpc_http
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.tokenize.chat import encode_chat
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import load_shipped

LOAD_ONLY = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: queue-scorer
      - pluginRef: max-score-picker
"""


@pytest.fixture
async def tokenizers() -> AsyncIterator[Tokenizers]:
    toks = Tokenizers(default=load_shipped(), workers=1)
    yield toks
    toks.close()


def director(tokenizers: Tokenizers, config: str | None = None) -> Director:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(2)])
    handle = Handle(datastore=ds, kv_index=BlockIndex())
    cfg = sched_config.load_config(config, handle)  # None: the precise default (an index is given)
    return Director(
        datastore=ds,
        scheduler=cfg.scheduler,
        pre_request=cfg.pre_request,
        response_complete=cfg.response_complete,
        tokenizer=tokenizers,
    )


async def tokens_seen(d: Director, path: str, body: dict[str, Any]) -> list[int] | None:
    request, _ = await d.explain(path=path, headers={}, body=msgspec.json.encode(body))
    return request.token_ids


async def test_chat_is_rendered_with_the_template_and_text_is_encoded(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    tok = load_shipped()
    chat = {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    }
    ids = await tokens_seen(d, "/v1/chat/completions", chat)
    assert ids == encode_chat(tok, chat)
    assert ids != tok.encode("Be brief.\nHi")  # not the plain rendering
    assert await tokens_seen(d, "/v1/completions", {"model": "m", "prompt": "Hello there"}) == tok.encode(
        "Hello there"
    )
    # Token-id prompts are used as given.
    assert await tokens_seen(d, "/v1/completions", {"model": "m", "prompt": [5, 6, 7]}) == [5, 6, 7]


async def test_a_large_chat_is_decoded_for_its_template_on_the_loop_only_past_its_known_strings(
    tokenizers: Tokenizers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 300 KB body is decoded again for the template in a thread, unless what is left to
    decode once the parse's long contents are cut out is small (`known_strings`)."""
    from epp.requestcontrol import prompt

    hops: list[Any] = []
    to_thread = asyncio.to_thread

    async def counted(func: Any, *args: Any) -> Any:
        hops.append(func)
        return await to_thread(func, *args)

    monkeypatch.setattr(prompt.asyncio, "to_thread", counted)
    d = director(tokenizers)
    tok = load_shipped()
    system = {"role": "system", "content": "word " * 60_000}
    long = {"model": "m", "messages": [system, {"role": "user", "content": "Hi"}]}
    many = {"model": "m", "messages": [{"role": "user", "content": "word " * 100}] * 600}
    assert len(msgspec.json.encode(long)) > prompt._DECODE_INLINE_BYTES < len(msgspec.json.encode(many))
    assert await tokens_seen(d, "/v1/chat/completions", long) == encode_chat(tok, long)
    assert prompt.decode_body not in hops
    assert await tokens_seen(d, "/v1/chat/completions", many) == encode_chat(tok, many)
    assert prompt.decode_body in hops


@pytest.mark.parametrize(
    ("flag", "bos"),
    [(False, False), ("false", False), (0, False), ("off", False), (True, True), (None, True), ("x", True)],
)
async def test_completions_honour_add_special_tokens(tokenizers: Tokenizers, flag: Any, bos: bool) -> None:
    """vLLM's completions endpoint adds BOS unless `add_special_tokens` is false (lax booleans,
    as pydantic reads them); found by the real-vLLM suite."""
    d = director(tokenizers)
    tok = load_shipped()
    text = "Hello there, this is a prompt long enough to leave the loop" * 50  # worker path too
    for prompt in ("Hello there", text):
        body: dict[str, Any] = {"model": "m", "prompt": prompt}
        if flag is not None:
            body["add_special_tokens"] = flag
        ids = await tokens_seen(d, "/v1/completions", body)
        assert ids == tok.encode(prompt, add_special_tokens=bos)
        assert ids != tok.encode(prompt, add_special_tokens=not bos)


async def test_a_chat_vllm_would_refuse_is_answered_400(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    # (a text part first: alone, vLLM's request model already refuses the unknown part)
    parts = [{"type": "text", "text": "hi"}, {"type": "nonsense", "x": 1}]
    bad = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    with pytest.raises(errors.BadRequest, match="unsupported part type 'nonsense'"):
        await d.route(path="/v1/chat/completions", headers={}, body=msgspec.json.encode(bad), subset=None)
    assert all(ep.inflight_requests == 0 for ep in d.datastore.endpoints())


async def test_a_chat_epp_cannot_render_is_routed_without_token_ids(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What?"}, image]}],
    }
    request, result = await d.explain(path="/v1/chat/completions", headers={}, body=msgspec.json.encode(body))
    assert request.token_ids is None
    assert result.targets  # still routed: vLLM serves media


async def test_nothing_is_tokenized_without_a_consumer(tokenizers: Tokenizers) -> None:
    d = director(tokenizers, LOAD_ONLY)
    assert await tokens_seen(d, "/v1/completions", {"model": "m", "prompt": "Hello there"}) is None
    assert tokenizers.missing == {}


async def test_debug_tokenize_answers_the_scored_tokens(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    app = web.Application()
    rpc_http.add_routes(app, d)
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi there"}]}
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/debug/tokenize", json=chat)
        assert resp.status == 200
        payload = await resp.json()
        assert payload == {
            "model": "m",
            "token_ids": encode_chat(load_shipped(), chat),
            "count": len(encode_chat(load_shipped(), chat)),
            "scored": True,
        }
        resp = await client.post(
            "/debug/tokenize?path=/v1/completions", json={"model": "m", "prompt": [1, 2]}
        )
        assert (await resp.json())["token_ids"] == [1, 2]
        resp = await client.post("/debug/tokenize", data=b"{")
        assert resp.status == 400
    # Without a consumer, routing skips tokenizing but the endpoint still says what epp would use.
    d = director(tokenizers, LOAD_ONLY)
    request, scored = await d.tokenize(
        path="/v1/completions", headers={}, body=b'{"model": "m", "prompt": "Hi"}'
    )
    assert request.token_ids == load_shipped().encode("Hi") and not scored


def test_tokenizer_metrics_are_read_at_scrape_time() -> None:
    missing = {"llama": 3}
    registry = CollectorRegistry()
    registry.register(collectors.TokenizerCollector(lambda: missing, lambda: {"epp-tiny": 1}))
    assert registry.get_sample_value("epp_tokenizer_missing_total", {"model": "llama"}) == 3
    missing["llama"] = 5
    assert registry.get_sample_value("epp_tokenizer_missing_total", {"model": "llama"}) == 5
    assert registry.get_sample_value("epp_tokenizer_truncated_total", {"tokenizer": "epp-tiny"}) == 1


async def test_prefix_cache_metrics_follow_the_registry(tokenizers: Tokenizers) -> None:
    registry = CollectorRegistry()
    registry.register(
        collectors.TokenizerCollector(
            lambda: tokenizers.missing,
            lambda: tokenizers.truncated,
            lambda: tokenizers.prefix_caches,
            lambda: tokenizers.engines,
            lambda: tokenizers.commits_dropped,
        )
    )
    # Longer than FAST_INLINE_CHARS: shorter texts are encoded on the loop without the cache.
    system = "You are a careful assistant. Answer in full sentences. " * 100
    await tokenizers.encode("m", system + "First question?")
    await tokenizers.drain()  # the commit step caches the text after the answer
    await tokenizers.encode("m", system + "Second question?")
    await tokenizers.drain()
    labels = {"tokenizer": "epp-tiny"}
    assert registry.get_sample_value("epp_tokenizer_prefix_cache_partial_hits_total", labels) == 1
    assert (registry.get_sample_value("epp_tokenizer_prefix_cache_reused_tokens_total", labels) or 0) > 100
    assert (registry.get_sample_value("epp_tokenizer_prefix_cache_cached_bytes", labels) or 0) > 0
    assert registry.get_sample_value("epp_tokenizer_prefix_cache_engine_mismatches_total", labels) == 0
    # epp-tiny has the cut rule: fastokens' pieces, both checked (among the first texts).
    assert registry.get_sample_value("epp_tokenizer_prefix_cache_verified_total", labels) == 2
    assert registry.get_sample_value("epp_tokenizer_prefix_cache_unverified_total", labels) == 0
    engine = {"tokenizer": "epp-tiny", "engine": "fastokens"}
    assert registry.get_sample_value("epp_tokenizer_engine_info", engine) == 1


async def test_a_lora_adapter_is_tokenized_with_the_pools_base_model() -> None:
    """No tokenizer for the adapter's name: the base model the endpoints name serves it (as vLLM
    uses the base model's tokenizer for an adapter without one); with two base models in the pool
    there is no telling which, and the request goes without token ids."""
    tok = load_shipped()
    toks = Tokenizers(by_model={"base-7b": tok}, default=None, workers=1)
    try:
        d = director(toks)
        body = {"model": "support-lora", "prompt": "Hello there"}
        assert await tokens_seen(d, "/v1/completions", body) is None  # endpoints name no model
        d.datastore.sync("t", [EndpointSpec(name="pod-0", address="10.0.0.1", port=8000, model="base-7b")])
        assert d.datastore.base_model == "base-7b"
        assert await tokens_seen(d, "/v1/completions", body) == tok.encode("Hello there")
        chat = {"model": "support-lora", "messages": [{"role": "user", "content": "Hi"}]}
        assert await tokens_seen(d, "/v1/chat/completions", chat) == encode_chat(tok, chat)
        d.datastore.sync(
            "t",
            [
                EndpointSpec(name="pod-0", address="10.0.0.1", port=8000, model="base-7b"),
                EndpointSpec(name="pod-1", address="10.0.0.2", port=8000, model="other-8b"),
            ],
        )
        assert d.datastore.base_model is None
        assert await tokens_seen(d, "/v1/completions", body) is None
    finally:
        toks.close()


async def test_a_burst_past_what_the_tokenizers_can_queue_is_503_at_once() -> None:
    """The tokenizer pool's queue was unbounded: a burst of long prompts made every request wait
    for all the prompts before it. Past ~2 s of queued text per worker a request is answered 503
    with the reason; the others are routed with their token ids."""
    toks = Tokenizers(default=load_shipped(), workers=1, prefix_cache_bytes=0)
    toks.backlog_limit = 400_000  # a few prompts' worth, so the test stays small
    try:
        d = director(toks)
        bodies = [
            msgspec.json.encode({"model": "m", "prompt": f"request {i} " + "words to encode " * 8_000})
            for i in range(24)
        ]
        results = await asyncio.gather(
            *(d.route(path="/v1/completions", headers={}, body=b, subset=None) for b in bodies),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, errors.ServiceUnavailable)]
        routed = [r for r in results if not isinstance(r, BaseException)]
        assert len(refused) + len(routed) == len(bodies), results
        assert refused and routed
        assert all("tokenizer pool" in r.reason for r in refused)
        assert all(ctx.request.token_ids for ctx in routed)
        for ctx in routed:
            ctx.finish(complete=True)
    finally:
        toks.close()
