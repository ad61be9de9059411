"""Reading ZMQ sockets from the event loop without zmq.asyncio: the loop watches each socket's
file descriptor (`Readable`), and whole messages are taken with non-blocking receives.

`epp.kvcache.ingest` reads every KV-event subscriber this way. It is its own module because none
of it knows about feeds, pods or the index: only sockets, descriptors and frames.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, cast

import zmq

__all__ = ["BUDGET", "Readable", "queued", "recv", "recv_from"]

BUDGET: Final = 256  # messages handled per wake-up before yielding to the loop
_RCVMORE: Final = int(zmq.RCVMORE)
_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
_FD: Final = int(zmq.FD)


def queued(sock: zmq.Socket[bytes]) -> bool:
    """A message is queued on `sock` (reading EVENTS also re-arms its descriptor: `Readable`)."""
    return bool(cast(int, sock.getsockopt(_EVENTS)) & _POLLIN)


class Readable:
    """Wakes a reader when one of some ZMQ sockets has a message, by the event loop watching each
    socket's file descriptor (`loop.add_reader`).

    zmq.asyncio's `Poller.poll` (and `Socket.poll`) registers a future per socket on every wait and
    runs its event bookkeeping through enum flags. Pods in service send a small batch at a time
    (a decode step's new blocks), so that bookkeeping was most of the cost: 8 pods sending 400
    batches a second in all took 0.57-0.61 ms of epp's CPU per batch that way, 0.25-0.40 ms this
    way, 100 pods at 2,000 a second 0.32 -> 0.18-0.20 ms (`python -m tests.kvcache.bench_ingest
    --paced`; docs/bench/microbenchmarks.md#ingest-paced).

    ZMQ's descriptor signals that the socket's state may have changed, not that a message is
    there, and signals again only once the socket's `EVENTS` has been read: see `wait`.
    """

    __slots__ = ("_fds", "_loop", "_waiter")

    def __init__(self, socks: tuple[zmq.Socket[bytes], ...]) -> None:
        self._loop = asyncio.get_running_loop()
        self._fds = [cast(int, s.getsockopt(_FD)) for s in socks]
        self._waiter: asyncio.Future[None] | None = None
        for fd in self._fds:
            self._loop.add_reader(fd, self._wake)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Return at the descriptors' next signal. The caller reads each socket's EVENTS (finding
        no message) just before, with no await in between: that re-arms the descriptors, and a
        message arriving after it signals. The caller checks EVENTS again after: a signal may
        be spurious."""
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def pump(
        self, sock: zmq.Socket[bytes], on_message: Callable[[], None], first: Callable[[], None] | None = None
    ) -> None:
        """Forever: `first()` (which reads its own sockets' EVENTS), then `on_message()` (which
        receives one message from `sock`) while `sock` has one queued, up to `BUDGET` a turn
        before yielding to the loop (a flooding pod cannot starve it), then wait. Each socket's
        EVENTS is read last before the wait: that re-arms its descriptor."""
        while True:
            if first is not None:
                first()
            n = 0
            while n < BUDGET and queued(sock):
                on_message()
                n += 1
            if n == BUDGET:
                await asyncio.sleep(0)
            else:
                await self.wait()

    def close(self) -> None:
        """Stop watching (before the sockets close); idempotent."""
        for fd in self._fds:
            self._loop.remove_reader(fd)
        self._fds = []


def recv_from(sock: zmq.Socket[bytes]) -> tuple[list[bytes], str | None]:
    """As `recv`, with the sender's IP (libzmq's Peer-Address property of the first frame)."""
    first = sock.recv(zmq.NOBLOCK, copy=False)
    frames = [first.bytes]
    while sock.getsockopt(_RCVMORE):
        frames.append(sock.recv(zmq.NOBLOCK))
    try:
        peer = first.get("Peer-Address")
    except zmq.ZMQError:
        return frames, None
    return frames, peer if isinstance(peer, str) else None


def recv(sock: zmq.Socket[bytes]) -> list[bytes]:
    """One whole message without blocking (zmq.Again if none is queued). pyzmq's recv_multipart
    looks its option up through enums on every frame: ~1 us more per 3-frame message (measured)."""
    frames = [sock.recv(zmq.NOBLOCK)]
    while sock.getsockopt(_RCVMORE):
        frames.append(sock.recv(zmq.NOBLOCK))
    return frames
