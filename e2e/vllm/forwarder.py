"""A ZMQ forwarder between one vLLM's KV-event publisher and epp, for injecting faults on demand.

    vLLM PUB --connects--> [SUB, bound] forwarder [PUB, bound] <--connects-- epp SUB

vLLM dials the forwarder (an event endpoint without `*` makes vLLM's PUB connect: reference
notes vllm-cpu.md, pitfall 3), and epp subscribes to the forwarder as it would to a pod. Messages
pass unchanged (the same three frames), so epp cannot tell the forwarder from the pod, except when
a test asks for one of these faults, each a thing that happens between real processes:

* `drop(n)`: the next n messages from vLLM are swallowed, as a PUB drops them past its high-water
  mark. epp sees the sequence jump (a gap) on the next message that passes.
* `cut()` / `restore()`: the downstream socket is closed (epp's subscription drops: a network
  blip, a proxy restart) and later bound again on the same port; messages vLLM sends meanwhile go
  nowhere, as a PUB's do with no subscriber. epp's SUB reconnects by itself.
* Because epp's connection is to the forwarder, a restart of the vLLM behind it does not break
  that connection: epp sees only the sequence numbers start again from 0 (its restart rule).

All socket work happens on the forwarder's own thread (ZMQ sockets are not thread-safe); the test
thread's requests are queued to it and waited for.
"""

from __future__ import annotations

import errno
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from epp.gateway.processes import HOST


@dataclass
class _Reply:
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None


class Forwarder:
    def __init__(self, in_port: int, out_port: int) -> None:
        self.upstream = f"tcp://{HOST}:{in_port}"  # give this to vLLM as its event endpoint
        self.downstream = f"tcp://{HOST}:{out_port}"  # give this to epp as the pod's kvEvents
        self.forwarded = 0
        self.dropped = 0
        self._drop_next = 0
        self._ctx = zmq.Context()
        self._sub: zmq.Socket[bytes] | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._calls: queue.Queue[tuple[Callable[[], None], _Reply]] = queue.Queue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-forwarder", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        self._started.wait(10)
        if self._error is not None:
            raise RuntimeError("forwarder failed to start") from self._error

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)
        # destroy, not term: term waits forever for any socket left open (a thread that died
        # mid-call leaves one), and a hung teardown once cost a whole CI run.
        self._ctx.destroy(linger=0)

    # --- faults (called from the test's thread) ---------------------------------------------------

    def drop(self, n: int) -> None:
        def apply() -> None:
            self._drop_next += n

        self._call(apply)

    def cut(self) -> None:
        def apply() -> None:
            if self._pub is not None:
                self._pub.close(linger=0)
                self._pub = None

        self._call(apply)

    def restore(self) -> None:
        def apply() -> None:
            if self._pub is None:
                self._pub = self._bind_pub()

        self._call(apply)

    def counts(self) -> tuple[int, int]:
        """(forwarded, dropped) so far."""
        out: list[tuple[int, int]] = []
        self._call(lambda: out.append((self.forwarded, self.dropped)))
        return out[0]

    # --- the forwarder's thread -------------------------------------------------------------------

    def _bind_pub(self) -> zmq.Socket[bytes]:
        """Bind the downstream PUB. Right after `cut()` the port can still be held: ZMQ closes a
        socket on its I/O thread, after `close()` returns, so EADDRINUSE is retried briefly."""
        deadline = time.monotonic() + 5
        while True:
            pub = self._ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.LINGER, 0)
            try:
                pub.bind(self.downstream)
                return pub
            except zmq.ZMQError as exc:
                pub.close(linger=0)
                if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _call(self, fn: Callable[[], None]) -> None:
        reply = _Reply()
        self._calls.put((fn, reply))
        if not reply.done.wait(10):
            raise TimeoutError("forwarder thread did not answer")
        if reply.error is not None:
            raise RuntimeError("forwarder call failed") from reply.error

    def _run(self) -> None:
        try:
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.bind(self.upstream)
            self._sub = sub
            self._pub = self._bind_pub()
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        try:
            while not self._stopping.is_set():
                while True:
                    try:
                        fn, reply = self._calls.get_nowait()
                    except queue.Empty:
                        break
                    try:  # a failed call is the caller's error; the thread goes on forwarding
                        fn()
                    except Exception as exc:
                        reply.error = exc
                    reply.done.set()
                if not poller.poll(20):
                    continue
                frames = sub.recv_multipart()
                if self._pub is None:  # cut: nobody to send to
                    self.dropped += 1
                    continue
                if self._drop_next > 0:
                    self._drop_next -= 1
                    self.dropped += 1
                    continue
                self._pub.send_multipart(frames)
                self.forwarded += 1
        finally:
            sub.close(linger=0)
            if self._pub is not None:
                self._pub.close(linger=0)
