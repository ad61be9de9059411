"""Fixtures for the datastore tests: fail any async test that leaves a task running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    # One turn of the loop lets tasks cancelled during the test finish their cancellation.
    await asyncio.sleep(0)
    left = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
    assert not left, f"tasks left running: {[t.get_name() for t in left]}"
