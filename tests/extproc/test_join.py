"""epp.extproc._join: b"".join with the copy made outside the GIL (large request bodies)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest

from epp.extproc import _join


def test_join_matches_bytes_join_over_every_buffer_kind() -> None:
    parts = [os.urandom(1 << 20), memoryview(os.urandom(5000))[7:-3], bytearray(b"tail"), b""]
    assert _join.join(parts) == b"".join(parts)
    assert _join.join(tuple(parts)) == b"".join(parts)
    assert _join.join([]) == b""
    assert type(_join.join([b"a"])) is bytes


@pytest.mark.parametrize("bad", [[b"a", 3], ["text"], 5, None])
def test_join_refuses_what_is_not_a_sequence_of_buffers(bad: object) -> None:
    with pytest.raises(TypeError):
        _join.join(bad)  # type: ignore[arg-type]


def ticks_during(join: Callable[[list[memoryview]], bytes]) -> int:
    """How often a thread beside `join` of 64 MiB of views got the GIL while the join ran."""
    parts = [memoryview(bytes(4 << 20))[1:] for _ in range(16)]
    ticks = 0
    stop = threading.Event()
    started = threading.Event()

    def tick() -> None:
        nonlocal ticks
        started.set()
        while not stop.is_set():
            ticks += 1
            time.sleep(0)  # gives the GIL back each time

    thread = threading.Thread(target=tick)
    thread.start()
    try:
        started.wait()
        before = ticks
        out = join(parts)
        during = ticks - before
    finally:
        stop.set()
        thread.join()
    assert len(out) == 16 * ((4 << 20) - 1)
    return during


def test_join_lets_other_threads_run_during_the_copy() -> None:
    """What epp relies on: a thread beside the copy keeps running (epp's event loop, while a
    worker thread joins a large body). b"".join of views holds the GIL for the whole copy: the
    thread beside it ticks once or twice (tried: 0-2), against thousands here."""
    assert ticks_during(_join.join) > 20
