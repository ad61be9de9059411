"""The datastore: sync keeps measured state across reloads and tells listeners of every change."""

from __future__ import annotations

import logging

import pytest

from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.observability import metrics


def test_listeners_hear_of_added_removed_and_metadata_changes() -> None:
    ds = Datastore()
    heard: list[tuple[list[str], list[str]]] = []

    def listener(added: list[Endpoint], removed: list[Endpoint]) -> None:
        heard.append(([e.name for e in added], [e.name for e in removed]))

    ds.subscribe(listener)
    a = EndpointSpec(name="a", address="10.0.0.1", port=8000)
    ds.sync("s", [a])
    ep = ds.get("a")
    assert ep is not None
    ep.inflight_requests = 2
    ds.sync("s", [a])  # nothing changed: nobody is told
    moved = EndpointSpec(name="a", address="10.0.0.1", port=8000, kv_events="tcp://10.0.0.1:6000")
    ds.sync("s", [moved])  # only metadata: same Endpoint, measured state kept, listeners told
    assert ds.get("a") is ep and ep.inflight_requests == 2 and ep.spec.kv_events == "tcp://10.0.0.1:6000"
    ds.sync("s", [])
    assert heard == [(["a"], []), ([], []), ([], ["a"])]


def _degraded_picks() -> float:
    return metrics.REGISTRY.get_sample_value("epp_routing_degraded_total") or 0.0


def test_every_endpoint_excluded_degrades_to_all_rather_than_none(caplog: pytest.LogCaptureFixture) -> None:
    """All /metrics hung at once must not become a 503 for the whole pool (issue 19)."""
    ds = Datastore()
    ds.sync("s", [EndpointSpec(name=n, address=f"10.0.0.{i}", port=8000) for i, n in enumerate("ab", 1)])
    a, b = ds.get("a"), ds.get("b")
    assert a is not None and b is not None
    caplog.set_level(logging.INFO, logger="epp.datastore.endpoints")

    a.excluded = True
    ds.refresh_candidates()
    before = _degraded_picks()
    assert ds.pick_candidates() == [b] and not ds.degraded  # one healthy: the excluded one stays out
    assert _degraded_picks() == before

    b.excluded = True
    ds.refresh_candidates()
    assert ds.degraded and ds.routable() == []
    assert set(ds.pick_candidates()) == {a, b}  # routed on what is known, and counted
    assert _degraded_picks() == before + 1
    assert metrics.REGISTRY.get_sample_value("epp_routing_degraded_mode") == 1
    # Flapping in and out of degraded mode is logged once per DEGRADED_LOG_EVERY_S, not each time.
    for _ in range(5):
        b.excluded = False
        ds.refresh_candidates()
        b.excluded = True
        ds.refresh_candidates()
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1

    a.excluded = False  # a readmitted endpoint ends degraded mode at once
    ds.refresh_candidates()
    assert ds.pick_candidates() == [a] and not ds.degraded
    assert metrics.REGISTRY.get_sample_value("epp_routing_degraded_mode") == 0


def test_a_subset_hint_naming_only_excluded_endpoints_degrades_to_them() -> None:
    ds = Datastore()
    ds.sync("s", [EndpointSpec(name=n, address=f"10.0.0.{i}", port=8000) for i, n in enumerate("ab", 1)])
    a = ds.get("a")
    assert a is not None
    a.excluded = True
    ds.refresh_candidates()
    before = _degraded_picks()
    assert ds.pick_candidates(frozenset({"10.0.0.1"})) == [a]
    assert _degraded_picks() == before + 1
    assert ds.pick_candidates(frozenset({"10.0.0.9"})) == []  # unknown addresses: nothing to degrade to


def test_an_empty_pool_is_not_degraded() -> None:
    ds = Datastore()
    ds.sync("s", [])
    assert ds.pick_candidates() == [] and not ds.degraded
