"""`--workers auto`: the cores a process may use, read from real cgroup files laid out in tmp dirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.workers import cpus


def _v2(tmp_path: Path, path: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for where, text in files.items():
        d = root / where.strip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.max").write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{path}\n")
    return root, proc


def test_v2_quota_is_floored_and_bounds_the_affinity(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/kubepods/pod1/ctr", {"/kubepods/pod1/ctr": "250000 100000\n"})
    budget = cpus.cpu_budget(root, proc, affinity=16)
    assert budget.cores == 2  # 2.5 CPUs: two whole cores, as Go's automaxprocs
    assert budget.quota == 2.5
    assert budget.source.endswith("ctr/cpu.max")


def test_v2_the_smallest_limit_along_the_path_wins(tmp_path: Path) -> None:
    root, proc = _v2(
        tmp_path,
        "/kubepods/pod1/ctr",
        {"/kubepods/pod1": "100000 100000", "/kubepods/pod1/ctr": "max 100000", "/": "max 100000"},
    )
    assert cpus.cpu_budget(root, proc, affinity=8).cores == 1


def test_v2_namespaced_container_reads_the_mount_root(tmp_path: Path) -> None:
    # In a cgroup namespace /proc/self/cgroup says "/" and the container's cpu.max is at the root.
    root, proc = _v2(tmp_path, "/", {"/": "400000 100000"})
    assert cpus.cpu_budget(root, proc, affinity=64).cores == 4


def test_no_limit_means_the_affinity_mask(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/user.slice", {"/user.slice": "max 100000"})
    budget = cpus.cpu_budget(root, proc, affinity=3)
    assert (budget.cores, budget.quota, budget.source) == (3, None, "affinity")


def test_affinity_smaller_than_the_quota_wins(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/", {"/": "800000 100000"})
    assert cpus.cpu_budget(root, proc, affinity=2).cores == 2


def test_a_limit_below_one_core_still_gives_one(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/", {"/": "50000 100000"})
    assert cpus.cpu_budget(root, proc, affinity=4).cores == 1


def test_v1_cfs_quota_with_a_host_path_missing_in_the_container(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    mount = root / "cpu,cpuacct"
    mount.mkdir(parents=True)
    (mount / "cpu.cfs_quota_us").write_text("300000\n")
    (mount / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("12:memory:/kubepods/x\n4:cpu,cpuacct:/kubepods/burstable/pod1/ctr\n")
    assert cpus.cpu_budget(root, proc, affinity=32).cores == 3


def test_v1_unlimited_quota(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    mount = root / "cpu,cpuacct"
    mount.mkdir(parents=True)
    (mount / "cpu.cfs_quota_us").write_text("-1\n")
    (mount / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("4:cpu,cpuacct:/\n")
    assert cpus.cpu_budget(root, proc, affinity=5).cores == 5


@pytest.mark.parametrize("text", ["garbage", "", "1 2 3"])
def test_unreadable_cpu_max_is_no_limit(tmp_path: Path, text: str) -> None:
    root, proc = _v2(tmp_path, "/", {"/": text})
    assert cpus.cpu_budget(root, proc, affinity=2).cores == 2


def test_no_cgroup_file_at_all(tmp_path: Path) -> None:
    budget = cpus.cpu_budget(tmp_path / "none", tmp_path / "missing", affinity=6)
    assert budget.cores == 6


def test_auto_is_capped(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/", {"/": "max 100000"})
    assert cpus.default_workers(cpus.cpu_budget(root, proc, affinity=64)) == cpus.AUTO_MAX_WORKERS


def test_this_machine() -> None:
    budget = cpus.cpu_budget()
    assert 1 <= budget.cores <= budget.affinity
