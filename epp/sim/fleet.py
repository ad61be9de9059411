"""A fleet of simulated vLLM replicas served in-process by one background thread's event loop.

Why a thread of its own: the callers (the demo, the end-to-end fixtures) stay synchronous or run
their own client loop, and a client never shares an event loop with the servers it measures, so
a slow client callback cannot stall a replica's step loop (and the other way round). The GIL is
still shared; a replica's step costs microseconds per running request and the rest is sleeping
and writing small SSE chunks, so that costs little. (`epp sim` serves pods the same way, on the
main thread's loop.)

Use:

    with SimFleet([SimConfig(name="pod-1"), SimConfig(name="pod-2")]) as fleet:
        fleet.addresses   # ["127.0.0.1:40123", "127.0.0.1:40125"], in config order
        fleet.kv_endpoints  # each replica's KV-event endpoint (None where kv_events is unset)
        fleet.stats()     # /sim/stats of each replica, read directly from its state
        fleet.reset()     # clear counters and prefix caches between runs
        fleet.restart(2, down_s=5.0).result()  # a replica's container restart (cold cache)

Every call into the loop waits for a bounded time; stop() is idempotent.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

from aiohttp import web

from epp.sim.engine import SimConfig
from epp.sim.server import bound_address, sim_state, start_sim_server

T = TypeVar("T")

HOST = "127.0.0.1"

STOP_WAIT_S = 1.0
"""How long a stopping replica lets its requests in flight finish before cancelling them."""

# Counters a replica's restart starts from zero, which `stats()` keeps summing over its lives.
_CARRIED = (
    "completed",
    "prefix_cache_hits",
    "prefix_cache_queries",
    "preemptions",
    "prompt_tokens",
    "cached_tokens",
)


class SimFleet:
    """N simulated replicas (one `SimConfig` each) listening on free ports of `host`."""

    def __init__(self, configs: Sequence[SimConfig], *, host: str = HOST) -> None:
        self.configs = list(configs)
        self.host = host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sim-fleet", daemon=True)
        self._runners: list[web.AppRunner] = []
        self.addresses: list[str] = []
        # Bound KV-event and replay endpoints per replica (port 0 resolved), for an endpoints file's
        # kvEvents / kvReplay; None where the config asks for no events (or no replay).
        self.kv_endpoints: list[str | None] = []
        self.kv_replay_endpoints: list[str | None] = []
        # Per replica: its earlier lives' counters (`restart`), and restarts so far; the
        # restarts under way (a stop cancels them: a replica down stays down) and their replicas.
        self._carried: list[collections.Counter[str]] = [collections.Counter() for _ in self.configs]
        self.restarts = [0] * len(self.configs)
        self._restarting: set[concurrent.futures.Future[None]] = set()
        self._down: set[int] = set()

    def start(self, timeout: float = 15.0) -> None:
        self._thread.start()
        self.call(self._start_all(), timeout=timeout)

    async def _start_all(self) -> None:
        for cfg in self.configs:
            runner = await start_sim_server(self.host, 0, config=cfg, shutdown_timeout=STOP_WAIT_S)
            self._runners.append(runner)
            self.addresses.append(bound_address(runner))
            state = sim_state(runner)
            self.kv_endpoints.append(state.kv_endpoint)
            self.kv_replay_endpoints.append(state.kv_replay_endpoint)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        """Run `coro` on the fleet's loop and wait (at most `timeout`) for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout)

    @property
    def names(self) -> list[str]:
        """The x-sim-server value of each replica (its config name, else its address)."""

        async def get() -> list[str]:
            return [sim_state(r).name for r in self._runners]

        return self.call(get())

    def stats(self) -> list[dict[str, Any]]:
        """Each replica's /sim/stats; a restarted one's counters (`_CARRIED`) include its earlier
        lives', as a fleet's totals over a run should."""

        async def snap() -> list[dict[str, Any]]:
            out = []
            for r, carried in zip(self._runners, self._carried, strict=True):
                s = sim_state(r).snapshot()
                for key, n in carried.items():
                    s[key] += n
                out.append(s)
            return out

        return self.call(snap())

    def stats_by_address(self) -> dict[str, dict[str, Any]]:
        return dict(zip(self.addresses, self.stats(), strict=True))

    def kv_subscriptions(self) -> list[int]:
        """Subscriptions each replica's KV-event publisher has seen (0 without events). A PUB drops
        what it sends before a subscriber is there, so wait for >= 1 before traffic that matters."""

        async def get() -> list[int]:
            out = []
            for r in self._runners:
                publisher = sim_state(r).publisher
                out.append(0 if publisher is None else publisher.subscriptions)
            return out

        return self.call(get())

    def reset(self) -> None:
        """Clear every replica's counters and prefix cache (as POST /sim/reset does; with KV events,
        each publishes AllBlocksCleared)."""

        async def do() -> None:
            for r in self._runners:
                sim_state(r).reset()
            for carried in self._carried:
                carried.clear()

        self.call(do())

    def restart(self, index: int, down_s: float) -> concurrent.futures.Future[None]:
        """Restart replica `index` as its container would restart: its requests in flight fail at
        once, its HTTP port and KV-event sockets close, and `down_s` wall seconds later it serves
        again on the same address and KV-event endpoints, with an empty prefix cache and its
        event sequence from 0. Returns at once; the future is done once it serves again."""
        if not 0 <= index < len(self._runners):
            raise IndexError(f"no replica {index} in a fleet of {len(self._runners)}")
        future = asyncio.run_coroutine_threadsafe(self._restart(index, down_s), self._loop)
        self._restarting.add(future)
        future.add_done_callback(self._restarting.discard)
        return future

    async def _restart(self, index: int, down_s: float) -> None:
        if index in self._down:
            raise RuntimeError(f"replica {index} is already restarting")
        self._down.add(index)
        runner = self._runners[index]
        state = sim_state(runner)
        host, _, port = self.addresses[index].rpartition(":")
        config = state.config
        if state.kv_endpoint is not None:
            # Bound on the same port again ("*": a bound endpoint; the port as resolved at start).
            port_of = state.kv_endpoint.rpartition(":")[2]
            config = dataclasses.replace(
                config, kv_events=f"tcp://*:{port_of}", kv_replay=state.kv_replay_endpoint
            )
        # A crash: the port closes, every connection is reset at once (their handlers are
        # cancelled, which aborts their requests in the engine), and nothing listens until the
        # restart.
        for site in list(runner.sites):
            await site.stop()
        server = runner.server
        for handler in [] if server is None else list(server.connections):
            if handler.transport is not None:
                handler.transport.abort()
        # The cleanup closes the engine and its tokenizers (the app's on_cleanup) once the
        # handlers are cancelled: closed before, a request already read on an aborted connection
        # met a closed tokenizer and answered 500 with a traceback in the log.
        await runner.cleanup()
        await asyncio.sleep(down_s)
        new = await start_sim_server(host.strip("[]"), int(port), config=config, shutdown_timeout=STOP_WAIT_S)
        # Until now stats() read the old life's counters; from now the new one's plus those.
        snapshot = state.snapshot()
        self._carried[index].update({key: int(snapshot[key]) for key in _CARRIED})
        self._runners[index] = new
        self._down.discard(index)
        self.restarts[index] += 1

    def stop(self, timeout: float = 15.0) -> None:
        if not self._thread.is_alive():
            # Never started (or already stopped): only the loop object may still need closing.
            if not self._loop.is_closed() and not self._loop.is_running():
                self._loop.close()
            return

        for future in list(self._restarting):
            future.cancel()

        async def cleanup() -> None:
            for r in self._runners:
                await r.cleanup()  # again for a replica down: a no-op

        try:
            self.call(cleanup(), timeout=timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SimFleet:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
