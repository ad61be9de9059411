"""The soak's processes seen from outside: a restartable `epp sim` pod, and a process's RSS."""

from __future__ import annotations

import asyncio
import math
import time
import urllib.request

from epp.bench.soak.config import SoakConfig
from epp.gateway.processes import HOST, ManagedProcess, epp_command, stable_ports


class Pod:
    """One `epp sim` process on fixed ports, so a restart comes back where epp expects it."""

    def __init__(self, i: int, cfg: SoakConfig) -> None:
        # Bound only when the pod starts, and again after each kill: from below the ephemeral range,
        # where the other pods' proxies and connections cannot take them meanwhile.
        self.port, self.kv_port, self.replay_port = stable_ports(3)
        self.address = f"{HOST}:{self.port}"
        self.kv_upstream = f"tcp://{HOST}:{self.kv_port}"
        self.replay = f"tcp://{HOST}:{self.replay_port}"
        argv = [
            *epp_command(), "sim", "--port", str(self.port), "--time-scale", str(cfg.time_scale),
            "--kv-events", self.kv_upstream, "--kv-replay", self.replay,
        ]  # fmt: skip
        self.process = ManagedProcess(f"pod-{i}", argv, cfg.out / f"pod-{i}.log")

    async def start(self, within: float = 120.0) -> None:
        self.process.start()
        deadline = time.monotonic() + within
        while not await asyncio.to_thread(_answers, f"http://{self.address}/health"):
            if time.monotonic() > deadline or not self.process.alive():
                raise RuntimeError(
                    f"{self.process.name} did not start (see {self.process.log_path}):\n"
                    + self.process.log_text(4_000)
                )
            await asyncio.sleep(0.1)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, RssAnon) of `pid` in MB. RssAnon (heap and other private memory) is what a leak
    grows; VmRSS also counts shared-library pages, which a busy machine evicts and reloads."""
    rss = anon = math.nan
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1]) / 1024
    return rss, anon
