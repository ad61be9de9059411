"""Reading ZMQ sockets from the event loop without zmq.asyncio: the loop watches each socket's
file descriptor and its reader callback (`Reader`) takes whole messages with non-blocking receives.

`epp.kvcache.ingest` reads every KV-event subscriber this way. It is its own module because none
of it knows about feeds, pods or the index: only sockets, descriptors and frames.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, cast

import zmq

__all__ = ["BUDGET", "Reader", "queued", "recv", "recv_from"]

BUDGET: Final = 256  # messages handled per turn before yielding to the loop
_RCVMORE: Final = int(zmq.RCVMORE)
_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
_FD: Final = int(zmq.FD)


def queued(sock: zmq.Socket[bytes]) -> bool:
    """A message is queued on `sock` (reading EVENTS also re-arms its descriptor: `Reader`)."""
    return bool(cast(int, sock.getsockopt(_EVENTS)) & _POLLIN)


class Reader:
    """Reads ZMQ sockets from the event loop's own reader callbacks: the loop watches each
    socket's file descriptor (`loop.add_reader`), and the callback receives the queued messages
    itself, with no future, task or coroutine step per wake-up.

    zmq.asyncio's `Poller.poll` (and `Socket.poll`) registers a future per socket on every wait and
    runs its event bookkeeping through enum flags. Pods in service send a small batch at a time
    (a decode step's new blocks), so the cost per wake-up is most of the cost: 8 pods sending 400
    batches a second in all took 0.57-0.61 ms of epp's CPU per batch that way, 0.25-0.40 ms with
    the loop watching the descriptors and a task woken through a future, and 12-15% less again
    with the callback reading (`python -m tests.kvcache.bench_ingest --paced`;
    docs/bench/microbenchmarks.md#ingest-paced).

    ZMQ's descriptor signals that the socket's state may have changed, not that a message is
    there, and signals again only once the socket's `EVENTS` has been read. So each turn reads
    EVENTS of every watched socket before it returns (`queued`), and one turn runs once at the
    start, for messages queued before the loop watched.
    """

    __slots__ = ("_done", "_fds", "_first", "_loop", "_on_message", "_scheduled", "_sock")

    def __init__(
        self,
        watched: tuple[zmq.Socket[bytes], ...],
        sock: zmq.Socket[bytes],
        on_message: Callable[[], None],
        first: Callable[[], None] | None = None,
    ) -> None:
        """Each turn: `first()` (which reads its own sockets' EVENTS), then `on_message()` (which
        receives one message from `sock`) while `sock` has one queued, up to `BUDGET` a turn (the
        next turn is then the loop's next round: a flooding pod cannot starve it). `watched`
        holds `sock` and the sockets `first` reads."""
        self._loop = asyncio.get_running_loop()
        self._fds = [cast(int, s.getsockopt(_FD)) for s in watched]
        self._sock, self._on_message, self._first = sock, on_message, first
        self._done: asyncio.Future[None] = self._loop.create_future()
        self._scheduled = False  # a turn is queued for the loop's next round (BUDGET reached)

    async def run(self) -> None:
        """Read until `close()` (then return) or until a callback raises (then raise it)."""
        for fd in self._fds:
            self._loop.add_reader(fd, self._signalled)
        self._turn()
        try:
            await self._done
        finally:
            self.close()

    def _signalled(self) -> None:
        if not self._scheduled:  # else a turn comes anyway: at most BUDGET messages a round
            self._turn()

    def _turn(self) -> None:
        self._scheduled = False
        if self._done.done():
            return
        try:
            if self._first is not None:
                self._first()
            sock, on_message, done = self._sock, self._on_message, self._done
            for _ in range(BUDGET):
                if not queued(sock):
                    return
                on_message()
                if done.done():  # closed by the message's handling: the socket may be gone
                    return
            self._scheduled = True
            self._loop.call_soon(self._turn)
        except Exception as exc:
            if not self._done.done():
                self._done.set_exception(exc)
            self.close()

    def close(self) -> None:
        """Stop watching (before the sockets close); idempotent."""
        for fd in self._fds:
            self._loop.remove_reader(fd)
        self._fds = []
        if not self._done.done():
            self._done.set_result(None)


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
