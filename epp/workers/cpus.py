"""How many cores `epp serve` may use: the default of `--workers auto`.

A container's CPU limit is a CFS quota, not a smaller CPU set: `os.cpu_count()` and the affinity
mask still show every core of the node, so a pod limited to 2 CPUs on a 64-core node would start
64 workers that the kernel then throttles. The answer is the smallest of: the CPUs in the
affinity mask (taskset, cpuset), and floor(quota / period) of every cgroup from this process's up
to the root (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`), at least 1. Floor,
not ceiling, as Go's automaxprocs: a worker per fractional core would be throttled every period.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")

AUTO_MAX_WORKERS = 8
"""`--workers auto` never starts more: each worker holds its own copy of the KV index and the
tokenizers, and a pod without a CPU limit would otherwise get one per core of the node."""


@dataclass(frozen=True)
class CpuBudget:
    cores: int
    """Whole cores this process may use (>= 1)."""
    affinity: int
    quota: float | None
    """CPU limit in cores (quota / period, the smallest along the cgroup path); None: unlimited."""
    source: str
    """Where the limit came from, for the startup log: a cgroup file, or "affinity"."""


def _affinity() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _v2_quota(text: str) -> float | None:
    """`cpu.max`: "max 100000" (no limit) or "<quota> <period>" in microseconds."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    quota, period = int(parts[0]), int(parts[1])
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> float | None:
    quota = int((directory / "cpu.cfs_quota_us").read_text().strip())
    period = int((directory / "cpu.cfs_period_us").read_text().strip())
    return quota / period if quota > 0 and period > 0 else None


def cgroup_ancestors(path: str) -> list[PurePosixPath]:
    """`/a/b` -> [/a/b, /a, /]: a parent's limit bounds its children."""
    p = PurePosixPath(path if path.startswith("/") else "/" + path)
    return [p, *p.parents]


def cgroup_path(root: Path, cgroup: PurePosixPath) -> Path:
    return root.joinpath(*cgroup.parts[1:])


def cgroup_quota(
    root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> tuple[float | None, str]:
    """(the smallest CPU limit in cores along this process's cgroup path or None, its file).

    Inside a container the cgroup namespace usually makes its own cgroup the mount's root, while
    /proc/self/cgroup may still show the host's path (v1): paths that do not exist under the mount
    are skipped, and the root is always read.
    """
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError:
        return None, ""
    best: tuple[float | None, str] = (None, "")

    def consider(quota: float | None, where: Path) -> None:
        nonlocal best
        if quota is not None and (best[0] is None or quota < best[0]):
            best = (quota, str(where))

    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2, unified
            for cg in cgroup_ancestors(path):
                f = cgroup_path(root, cg) / "cpu.max"
                try:
                    consider(_v2_quota(f.read_text()), f)
                except (OSError, ValueError):
                    continue
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's hierarchy
            for mount in (root / controllers, root / "cpu,cpuacct", root / "cpu"):
                if not mount.is_dir():
                    continue
                for cg in cgroup_ancestors(path):
                    d = cgroup_path(mount, cg)
                    try:
                        consider(_v1_quota(d), d / "cpu.cfs_quota_us")
                    except (OSError, ValueError):
                        continue
                break
    return best


def cpu_budget(
    root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP, affinity: int | None = None
) -> CpuBudget:
    cpus = affinity if affinity is not None else _affinity()
    quota, where = cgroup_quota(root, proc_self_cgroup)
    cores = cpus
    source = "affinity"
    if quota is not None and math.floor(quota) < cores:
        cores = math.floor(quota)
        source = where
    return CpuBudget(cores=max(1, cores), affinity=cpus, quota=quota, source=source)


def default_workers(budget: CpuBudget | None = None) -> int:
    """`--workers auto`: one worker per core this process may use, at most AUTO_MAX_WORKERS."""
    b = budget or cpu_budget()
    return max(1, min(b.cores, AUTO_MAX_WORKERS))
