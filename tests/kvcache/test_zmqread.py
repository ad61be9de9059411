"""epp.kvcache.zmqread.Reader over real ZMQ sockets: messages read from the loop's reader
callback, at most BUDGET a round, messages queued before it watched, a failing callback ends
`run()` with its exception, and `close()` ends it and stops watching."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest
import zmq

from epp.kvcache import zmqread


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx = zmq.Context.instance()
    push: zmq.Socket[bytes] = ctx.socket(zmq.PUSH)
    pull: zmq.Socket[bytes] = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    yield push, pull
    push.close(linger=0)
    pull.close(linger=0)


def _watched() -> int:
    return len(asyncio.get_running_loop()._selector.get_map())  # type: ignore[attr-defined]


async def _until(check: object, within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline
        await asyncio.sleep(0.005)


async def test_reads_what_was_queued_before_and_after_and_stops_on_close(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    push, pull = pair
    for i in range(3):
        push.send_multipart([b"early", str(i).encode()])
    await asyncio.sleep(0.2)  # queued in the PULL before anyone watches
    got: list[list[bytes]] = []
    firsts = itertools.count()
    before = _watched()
    reader = zmqread.Reader((pull,), pull, lambda: got.append(zmqread.recv(pull)), lambda: next(firsts))
    task = asyncio.create_task(reader.run())
    await _until(lambda: len(got) == 3)
    assert _watched() == before + 1
    push.send_multipart([b"late", b"x"])
    await _until(lambda: len(got) == 4)
    assert got[0] == [b"early", b"0"] and got[3] == [b"late", b"x"]
    assert next(firsts) >= 2  # `first` runs every turn
    reader.close()
    await asyncio.wait_for(task, 1)  # returns, not cancelled
    assert _watched() == before
    push.send_multipart([b"after", b"close"])
    await asyncio.sleep(0.1)
    assert len(got) == 4


async def test_at_most_budget_messages_a_round(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    push, pull = pair
    total = 3 * zmqread.BUDGET + 7
    for i in range(total):
        push.send(str(i).encode())
    await asyncio.sleep(0.3)
    got: list[bytes] = []
    reader = zmqread.Reader((pull,), pull, lambda: got.append(pull.recv(zmq.NOBLOCK)))
    task = asyncio.create_task(reader.run())
    seen = [0]
    while len(got) < total:
        await asyncio.sleep(0)
        seen.append(len(got))
    steps = [b - a for a, b in itertools.pairwise(seen)]
    assert max(steps) <= zmqread.BUDGET and len([s for s in steps if s]) >= 4, steps
    assert got == [str(i).encode() for i in range(total)]
    reader.close()
    await task


async def test_a_failing_callback_ends_run_with_its_error(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    push, pull = pair

    def on_message() -> None:
        pull.recv(zmq.NOBLOCK)
        raise ValueError("bad frame")

    before = _watched()
    task = asyncio.create_task(zmqread.Reader((pull,), pull, on_message).run())
    await asyncio.sleep(0.05)
    push.send(b"x")
    with pytest.raises(ValueError, match="bad frame"):
        await asyncio.wait_for(task, 5)
    assert _watched() == before


async def test_cancelled_it_stops_watching(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    _, pull = pair
    before = _watched()
    task = asyncio.create_task(zmqread.Reader((pull,), pull, lambda: None).run())
    await asyncio.sleep(0.05)
    assert _watched() == before + 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _watched() == before


async def test_closed_by_a_message_it_stops_at_once(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    """A handler that closes the reader (its feed was dropped) is the last one called: the socket
    may be closed next, and reading it again would fail."""
    push, pull = pair
    for i in range(5):
        push.send(str(i).encode())
    await asyncio.sleep(0.2)
    got: list[bytes] = []
    reader: zmqread.Reader

    def on_message() -> None:
        got.append(pull.recv(zmq.NOBLOCK))
        reader.close()

    reader = zmqread.Reader((pull,), pull, on_message)
    await asyncio.wait_for(reader.run(), 5)  # returns: closed, not failed
    assert got == [b"0"]
