"""Port picks for processes that bind late or restart in place."""

from __future__ import annotations

import resource
import socket

import pytest

from epp.gateway.processes import HOST, ephemeral_low, stable_ports


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
    low = ephemeral_low()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 12_500:  # one descriptor per held port
        if hard != resource.RLIM_INFINITY and hard < 12_500:
            pytest.skip(f"holding 12,000 ports needs more than {hard} open files")
        resource.setrlimit(resource.RLIMIT_NOFILE, (12_500, hard))
    held = []
    try:
        # Hold every port of the range but one, on this host, where any are free to hold.
        for port in range(max(1024, low - 12000), low):
            s = socket.socket()
            try:
                s.bind((HOST, port))
            except OSError:
                s.close()
                continue
            held.append(s)
        assert held, "no free port below the ephemeral range"
        spare = held.pop()
        free = spare.getsockname()[1]
        spare.close()
        assert stable_ports(1) == [free]
    finally:
        for s in held:
            s.close()
