"""`--workers`: parsing, and the count `epp serve` starts with."""

from __future__ import annotations

import argparse

import pytest

from epp import cli, serve
from epp.workers import cpus


def _args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["serve", "--endpoints", "127.0.0.1:1", *argv])


def test_auto_is_the_default_and_zero_means_auto() -> None:
    assert _args().workers == 0
    assert _args("--workers", "auto").workers == 0
    assert _args("--workers", "0").workers == 0
    assert _args("--workers", "3").workers == 3
    assert serve._worker_count(_args("--kv-events", "connect")) == cpus.default_workers()


def test_auto_runs_one_process_without_kv_events() -> None:
    # Workers without KV events would each keep their own approximate prefix table.
    assert serve._worker_count(_args()) == 1
    assert serve._worker_count(_args("--kv-events", "off")) == 1
    assert serve._worker_count(_args("--kv-events", "off", "--workers", "2")) == 2  # asked for


@pytest.mark.parametrize("bad", ["-1", "two", "1.5"])
def test_bad_values_are_refused(bad: str) -> None:
    with pytest.raises(SystemExit):
        _args("--workers", bad)


def test_bind_mode_runs_one_process() -> None:
    assert serve._worker_count(_args("--kv-events", "bind")) == 1  # auto gives way
    assert serve._worker_count(_args("--kv-events", "bind", "--workers", "1")) == 1
    with pytest.raises(ValueError, match="only one process can bind"):
        serve._worker_count(_args("--kv-events", "bind", "--workers", "2"))
    assert serve._worker_count(_args("--kv-events", "connect", "--workers", "2")) == 2


def test_a_shared_port_must_be_fixed() -> None:
    with pytest.raises(ValueError, match="fixed --grpc-port"):
        serve._worker_count(_args("--grpc-port", "0", "--workers", "2"))
    assert serve._worker_count(_args("--grpc-port", "0")) == 1  # auto: one process
