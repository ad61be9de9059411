"""InferenceModelRewrites on the request path: the body's model rewritten to the rule's target on
the way to the pod and back to the client's name in the response, through epp's ext-proc stream.
(Precedence and weights are tested on the store, tests/datastore/test_model_rewrites.py; the same
through a real Envoy in e2e/test_model_rewrites.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from epp.api import errors
from epp.datastore.model_rewrites import ModelRewrite, ModelRewriteStore, Rule, Target
from epp.extproc.stream import Stream
from epp.requestcontrol.director import Director, DirectorSettings
from epp.requestcontrol.offload import BodyParsers
from tests.extproc import helpers as h


def chat(model: str, text: str = "hi") -> bytes:
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0.1}
    ).encode()


def director_with(*rules: Rule, settings: DirectorSettings | None = None) -> Director:
    director, _ = h.make_director(settings=settings)
    store = ModelRewriteStore()
    store.replace([ModelRewrite("rw", "2026-01-01T00:00:00Z", rules)])
    director.rewrites = store
    return director


ALIAS = Rule(frozenset({"llama"}), (Target("meta-llama/Llama-3.1-8B-Instruct"),))


async def sent_body(s: Stream, body: bytes, **headers: str) -> bytes:
    await s.handle(h.headers_msg(h.post_headers(**headers)))
    out = list(await s.handle(h.body_msg(body)))
    sent: bytes = h.message(out[1]).request_body.response.body_mutation.streamed_response.body
    assert h.set_headers(out[0])["content-length"] == str(len(sent))
    return sent


async def test_an_alias_reaches_the_pod_as_its_target_and_comes_back_as_asked() -> None:
    s = Stream(director_with(ALIAS))
    sent = await sent_body(s, chat("llama"))
    assert json.loads(sent) == {**json.loads(chat("llama")), "model": "meta-llama/Llama-3.1-8B-Instruct"}
    await s.handle(h.response_headers_msg(200, **{"content-type": "text/event-stream"}))
    chunks = [
        b'data: {"id":"c","model":"meta-llama/Llama-3.1-8B-Instruct","choices":[]}\n\n',
        b"data: [DONE]\n\n",
    ]
    out = await h.answer(s, h.response_body_msg(chunks[0], eos=False))
    out += await h.answer(s, h.response_body_msg(chunks[1], eos=True))
    back = b"".join(o.response_body.response.body_mutation.streamed_response.body for o in out)
    assert back == b'data: {"id":"c","model":"llama","choices":[]}\n\n' + b"data: [DONE]\n\n"
    s.close()


async def test_other_models_pass_unchanged() -> None:
    s = Stream(director_with(ALIAS))
    await s.handle(h.headers_msg(h.post_headers()))
    body = chat("mistral")
    out = list(await s.handle(h.body_msg(body)))
    assert s.ctx is not None and s.ctx.request.target_model == "mistral"
    assert h.message(out[1]).request_body.response.body_mutation.streamed_response.body == body
    s.close()


@pytest.mark.parametrize("header", ["x-llm-d-model-name-rewrite", "x-gateway-model-name-rewrite"])
async def test_a_rule_wins_over_a_trusted_rewrite_header(header: str) -> None:
    s = Stream(director_with(ALIAS, settings=DirectorSettings(trust_model_rewrite_header=True)))
    sent = await sent_body(s, chat("llama"), **{header: "from-header"})
    assert json.loads(sent)["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    s.close()
    s = Stream(director_with(ALIAS, settings=DirectorSettings(trust_model_rewrite_header=True)))
    sent = await sent_body(s, chat("mistral"), **{header: "from-header"})  # no rule: the header's
    assert json.loads(sent)["model"] == "from-header"
    s.close()


async def test_a_rule_back_to_the_asked_model_undoes_a_header() -> None:
    rule = Rule(frozenset({"llama"}), (Target("llama"),))
    s = Stream(director_with(rule, settings=DirectorSettings(trust_model_rewrite_header=True)))
    sent = await sent_body(s, chat("llama"), **{"x-llm-d-model-name-rewrite": "other"})
    assert json.loads(sent)["model"] == "llama"
    assert s.ctx is not None and not s.ctx.rewrites_response
    s.close()


async def test_a_generic_rule_rewrites_every_model() -> None:
    s = Stream(director_with(Rule(frozenset(), (Target("base"),))))
    sent = await sent_body(s, chat("whatever"))
    assert json.loads(sent)["model"] == "base"
    s.close()


async def test_a_rule_without_targets_is_a_400_naming_the_rewrite() -> None:
    director = director_with(Rule(frozenset({"llama"}), ()))
    with pytest.raises(
        errors.BadRequest, match="InferenceModelRewrite rw has a rule for model 'llama' without"
    ):
        await director.route(path="/v1/chat/completions", headers={}, body=chat("llama"), subset=None)


async def test_weighted_targets_split_the_requests() -> None:
    rule = Rule(frozenset({"llama"}), (Target("v1", 3), Target("v2", 1)))
    director = director_with(rule)
    seen = []
    for _ in range(400):
        ctx = await director.route(path="/v1/chat/completions", headers={}, body=chat("llama"), subset=None)
        seen.append(json.loads(ctx.body)["model"])
        assert ctx.rewrites_response
        ctx.finish(complete=True)
    assert abs(seen.count("v2") - 100) <= 3


@pytest.fixture
def parsers() -> Iterator[BodyParsers]:
    p = BodyParsers(1, min_bytes=1024)
    yield p
    p.close()


async def test_a_large_body_is_rewritten_in_a_body_parser(parsers: BodyParsers) -> None:
    director = director_with(ALIAS)
    director.prompts.body_parsers = parsers
    body = chat("llama", "word " * 1000)
    calls = []
    real = parsers.with_model

    async def counted(body: bytes, target: str) -> bytes:
        calls.append(target)
        return await real(body, target)

    parsers.with_model = counted  # type: ignore[method-assign]
    ctx = await director.route(path="/v1/chat/completions", headers={}, body=body, subset=None)
    assert calls == ["meta-llama/Llama-3.1-8B-Instruct"]
    assert json.loads(ctx.body) == {**json.loads(body), "model": "meta-llama/Llama-3.1-8B-Instruct"}
    ctx.finish(complete=True)
