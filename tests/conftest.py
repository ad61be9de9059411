"""Fixtures for the tests under tests/ that start real processes (Envoy, `epp serve`, simulated
pods) through e2e/harness.py: the e2e suite's own, so the set-up (prerequisite skips, a Cleanup
registry, a force-close client session, epp and Envoy logs attached to a failure) lives in one
place rather than copied into each such test module."""

from e2e.conftest import (  # noqa: F401 (re-exported so pytest finds them for tests/)
    cleanup,
    e2e_prerequisites,
    pytest_runtest_makereport,
    session,
)
