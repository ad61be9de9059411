"""The datastore: sync keeps measured state across reloads and tells listeners of every change."""

from __future__ import annotations

from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec


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
