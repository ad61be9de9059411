"""`--tracemalloc`: epp A's Python processes dump tracemalloc snapshots on a timer, and
`--diff OLD NEW` lists the allocation sites that grew between two of them."""

from __future__ import annotations

import os

from epp.bench.soak.config import SoakConfig

# With --tracemalloc, every Python process of epp (workers too) imports this at start (PYTHONPATH)
# and dumps a snapshot every N seconds, so the allocation sites that grow can be diffed.
_SITECUSTOMIZE = """
import os, threading, time, tracemalloc
_spec = os.environ.get("EPP_SOAK_TRACEMALLOC", "")
if _spec and tracemalloc.is_tracing():
    _every, _, _out = _spec.partition(":")

    def _dump():
        n = 0
        while True:
            time.sleep(float(_every))
            path = os.path.join(_out, f"tracemalloc-{os.getpid()}-{n:03d}.bin")
            tracemalloc.take_snapshot().dump(path)
            n += 1

    threading.Thread(target=_dump, daemon=True, name="soak-tracemalloc").start()
"""


def environment(cfg: SoakConfig) -> dict[str, str] | None:
    """The environment epp A runs in: the snapshot dumper on its PYTHONPATH and tracemalloc on;
    None (inherit) when --tracemalloc is off."""
    if not cfg.tracemalloc_every > 0:
        return None
    site = cfg.out / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "PYTHONTRACEMALLOC": "10",
        "EPP_SOAK_TRACEMALLOC": f"{cfg.tracemalloc_every}:{cfg.out}",
    }


def diff_snapshots(a: str, b: str, top: int = 25) -> str:
    """The allocation sites that grew most between two tracemalloc dumps."""
    import tracemalloc

    old, new = tracemalloc.Snapshot.load(a), tracemalloc.Snapshot.load(b)
    stats = new.compare_to(old, "traceback")
    lines = []
    for s in stats[:top]:
        lines.append(f"{s.size_diff / 1024:+9.1f} KiB {s.count_diff:+7d} blocks")
        lines.extend("      " + line for line in s.traceback.format(limit=8))
    return "\n".join(lines)
