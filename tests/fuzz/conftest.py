"""An in-process Director as `epp serve` builds it with KV events and tokenization on, and a check
that routing a body never fails with a 5xx or logs at ERROR."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from epp.api import errors
from epp.api.context_length import ContextLimits
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.kvcache.index import BlockIndex
from epp.requestcontrol.director import Director
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.tokenize.registry import Tokenizers
from epp.tokenize.tokenizer import load_shipped


class ErrorLog(logging.Handler):
    """Collects ERROR (and worse) records of every logger."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        out = [
            f"{r.name}: {r.getMessage()} {r.exc_info[1]!r}" if r.exc_info else r.getMessage()
            for r in self.records
        ]
        self.records.clear()
        return out


@pytest.fixture
def error_log() -> Iterator[ErrorLog]:
    handler = ErrorLog()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


def build_director(tokenizers: Tokenizers) -> Director:
    """The precise default config (the KV index given, as with --kv-events), the shipped
    tokenizer, and a context length, so every step a body can reach runs."""
    ds = Datastore()
    ds.sync("fuzz", [EndpointSpec(name=f"pod-{i}", address=f"10.0.0.{i + 1}", port=8000) for i in range(2)])
    handle = Handle(datastore=ds, kv_index=BlockIndex())
    cfg = sched_config.load_config(None, handle)
    return Director(
        datastore=ds,
        scheduler=cfg.scheduler,
        pre_request=cfg.pre_request,
        response_complete=cfg.response_complete,
        tokenizer=tokenizers,
        context_limits=ContextLimits(overrides={"*": 4096}),
    )


@pytest.fixture
def tokenizers() -> Iterator[Tokenizers]:
    toks = Tokenizers(default=load_shipped(), workers=1)
    yield toks
    toks.close()


async def route_once(director: Director, path: str, body: bytes) -> int:
    """The HTTP status epp gives the body: 200 when routed (the booking then released)."""
    try:
        ctx = await director.route(path=path, headers={}, body=body, subset=None)
    except errors.RequestError as exc:
        return exc.status
    ctx.finish(complete=True)
    return 200
