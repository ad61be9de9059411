"""The real peer routers, as live-mode arms: the Rust binaries their projects ship on PyPI.

Each peer runs as the proxy in front of the same `epp sim` fleet epp's arm routes over, with the
same requests. They come from their own virtual environments, built by `scripts/peers-env` (each
its own: smg and sglang-router both install a `smg` script), under `.venv-peers/` at the working
directory, or where `--peers-dir` / `$EPP_PEERS_DIR` says.

Arms, each at its defaults as its documentation gives them (../shared/reference/peers-2026.md
section 9): the only flags set are the listening address, the workers and a private metrics port.

| arm | binary | policy |
|---|---|---|
| `smg` | smg 1.13.0 (SGLang's gateway) | `cache_aware` (its default), with its default overload veto |
| `sglang-router` | sglang-router 0.3.2 | `cache_aware` (its default) |
| `vllm-router` | vllm-router 0.1.17 | `cache_aware` (its default) |
| `vllm-router-kv` | vllm-router 0.1.17 | `kv_aware`, reading the fleet's KV events |

`vllm-router-kv` subscribes to every pod's KV-event publisher (`--kv-event-source URL=ENDPOINT`)
and tokenizes prompts with the pods' tokenizer (`VLLM_ROUTER_TOKENIZER`), as its documentation
asks.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from epp.tokenize.tokenizer import load_shipped

PEERS_DIR_ENV = "EPP_PEERS_DIR"
DEFAULT_PEERS_DIR = ".venv-peers"


@dataclasses.dataclass(frozen=True, slots=True)
class Launch:
    """Where a peer listens and what it routes to."""

    host: str
    port: int
    metrics_port: int
    workers: Sequence[str]  # http://host:port of each pod
    kv_events: Sequence[str | None]  # each pod's KV-event endpoint (None: it publishes none)
    block_size: int
    model: str


@dataclasses.dataclass(frozen=True, slots=True)
class Peer:
    name: str
    description: str
    venv: str  # its directory under the peers directory (scripts/peers-env builds it)
    package: str  # the pinned requirement scripts/peers-env installs
    policy: str
    kv_events: bool = False  # reads the fleet's KV events

    def argv(self, peers_dir: Path, at: Launch) -> list[str]:
        bin_dir = peers_dir / self.venv / "bin"
        common = [
            "--host", at.host, "--port", str(at.port), "--worker-urls", *at.workers,
            "--policy", self.policy, "--prometheus-host", at.host, "--prometheus-port", str(at.metrics_port),
        ]  # fmt: skip
        if self.venv == "smg":
            return [str(bin_dir / "smg"), "launch", *common, "--log-level", "warn"]
        if self.venv == "sglang-router":
            return [
                str(bin_dir / "python"),
                "-m",
                "sglang_router.launch_router",
                *common,
                "--log-level",
                "warn",
            ]
        out = [str(bin_dir / "vllm-router"), *common, "--log-level", "warning"]
        if self.kv_events:
            for worker, events in zip(at.workers, at.kv_events, strict=True):
                if events is None:
                    raise ValueError(f"{self.name} reads KV events, but {worker} publishes none")
                out += ["--kv-event-source", f"{worker}={events}"]
            out += ["--kv-event-block-size", str(at.block_size), "--kv-event-model", at.model]
        return out

    def env(self) -> dict[str, str]:
        """The environment it runs with: this process's, plus the tokenizer `kv_aware` reads."""
        env = dict(os.environ)
        if self.kv_events:
            shipped = load_shipped().path
            if shipped is not None:
                env["VLLM_ROUTER_TOKENIZER"] = str(shipped)
        return env

    def installed(self, peers_dir: Path) -> bool:
        return (peers_dir / self.venv / ".epp-peer-ready").is_file()


PEERS: dict[str, Peer] = {
    p.name: p
    for p in (
        Peer(
            "smg",
            "smg 1.13 (SGLang's gateway), cache_aware at its defaults",
            "smg",
            "smg==1.13.0",
            "cache_aware",
        ),
        Peer(
            "sglang-router",
            "sglang-router 0.3.2, cache_aware at its defaults",
            "sglang-router",
            "sglang-router==0.3.2",
            "cache_aware",
        ),
        Peer(
            "vllm-router",
            "vllm-router 0.1.17, cache_aware at its defaults",
            "vllm-router",
            "vllm-router==0.1.17",
            "cache_aware",
        ),
        Peer(
            "vllm-router-kv",
            "vllm-router 0.1.17, kv_aware over the fleet's KV events",
            "vllm-router",
            "vllm-router==0.1.17",
            "kv_aware",
            kv_events=True,
        ),
    )
}


def peers_dir(given: str | None = None) -> Path:
    """`--peers-dir`, else $EPP_PEERS_DIR, else .venv-peers in the working directory."""
    return Path(given or os.environ.get(PEERS_DIR_ENV) or DEFAULT_PEERS_DIR)
