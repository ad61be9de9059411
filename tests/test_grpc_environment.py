"""`epp serve` sets gRPC core's experiments (epp.cli.GRPC_EXPERIMENTS_DEFAULT) before grpc loads,
and an operator's own GRPC_EXPERIMENTS wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from epp import cli

PROBE = """
import os, sys
from epp import cli
try:
    cli.main([sys.argv[1], "--help"])
except SystemExit:
    pass
print(os.environ.get("GRPC_EXPERIMENTS"), "grpc" in sys.modules)
"""


def _help(command: str, env: dict[str, str]) -> str:
    """The probe's last line after `epp COMMAND --help`: the variable, and whether grpc is loaded."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(("given", "expected"), [(None, cli.GRPC_EXPERIMENTS_DEFAULT), ("", ""), ("x", "x")])
def test_serve_sets_grpc_experiments_unless_given(given: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != cli.GRPC_EXPERIMENTS}
    if given is not None:
        env[cli.GRPC_EXPERIMENTS] = given
    # grpc is loaded by then (the parser imports it): the variable was set before it was.
    assert _help("serve", env) == f"{expected} True"


def test_other_commands_leave_it() -> None:
    environ: dict[str, str] = {}
    cli.grpc_environment(environ)
    assert environ == {cli.GRPC_EXPERIMENTS: "-event_engine_listener"}
    env = {k: v for k, v in os.environ.items() if k != cli.GRPC_EXPERIMENTS}
    assert _help("envoy-config", env).startswith("None ")
