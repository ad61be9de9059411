"""How much memory `epp serve` may use: what the default request limits are sized from.

A container's memory limit is its cgroup's (`memory.max` in cgroup v2, `memory.limit_in_bytes`
in v1), the smallest along this process's cgroup path; the kernel kills the pod past it. Without
one, the machine's memory (`MemTotal`) is the bound. The sizing itself (what the limit buys) is
`epp.extproc.limits.sized_limits`; docs/security.md shows the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from epp.workers.cpus import CGROUP_ROOT, PROC_SELF_CGROUP, cgroup_ancestors, cgroup_path

PROC_MEMINFO = Path("/proc/meminfo")
_V1_UNLIMITED = 1 << 62  # v1 reports "no limit" as a page-rounded 2^63 - 1


@dataclass(frozen=True)
class MemoryLimit:
    bytes: int
    source: str
    """The cgroup file the limit came from, or /proc/meminfo (no limit: the machine's memory)."""


def _read_limit(path: Path) -> int | None:
    text = path.read_text().strip()
    if text == "max":
        return None
    value = int(text)
    return value if 0 < value < _V1_UNLIMITED else None


def cgroup_memory_limit(
    root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> MemoryLimit | None:
    """The smallest memory limit along this process's cgroup path (v2 or v1), or None."""
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError:
        return None
    best: MemoryLimit | None = None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            candidates = [cgroup_path(root, cg) / "memory.max" for cg in cgroup_ancestors(path)]
        elif "memory" in controllers.split(","):
            candidates = [
                cgroup_path(root / "memory", cg) / "memory.limit_in_bytes" for cg in cgroup_ancestors(path)
            ]
        else:
            continue
        for f in candidates:
            try:
                value = _read_limit(f)
            except (OSError, ValueError):
                continue
            if value is not None and (best is None or value < best.bytes):
                best = MemoryLimit(value, str(f))
    return best


def machine_memory(meminfo: Path = PROC_MEMINFO) -> MemoryLimit | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return MemoryLimit(int(line.split()[1]) * 1024, str(meminfo))
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_limit() -> MemoryLimit | None:
    """The pod's memory limit, else the machine's memory, else None (not Linux)."""
    return cgroup_memory_limit() or machine_memory()
