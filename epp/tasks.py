"""Guarded background tasks: every long-lived loop in epp starts through `create_guarded_task`.

A bare `asyncio.create_task` has two failure modes that are silent in production: the event loop
keeps only a weak reference to a task, so a task nobody holds can be garbage-collected mid-flight;
and an exception that ends a task is reported only when the task object is collected ("Task
exception was never retrieved"), often long after the fact or never. A loop that simply returns
(a `while` condition gone wrong) leaves no trace at all.

Design: the helper adds a done-callback rather than wrapping the coroutine. The task therefore
keeps asyncio's own semantics (`task.cancelled()` is true after `cancel()`, `await task` raises
what the coroutine raised), and the callback only reports:

- exception -> logged at ERROR with the task's name and traceback (which also marks it retrieved);
- normal return of an `eternal` task -> WARNING, since such a loop is meant to run until cancelled;
- cancellation -> nothing: that is how owners stop their loops.

Owners stop their tasks with `cancel_and_wait`, which waits for the cancellation to complete
without letting the children's `CancelledError` escape into the owner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

# Strong references: the loop only keeps weak ones (see asyncio.create_task's documentation).
_running: set[asyncio.Task[Any]] = set()


def create_guarded_task(
    coro: Coroutine[Any, Any, T],
    *,
    name: str,
    logger: logging.Logger,
    eternal: bool = True,
) -> asyncio.Task[T]:
    """Start `coro` as a named task whose end is always reported (see the module docstring).

    Must be called with a running event loop. `eternal=False` is for tasks that are expected to
    finish (one-shot jobs); their normal return is not logged.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        coro.close()  # no "coroutine was never awaited" warning on top of the error
        raise
    task = loop.create_task(coro, name=name)
    _running.add(task)

    def _done(t: asyncio.Task[T]) -> None:
        _running.discard(t)
        if t.cancelled():
            return
        exc = t.exception()  # retrieving it silences asyncio's "never retrieved" report
        if exc is not None:
            logger.error("background task %r failed", name, exc_info=exc)
        elif eternal:
            logger.warning("background task %r exited unexpectedly", name)

    task.add_done_callback(_done)
    return task


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait until all have finished.

    The tasks' own `CancelledError`s (and any exception they end with; the guard has logged it)
    are absorbed. If the *caller* is cancelled while waiting, that cancellation propagates.
    """
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
