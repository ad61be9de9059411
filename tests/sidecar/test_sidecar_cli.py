"""`epp sidecar` with llm-d v0.10's routing-sidecar flags: a decode pod's `routing-sidecar`
container runs it with the arguments llm-d's manifests give it."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from epp import certs
from epp.sidecar import cli, protocol
from tests.sidecar.fake_vllm import FakeVllm

BODY = {"model": "tiny", "prompt": [1, 5, 9, 13, 77], "max_tokens": 5, "temperature": 0}


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_llm_d_decode_manifest_arguments() -> None:
    # llm-d v0.10, deploy/environments/dev/p-d/patch-decode.yaml's routing-sidecar arguments.
    args = _args(
        "--port=8000",
        "--kv-connector=nixlv2",
        "--mooncake-bootstrap-port=8000",
        "--secure-proxy=false",
        "--data-parallel-size=4",
    )
    listeners = cli.listeners_from(args)
    assert [item.port for item in listeners] == [8000, 8001, 8002, 8003]
    assert [item.settings.decoder_url for item in listeners] == [
        f"http://127.0.0.1:{8200 + rank}" for rank in range(4)
    ]
    assert cli.server_tls(args) is None


def test_model_server_port_and_its_older_name() -> None:
    assert cli.listeners_from(_args("--vllm-port=8300"))[0].settings.decoder_url == "http://127.0.0.1:8300"
    both = _args("--vllm-port=8300", "--model-server-port=8400")
    assert cli.listeners_from(both)[0].settings.decoder_url == "http://127.0.0.1:8400"
    ranks = cli.listeners_from(_args("--decoder-url=http://10.0.0.5:9000/", "--data-parallel-size=2"))
    assert [item.settings.decoder_url for item in ranks] == ["http://10.0.0.5:9000/", "http://10.0.0.5:9001/"]
    with pytest.raises(ValueError, match="65535"):
        cli.listeners_from(_args("--port=65535", "--data-parallel-size=2"))


def test_tls_legs() -> None:
    args = _args("--enable-tls=prefiller,decoder", "--tls-insecure-skip-verify", "decoder")
    (listener,) = cli.listeners_from(args)
    settings = listener.settings
    assert settings.decoder_url == "https://127.0.0.1:8200"
    assert settings.prefill_tls and settings.prefill_verify and not settings.decoder_verify
    with pytest.raises(ValueError, match="https --decoder-url"):
        cli.listeners_from(_args("--enable-tls=decoder", "--decoder-url=http://127.0.0.1:8200"))
    with pytest.raises(SystemExit):
        _args("--enable-tls=decode")  # not a stage name: argparse's usage error


@pytest.mark.parametrize(
    "flag",
    [
        "--kv-connector=mooncake",
        "--ec-connector=nixl",
        "--enable-ssrf-protection",
        "--enable-p2p-pull=true",
        "--decode-chunk-size=256",
        "--moriio-write-mode",
        "--tracing",
    ],
)
def test_what_it_does_not_do_is_refused(flag: str) -> None:
    with pytest.raises(ValueError, match=flag.split("=")[0]):
        cli.listeners_from(_args(flag))


def test_configuration_sets_the_flags_the_command_line_does_not(tmp_path: Path) -> None:
    argv = ["--configuration={port: 8085, model-server-port: 8203, secure-proxy: false,"
            " enable-tls: [prefiller], prefill-max-retries: 0}", "--port=9000"]  # fmt: skip
    args = cli.with_configuration(_args(*argv), argv)
    (listener,) = cli.listeners_from(args)
    assert listener.port == 9000  # the command line wins
    assert listener.settings.decoder_url == "http://127.0.0.1:8203"
    assert listener.settings.prefill_tls and listener.settings.prefill_max_retries == 0
    assert cli.server_tls(args) is None
    argv = ["--configuration={model-server-port: 8203}", "--vllm-port=8300"]
    assert cli.listeners_from(cli.with_configuration(_args(*argv), argv))[0].settings.decoder_url.endswith(
        ":8300"
    )
    config = tmp_path / "sidecar.yaml"
    config.write_text("data-parallel-size: 2\nkv-connector: nixlv2\n")
    argv = [f"--configuration-file={config}"]
    assert len(cli.listeners_from(cli.with_configuration(_args(*argv), argv))) == 2
    for argv, match in (
        ([f"--configuration-file={config}", "--configuration={port: 1}"], "mutually exclusive"),
        (["--configuration={port: 1, bogus: 2}"], "unknown keys bogus"),
        (["--configuration=[1, 2]"], "a mapping"),
        ([f"--configuration-file={tmp_path / 'missing.yaml'}"], "missing.yaml"),
    ):
        with pytest.raises(ValueError, match=match):
            cli.with_configuration(_args(*argv), argv)


def test_flags_for_paths_it_does_not_run_are_taken() -> None:
    args = _args(
        "--inference-pool=ns/pool",
        "--pool-group=inference.networking.x-k8s.io",
        "--enable-ssrf-protection=false",
        "--max-idle-conns-per-host=64",
        "--p2p-connector-port=7000",
        "--moriio-tp-size=2",
        "--moriio-remote-hosts=a,b",
        "--moriio-parallel-decode-wait-timeout=10s",
    )
    assert cli.refusals(args) == [] and len(cli.listeners_from(args)) == 1


def test_logging_flags_and_sampling_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.log_level(_args("--zap-log-level=debug")) == "debug"
    assert cli.log_level(_args("-v", "4")) == "debug"
    assert cli.log_level(_args("--zap-log-level=3", "--log-level=error")) == "info"
    assert cli.log_level(_args()) == "info"
    assert not cli.listeners_from(_args())[0].settings.prefiller_sampling
    monkeypatch.setenv("ENABLE_PREFILLER_SAMPLING", "true")
    assert cli.listeners_from(_args())[0].settings.prefiller_sampling


def test_prefiller_sampling_picks_among_the_hosts() -> None:
    hosts = ["10.0.0.1:8000,10.0.0.2:8000", "10.0.0.3:8000"]
    assert protocol.prefiller(hosts) == "10.0.0.1:8000"
    seen = {protocol.prefiller(hosts, sample=True) for _ in range(200)}
    assert seen == {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
    assert protocol.prefiller([], sample=True) is None
    assert protocol.prefiller(["https://10.0.0.4:8000"]) == "10.0.0.4:8000"


def test_rank_header() -> None:
    assert protocol.rank_port("10.0.0.1:8001", "") == 8001
    assert protocol.rank_port("10.0.0.1:8001", "10.0.0.1") == 8001
    assert protocol.rank_port("10.0.0.2:8001", "10.0.0.1") is None  # another pod's rank
    assert protocol.rank_port("[fd00::1]:8002", "fd00::1") == 8002
    assert protocol.rank_port("8001", "") is None
    listeners = cli.listeners_from(_args("--data-parallel-size=2", "--secure-proxy=false"))
    assert listeners[0].settings.rank_decoders == {
        8000: "http://127.0.0.1:8200",
        8001: "http://127.0.0.1:8201",
    }
    assert listeners[1].settings.rank_decoders == {}


def _free_ports(count: int) -> int:
    """A base port with `count` free ports in a row."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        taken = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                taken.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in taken:
                sock.close()
    raise RuntimeError("no free ports in a row")


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"epp sidecar exited {proc.returncode}: {log.read_text()}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"epp sidecar did not listen on {port}: {log.read_text()}")


def _start(flags: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "epp", "sidecar", "--host=127.0.0.1", *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


class Fleet:
    def __init__(self, decoders: list[FakeVllm], prefill: FakeVllm, port: int) -> None:
        self.decoders, self.prefill, self.port = decoders, prefill, port


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    """Two data-parallel ranks of a decode pod and a prefill pod that serves HTTPS, behind a real
    `epp sidecar` process started as llm-d's manifests start theirs (TLS on its own ports)."""
    model_port, sidecar_port = _free_ports(2), _free_ports(2)
    decoders = [FakeVllm(f"decode-{rank}") for rank in range(2)]
    for rank, decoder in enumerate(decoders):
        await decoder.start(port=model_port + rank)
    key, cert = certs.self_signed()
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    prefill_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    prefill_tls.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    prefill = FakeVllm("prefill")
    await prefill.start(ssl_context=prefill_tls)
    log = tmp_path / "sidecar.log"
    proc = _start(
        [f"--port={sidecar_port}", f"--model-server-port={model_port}", "--data-parallel-size=2",
         "--kv-connector=nixlv2", "--enable-tls=prefiller", "--tls-insecure-skip-verify=prefiller",
         f"--cert-path={tmp_path}", "--max-idle-conns-per-host=64", "--zap-log-level=debug"],
        log,
    )  # fmt: skip
    try:
        for rank in range(2):
            await asyncio.to_thread(_wait_listening, sidecar_port + rank, proc, log)
        yield Fleet(decoders, prefill, sidecar_port)
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)
        for pod in (*decoders, prefill):
            await pod.stop()


async def test_each_rank_splits_over_tls(fleet: Fleet, tmp_path: Path) -> None:
    # The client checks the sidecar's certificate: the pair given with --cert-path.
    client_tls = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
    headers = {protocol.PREFILL_HEADER: fleet.prefill.hostport}
    async with aiohttp.ClientSession() as client:
        for rank in range(2):
            url = f"https://127.0.0.1:{fleet.port + rank}/v1/completions"
            async with client.post(url, json=BODY, headers=headers, ssl=client_tls) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers[protocol.PREFILL_RESULT_HEADER] == fleet.prefill.hostport
                assert len(json.loads(await resp.read())["choices"][0]["token_ids"]) == 5
        # llm-d's deprecated rank header: the first rank's port relays to the rank it names.
        base = f"https://127.0.0.1:{fleet.port}/v1/completions"
        rank_1 = {protocol.DATA_PARALLEL_HEADER: f"127.0.0.1:{fleet.port + 1}"}
        async with client.post(base, json=BODY, headers=rank_1, ssl=client_tls) as resp:
            assert resp.status == 200
        no_rank = {protocol.DATA_PARALLEL_HEADER: f"127.0.0.1:{fleet.port + 7}"}
        async with client.post(base, json=BODY, headers=no_rank, ssl=client_tls) as resp:
            assert resp.status == 400 and "names no rank" in await resp.text()
        with pytest.raises(aiohttp.ClientConnectionError):  # no plain HTTP on a TLS port
            async with client.get(f"http://127.0.0.1:{fleet.port}/health") as resp:
                await resp.read()
    # Rank r's decode leg went to the model server's port + r (and the rank header's request to
    # rank 1's); both prefills to the TLS pod.
    assert [len(decoder.seen) for decoder in fleet.decoders] == [1, 2]
    assert all(d.seen[0].body["kv_transfer_params"]["do_remote_prefill"] for d in fleet.decoders)
    assert len(fleet.prefill.seen) == 2


def test_a_refused_flag_stops_it_with_the_reason() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        done = subprocess.run(
            [sys.executable, "-m", "epp", "sidecar", "--port=1", "--enable-ssrf-protection",
             "--inference-pool=p"],
            capture_output=True, text=True, timeout=60, cwd=tmp, env=env,
        )  # fmt: skip
    assert done.returncode == 2
    assert "--enable-ssrf-protection" in done.stderr and "llm-d's routing sidecar" in done.stderr
