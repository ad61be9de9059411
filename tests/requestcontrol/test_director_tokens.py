"""The Director fills a request's token ids before scheduling, as the model server will compute them,
and only when a configured plugin consumes them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.kvcache.index import BlockIndex
from epp.requestcontrol.director import Director
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


async def test_a_refused_chat_is_routed_without_token_ids(tokenizers: Tokenizers) -> None:
    d = director(tokenizers)
    bad = {"model": "m", "messages": [{"role": "user", "content": [{"type": "nonsense", "x": 1}]}]}
    request, result = await d.explain(path="/v1/chat/completions", headers={}, body=msgspec.json.encode(bad))
    assert request.token_ids is None
    assert result.targets  # still routed


async def test_nothing_is_tokenized_without_a_consumer(tokenizers: Tokenizers) -> None:
    d = director(tokenizers, LOAD_ONLY)
    assert await tokens_seen(d, "/v1/completions", {"model": "m", "prompt": "Hello there"}) is None
    assert tokenizers.missing == {}
