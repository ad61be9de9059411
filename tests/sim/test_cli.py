"""`epp sim` (epp.sim.cli): flags to per-pod configs, and a real process serving two pods.

The process test starts the command as a subprocess (as `epp sim` runs it), reads the startup
lines for the addresses, asks each pod for a completion and its metrics, and stops it with SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys

import aiohttp
import pytest

from epp.sim import cli
from epp.sim.profiles import get_profile

COMMAND = (
    "import argparse, sys; from epp.sim import cli; p = argparse.ArgumentParser(); cli.add_arguments(p); "
    "sys.exit(cli.run(p.parse_args(sys.argv[1:])))"
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_pods_count_ports_up_and_flags_override_the_profile() -> None:
    args = parse(
        "--pods", "3", "--served-model-name", "m", "--block-size", "32", "--num-blocks", "100",
        "--kv-events", "tcp://*:5557", "--kv-replay", "tcp://*:5600", "--max-num-seqs", "4",
        "--kv-events-encoding", "array", "--lora-modules", "a=/x", "b",
    )  # fmt: skip
    configs = cli.sim_configs(args)
    assert [c.kv_events for c in configs] == ["tcp://*:5557", "tcp://*:5558", "tcp://*:5559"]
    assert [c.kv_replay for c in configs] == ["tcp://*:5600", "tcp://*:5601", "tcp://*:5602"]
    p = configs[0].engine_profile()
    assert (p.block_size, p.num_gpu_blocks, p.max_num_seqs) == (32, 100, 4)
    assert p.max_model_len == 3168  # cut to what 99 usable blocks hold (100 less the null block)
    assert p.token_s == get_profile(cli.DEFAULT_PROFILE).token_s  # the profile's step costs
    assert configs[0].lora_adapters == ("a", "b") and configs[0].kv_encoding == "array"
    assert configs[0].served_model == "m" and configs[0].strict_models


def test_api_keys_from_the_flag_else_vllms_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert cli.sim_configs(parse())[0].api_keys == ()
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert cli.sim_configs(parse())[0].api_keys == ("from-env",)
    assert cli.sim_configs(parse("--api-key", "a", "b"))[0].api_keys == ("a", "b")  # the flag wins


def test_block_size_alone_keeps_the_kv_capacity_in_tokens() -> None:
    p = cli.build_profile(parse("--profile", "qwen3-32b-tp2-h100", "--block-size", "16"))
    assert p.kv_capacity_tokens == get_profile("qwen3-32b-tp2-h100").kv_capacity_tokens == 307_328


def test_kv_events_config_in_vllms_form() -> None:
    conf = '{"enable_kv_cache_events": true, "publisher": "zmq", "replay_endpoint": "tcp://*:7000"}'
    (c,) = cli.sim_configs(parse("--kv-events-config", conf))
    assert (c.kv_events, c.kv_replay) == ("tcp://*:5557", "tcp://*:7000")  # vLLM's default endpoint
    (off,) = cli.sim_configs(parse("--kv-events-config", '{"enable_kv_cache_events": false}'))
    assert off.kv_events is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-model-len", "100000"],  # more than the KV cache holds: vLLM refuses to start
        ["--pods", "2", "--kv-events", "inproc://x"],
        ["--kv-replay", "tcp://*:1"],
        ["--kv-events-config", "{nope"],
    ],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(parse(*argv)) == 2
    assert capsys.readouterr().err.startswith("epp sim: error: ")


async def test_two_pods_in_one_process_answer_and_stop_on_sigterm() -> None:
    argv = [
        "--host", "127.0.0.1", "--port", "0", "--pods", "2", "--served-model-name", "m",
        "--profile", "tiny", "--kv-events", "tcp://127.0.0.1:0", "--time-scale", "0.01",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", COMMAND, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not any("ready" in line for line in lines):
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            if not line:
                assert proc.stderr is not None
                raise AssertionError(f"epp sim exited: {lines} {(await proc.stderr.read()).decode()}")
            lines.append(line)
        pods = [re.search(r"on http://(\S+) \(kv-events (tcp://\S+?)[;,)]", line) for line in lines[:2]]
        addresses = [m.group(1) for m in pods if m]
        assert len(addresses) == 2 and len({m.group(2) for m in pods if m}) == 2, lines
        async with aiohttp.ClientSession() as http:
            for address in addresses:
                body = {"model": "m", "prompt": "hello", "max_tokens": 2}
                async with http.post(f"http://{address}/v1/completions", json=body) as r:
                    assert r.status == 200
                    assert r.headers["x-sim-server"] == address
                    assert (await r.json())["usage"]["completion_tokens"] == 2
                async with http.get(f"http://{address}/metrics") as r:
                    assert 'block_size="32"' in await r.text()  # the tiny profile's
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
