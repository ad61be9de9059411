"""epp.malloc keeps the memory of one large body for the next: without it, every 16 MiB body was
copied into freshly faulted pages (issue 19)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_FAULTS = """
import os, resource, sys
from epp import malloc
if sys.argv[1] == "tuned":
    assert malloc.tune()
body = os.urandom(1 << 20) * 16
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    copy = bytes(bytearray(body))  # two 16 MiB buffers a round, freed before the next
    del copy
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, env: dict[str, str] | None = None) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True, env=env, timeout=60
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_malloc_reuses_freed_body_memory_instead_of_faulting_it_in_again() -> None:
    default, tuned = _faults("default"), _faults("tuned")
    # 20 rounds x 2 x 4096 pages faulted by default; once tuned, only the first round's.
    assert default > 20 * 4096
    assert tuned < default / 8, (default, tuned)


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from epp import malloc

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000")
    assert malloc.tune() is False
