"""`epp serve` takes from an llm-d EndpointPickerConfig what llm-d's scheduler takes from it: the KV
events' mode and address (`kvEventsConfig`), and a tokenizer plugin naming a model it must serve."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from epp import cli, serve

LLMD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
BIND = (
    LLMD
    + "plugins:\n- type: precise-prefix-cache-scorer\n  parameters: {kvEventsConfig: {zmqEndpoint: 'tcp://*:7001'}}\n"
)
CONNECT = (
    LLMD
    + "plugins:\n- type: precise-prefix-cache-scorer\n"
    + "  parameters: {kvEventsConfig: {discoverPods: true, podDiscoveryConfig: {socketPort: 6001}}}\n"
)


def serve_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["serve", "--endpoints=127.0.0.1:1", *argv])


def test_the_configs_kv_events_settings_turn_kv_events_on() -> None:
    args = serve_args("--config-text", BIND)
    serve._kv_events_from_config(args)
    assert (args.kv_events, args.kv_events_bind) == ("bind", "tcp://*:7001")
    args = serve_args("--config-text", CONNECT)
    serve._kv_events_from_config(args)
    assert (args.kv_events, args.kv_events_port) == ("connect", 6001)
    same = serve_args("--config-text", CONNECT, "--kv-events", "connect", "--kv-events-port", "6001")
    serve._kv_events_from_config(same)
    assert (same.kv_events, same.kv_events_port) == ("connect", 6001)


def test_a_gie_config_leaves_kv_events_to_the_flags() -> None:
    args = serve_args("--config-text", LLMD + "plugins: [{type: queue-scorer}]\n")
    serve._kv_events_from_config(args)
    assert args.kv_events == "off"


@pytest.mark.parametrize(
    ("config", "flags", "said"),
    [
        (BIND, ["--kv-events", "connect"], "asks for bind mode"),
        (BIND, ["--kv-events-bind", "tcp://*:9999"], r"binds tcp://\*:7001"),
        (CONNECT, ["--kv-events-port", "7777"], "says 6001"),
    ],
)
def test_flags_that_contradict_the_config_stop_serve(config: str, flags: list[str], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        serve._kv_events_from_config(serve_args("--config-text", config, *flags))


def test_a_token_producer_naming_two_sources_is_refused_at_start() -> None:
    """A path and llm-d's render backend for one model: which would serve it is not epp's guess."""
    config = (
        LLMD + "plugins:\n- type: tokenizer\n  parameters: {modelName: my-llama, path: /t, vllm: {}}\n"
        "- type: queue-scorer\n"
    )
    command = [sys.executable, "-m", "epp", "serve", "--endpoints=127.0.0.1:1", "--secure-serving=false"]
    done = subprocess.run(
        [*command, "--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0", "--config-text", config],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "give one of path or vllm, not both" in done.stderr
