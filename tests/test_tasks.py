"""epp.tasks: guarded background tasks report how they end, and are not garbage-collected."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import weakref
from typing import Any

import pytest

from epp import tasks

log = logging.getLogger("test.tasks")


async def _fail() -> None:
    await asyncio.sleep(0)
    raise RuntimeError("boom")


async def test_exception_is_logged_with_name_and_retrieved(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
    task = tasks.create_guarded_task(_fail(), name="worker-1", logger=log)
    with caplog.at_level(logging.ERROR, logger="test.tasks"):
        await asyncio.wait([task])
        del task
        gc.collect()  # a never-retrieved exception would be reported now
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "worker-1" in errors[0].getMessage()
    assert errors[0].exc_info is not None and "boom" in str(errors[0].exc_info[1])
    assert unhandled == []


async def test_eternal_task_returning_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    async def quits() -> int:
        return 3

    with caplog.at_level(logging.DEBUG, logger="test.tasks"):
        assert await tasks.create_guarded_task(quits(), name="loop-a", logger=log) == 3
        await asyncio.sleep(0)  # done-callbacks run one loop turn after completion
    assert [(r.levelno, "loop-a" in r.getMessage()) for r in caplog.records] == [(logging.WARNING, True)]


async def test_finite_task_returning_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    async def job() -> str:
        return "ok"

    with caplog.at_level(logging.DEBUG, logger="test.tasks"):
        assert await tasks.create_guarded_task(job(), name="job", logger=log, eternal=False) == "ok"
        await asyncio.sleep(0)
    assert caplog.records == []


async def test_cancel_is_quiet_and_cancel_and_wait_absorbs_it(caplog: pytest.LogCaptureFixture) -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    with caplog.at_level(logging.DEBUG, logger="test.tasks"):
        task = tasks.create_guarded_task(forever(), name="forever", logger=log)
        await started.wait()
        await tasks.cancel_and_wait([task])
        await asyncio.sleep(0)
    assert task.cancelled()
    assert caplog.records == []
    assert task not in tasks._running  # the strong reference is dropped once done


async def test_strong_reference_keeps_unreferenced_task_alive() -> None:
    """A task waiting on a future only it references is garbage to the GC, unless held."""
    loop = asyncio.get_running_loop()
    destroyed: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: destroyed.append(ctx))

    async def orphan() -> None:
        await loop.create_future()  # nothing else references this future or the task

    ref = weakref.ref(tasks.create_guarded_task(orphan(), name="orphan", logger=log))
    await asyncio.sleep(0)
    gc.collect()
    task = ref()
    assert task is not None, destroyed  # "Task was destroyed but it is pending!" otherwise
    await tasks.cancel_and_wait([task])
    assert destroyed == []


async def test_cancel_and_wait_lets_the_callers_own_cancellation_through() -> None:
    release = asyncio.Event()
    entered = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            entered.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # cleanup that takes a while
            raise

    child = tasks.create_guarded_task(slow_to_stop(), name="slow", logger=log)
    await entered.wait()
    owner = asyncio.create_task(tasks.cancel_and_wait([child]))
    await asyncio.sleep(0.01)
    assert not owner.done()  # still waiting for the child's cleanup
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner
    release.set()
    await asyncio.wait([child])
    assert child.cancelled()


def test_without_a_running_loop_it_raises_and_closes_the_coroutine() -> None:
    async def job() -> None:
        pass

    coro = job()
    with pytest.raises(RuntimeError):
        tasks.create_guarded_task(coro, name="nowhere", logger=log)
    # Closed: no "never awaited" warning (warnings are errors in this suite).
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED
