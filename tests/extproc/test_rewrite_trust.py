"""A client-sent x-gateway-model-name-rewrite (or llm-d's x-llm-d-model-name-rewrite) changes nothing
unless epp is told to trust it (`--trust-model-name-rewrite-header`): the header can come from
anyone the gateway lets through."""

from __future__ import annotations

import json

import pytest

from epp.extproc.stream import Stream
from epp.requestcontrol.director import DirectorSettings
from tests.extproc import helpers as h

CHAT = json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.mark.parametrize("header", ["x-gateway-model-name-rewrite", "x-llm-d-model-name-rewrite"])
@pytest.mark.parametrize("trusted", [False, True])
async def test_the_rewrite_header_counts_only_when_trusted(trusted: bool, header: str) -> None:
    director, _ = h.make_director(settings=DirectorSettings(trust_model_rewrite_header=trusted))
    s = Stream(director)
    await s.handle(h.headers_msg(h.post_headers(**{header: "other-model"})))
    out = list(await s.handle(h.body_msg(CHAT)))
    sent = json.loads(h.message(out[1]).request_body.response.body_mutation.streamed_response.body)
    assert sent["model"] == ("other-model" if trusted else "llama")
    assert s.ctx is not None and s.ctx.request.target_model == sent["model"]
    s.close()
