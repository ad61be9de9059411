"""The default request limits come from the pod's memory limit (cgroup files laid out in tmp dirs):
no client can buffer more than the pod may hold. With the fixed defaults (1 GiB of buffered
bodies, 10,000 streams per process), 1,000 unfinished 1 MB bodies took epp to 1.56 GB, past
what a 2 GiB pod with two workers can give each."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from epp.extproc import limits
from epp.flags.request_limits import add_request_limit_arguments
from epp.serve import parts
from epp.workers import memory


def _cgroup(tmp_path: Path, line: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for where, text in files.items():
        f = root / where.strip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(line + "\n")
    return root, proc


def test_v2_the_smallest_memory_max_along_the_path(tmp_path: Path) -> None:
    root, proc = _cgroup(
        tmp_path,
        "0::/kubepods/pod1/ctr",
        {"/kubepods/pod1/memory.max": "4294967296\n", "/kubepods/pod1/ctr/memory.max": "max\n"},
    )
    found = memory.cgroup_memory_limit(root, proc)
    assert found is not None and found.bytes == 4 << 30 and found.source.endswith("pod1/memory.max")


def test_v1_limit_and_its_unlimited_value(tmp_path: Path) -> None:
    root, proc = _cgroup(
        tmp_path, "9:memory:/kubepods/x", {"/memory/kubepods/x/memory.limit_in_bytes": "2147483648\n"}
    )
    assert memory.cgroup_memory_limit(root, proc) == memory.MemoryLimit(
        2 << 30, str(root / "memory/kubepods/x/memory.limit_in_bytes")
    )
    root, proc = _cgroup(
        tmp_path / "u", "9:memory:/", {"/memory/memory.limit_in_bytes": "9223372036854771712\n"}
    )
    assert memory.cgroup_memory_limit(root, proc) is None


def test_machine_memory_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24576000 kB\nMemFree: 1 kB\n")
    assert memory.machine_memory(meminfo) == memory.MemoryLimit(24576000 * 1024, str(meminfo))


def test_sized_limits_fit_the_share_of_each_process() -> None:
    # The chart: 4 GiB, two workers, one body parser each.
    buffered, streams = limits.sized_limits(4 << 30, processes=2, parsers=1)
    share = (4 << 30) / 2
    assert buffered * limits.BUFFERED_COST + streams * limits.STREAM_COST <= share * limits.HEADROOM
    assert 256 << 20 < buffered < 1 << 30 and streams == 10_000
    # A 1 GiB pod: what a process may buffer shrinks (never below one largest body).
    small = limits.sized_limits(1 << 30, processes=1, parsers=1)
    assert small[0] < buffered and small[0] >= 16 << 20 and small[1] < 10_000
    # A big machine: the caps.
    assert limits.sized_limits(64 << 30) == (1 << 30, 10_000)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_request_limit_arguments(p)
    return p.parse_args(list(argv))


def test_serve_sizes_the_limits_it_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "memory_limit", lambda: memory.MemoryLimit(2 << 30, "memory.max"))
    got = parts._memory_limits(_args(), None)
    assert (got["max_buffered_body_bytes"], got["max_concurrent_streams"]) == limits.sized_limits(2 << 30)
    assert got["max_buffered_body_bytes"] < 1 << 30
    given = parts._memory_limits(_args("--max-buffered-body-bytes", "64Mi"), None)
    assert given["max_buffered_body_bytes"] == 64 << 20
    assert given["max_concurrent_streams"] == limits.sized_limits(2 << 30)[1]
