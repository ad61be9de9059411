"""Port picks for processes that bind late or restart in place."""

from __future__ import annotations

import resource
import socket

import pytest

from epp.gateway import processes
from epp.gateway.processes import HOST, ephemeral_low, stable_ports, stable_span


def _bindable(n: int) -> list[int]:
    """`n` ports of stable_ports' span that bind now and it has not handed out yet."""
    found: list[int] = []
    for port in stable_span():
        if port in processes._handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        found.append(port)
        if len(found) == n:
            return found
    pytest.skip("no free port below the ephemeral range")


def test_stable_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    # Below the range, no bind(0) or connect() of another socket can take one before its owner
    # binds it: the soak's pods lost a start to that in CI when their ports came from bind(0).
    ports = stable_ports(40)
    assert len(set(ports)) == 40
    low = ephemeral_low()
    assert all(1024 <= p < low for p in ports)
    held = []
    try:
        for p in ports:
            s = socket.socket()
            held.append(s)
            s.bind((HOST, p))
    finally:
        for s in held:
            s.close()


def test_stable_ports_skip_a_port_another_socket_holds() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 12_500:  # one descriptor per held port
        if hard != resource.RLIM_INFINITY and hard < 12_500:
            pytest.skip(f"holding 12,000 ports needs more than {hard} open files")
        resource.setrlimit(resource.RLIMIT_NOFILE, (12_500, hard))
    held = []
    try:
        # Hold every port of the range but one, on this host, where any are free to hold.
        for port in stable_span():
            s = socket.socket()
            try:
                s.bind((HOST, port))
            except OSError:
                s.close()
                continue
            held.append(s)
        # The spare is one no earlier test here was handed: those are never handed out again.
        spares = [s for s in held if s.getsockname()[1] not in processes._handed_out]
        assert spares, "no free port below the ephemeral range"
        spare = spares[-1]
        held.remove(spare)
        free = spare.getsockname()[1]
        spare.close()
        assert stable_ports(1) == [free]
    finally:
        for s in held:
            s.close()


class _Scripted:
    """A stand-in for `random.Random` that draws the ports of a script, in order."""

    def __init__(self, script: list[int]) -> None:
        self._script = script

    def choice(self, seq: range) -> int:
        return self._script.pop(0)


def test_a_port_handed_out_is_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # The soak picks its pods', epps' and Envoy's ports before any is bound, so a second pick of
    # the same free port was possible: CI saw a soak pod fail on "Address already in use".
    first, second = _bindable(2)
    script = [first, first, second]  # the second call draws the first call's port again
    monkeypatch.setattr(processes.random, "Random", lambda: _Scripted(script))
    assert stable_ports(1) == [first]
    assert stable_ports(1) == [second]
