"""A pod that is sent work but publishes no KV event is said loudly: one warning per silence, and
`epp_kv_events_publisher_silent`. Against real ZMQ: a publisher that stays silent, and no publisher
at all; an idle pod is silent by right and never warned about."""

from __future__ import annotations

import logging

import pytest

from epp.kvcache.silence import SILENCE_MIN_TOKENS
from tests.kvcache.test_ingest import Rig, eventually, metric, rig, spec, stored, subscribed, tokens

__all__ = ["rig"]  # the fixture, used by name

GRACE = 0.3


def silent(pod: str) -> float | None:
    return metric("epp_kv_events_publisher_silent", pod=pod)


def warnings(caplog: pytest.LogCaptureFixture, pod: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and f"pod={pod} has published no KV event" in r.getMessage()
    ]


async def test_a_silent_publisher_is_warned_about_once_and_counted(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "epp.kvcache")
    pub = rig.publisher()  # bound, subscribed to, and publishing nothing
    routed = {"quiet": 0}
    s = spec(pub, pod="quiet")
    ing = await rig.ingester(s, routed_tokens=routed.__getitem__, silence_grace=GRACE)
    await subscribed(pub)
    await eventually(lambda: silent("quiet") == 0.0, "the gauge")
    # Work routed to it, but less than fills blocks at any block size: not yet a silence.
    routed["quiet"] = SILENCE_MIN_TOKENS - 1
    ing.check_silence(0.0)
    ing.check_silence(10.0)
    assert silent("quiet") == 0.0 and not warnings(caplog, "quiet")
    routed["quiet"] = 5_000
    await eventually(lambda: silent("quiet") == 1.0, "the silence", limit=5.0)
    (said,) = warnings(caplog, "quiet")
    # The tokens since it was first seen (the first check, at 1,023 routed).
    assert f"sent {5_000 - (SILENCE_MIN_TOKENS - 1)} prompt tokens" in said
    assert "(connected)" in said and "--kv-events-config" in said
    ing.check_silence(1e9)  # still silent: not said again
    assert len(warnings(caplog, "quiet")) == 1
    # It publishes: the silence ends, and that is said too.
    pub.publish([stored(tokens(1))])
    await eventually(lambda: silent("quiet") == 0.0, "the end of the silence")
    assert any("pod=quiet publishes KV events now" in r.getMessage() for r in caplog.records)


async def test_no_publisher_at_all_is_a_silence_too(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "epp.kvcache")
    s = spec(pod="nobody", events="tcp://127.0.0.1:1")  # nothing listens there
    routed = {"nobody": 0}
    ing = await rig.ingester(s, routed_tokens=routed.__getitem__, silence_grace=GRACE)
    ing.check_silence(0.0)  # seen first with nothing routed (a new endpoint), then work comes
    routed["nobody"] = 10_000
    await eventually(lambda: silent("nobody") == 1.0, "the silence", limit=5.0)
    (said,) = warnings(caplog, "nobody")
    assert "tcp://127.0.0.1:1 (no connection)" in said


async def test_an_idle_pod_is_never_called_silent(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "epp.kvcache")
    pub = rig.publisher()
    s = spec(pub, pod="idle")
    ing = await rig.ingester(s, routed_tokens=lambda pod: 0, silence_grace=GRACE)
    await subscribed(pub)
    for now in (0.0, 100.0, 1e6):
        ing.check_silence(now)
    assert silent("idle") == 0.0 and not warnings(caplog, "idle")


async def test_a_publishing_pod_is_not_silent(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "epp.kvcache")
    pub = rig.publisher()
    s = spec(pub, pod="busy")
    routed = {"busy": 0}
    ing = await rig.ingester(s, routed_tokens=routed.__getitem__, silence_grace=GRACE)
    ing.check_silence(0.0)
    routed["busy"] = 50_000
    await subscribed(pub)
    pub.publish([stored(tokens(2))])
    await eventually(lambda: ing.status()["busy"].batches == 1, "the batch")
    for now in (0.0, 100.0, 1e6):
        ing.check_silence(now)
    assert silent("busy") == 0.0 and not warnings(caplog, "busy")
