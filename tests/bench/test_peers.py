from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from epp.bench import cli
from epp.bench.gateways import PeerGateway
from epp.bench.peers import PEERS, Launch, peers_dir
from epp.bench.policies import POLICIES

AT = Launch(
    host="127.0.0.1",
    port=30000,
    metrics_port=29000,
    workers=["http://127.0.0.1:8001", "http://127.0.0.1:8002"],
    kv_events=["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"],
    block_size=16,
    model="sim-model",
)


def test_each_peer_runs_its_own_binary_at_its_defaults() -> None:
    smg = PEERS["smg"].argv(Path("/p"), AT)
    assert smg[:2] == ["/p/smg/bin/smg", "launch"]
    sglang = PEERS["sglang-router"].argv(Path("/p"), AT)
    assert sglang[:3] == ["/p/sglang-router/bin/python", "-m", "sglang_router.launch_router"]
    for argv in (smg, sglang, PEERS["vllm-router"].argv(Path("/p"), AT)):
        at = argv.index("--worker-urls")
        assert argv[at + 1 : at + 3] == list(AT.workers)
        assert argv[argv.index("--policy") + 1] == "cache_aware"
        assert argv[argv.index("--prometheus-port") + 1] == "29000"
        assert "--kv-event-source" not in argv


def test_kv_aware_reads_every_pods_events_and_the_pods_tokenizer() -> None:
    peer = PEERS["vllm-router-kv"]
    argv = peer.argv(Path("/p"), AT)
    assert argv[argv.index("--policy") + 1] == "kv_aware"
    sources = [argv[i + 1] for i, a in enumerate(argv) if a == "--kv-event-source"]
    assert sources == [
        "http://127.0.0.1:8001=tcp://127.0.0.1:5557",
        "http://127.0.0.1:8002=tcp://127.0.0.1:5558",
    ]
    assert argv[argv.index("--kv-event-block-size") + 1] == "16"
    assert peer.env()["VLLM_ROUTER_TOKENIZER"].endswith("tokenizer.json")
    with pytest.raises(ValueError, match="publishes none"):
        peer.argv(Path("/p"), dataclasses.replace(AT, kv_events=[None, None]))


def test_a_peer_not_installed_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="run `bash scripts/peers-env`"):
        PeerGateway(PEERS["smg"], tmp_path)


def test_peers_dir_follows_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPP_PEERS_DIR", "/from/env")
    assert peers_dir("/given") == Path("/given")
    assert peers_dir() == Path("/from/env")
    monkeypatch.delenv("EPP_PEERS_DIR")
    assert peers_dir() == Path(".venv-peers")


def test_peers_are_live_mode_arms() -> None:
    live = argparse.Namespace(policies="epp,peers", mode="live")
    assert cli.plan_policies(live) == [POLICIES["epp"], *PEERS.values()]
    with pytest.raises(cli.BenchConfigError, match="--mode live only"):
        cli.plan_policies(argparse.Namespace(policies="smg", mode="fast"))
    with pytest.raises(cli.BenchConfigError, match="real routers smg"):
        cli.plan_policies(argparse.Namespace(policies="nope", mode="live"))
