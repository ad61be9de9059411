"""`epp serve` takes from an llm-d EndpointPickerConfig what llm-d's scheduler takes from it: the KV
events' mode and address (`kvEventsConfig`), and a tokenizer plugin naming a model it must serve."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

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


# ---- llm-d's data layer and plugin stability at serve -------------------------------------------


def test_the_metrics_source_sets_the_scrape_and_a_contrary_flag_stops_serve() -> None:
    from epp.datastore.endpoints import Datastore
    from epp.scheduling import datalayer
    from epp.serve import scrape

    source = datalayer.MetricsScrape(scheme="https", path="/m", port=9100, interval=0.12)
    scraper = scrape.scraper(serve_args(), Datastore(), "p", source)
    assert (scraper._scheme, scraper._path, scraper._metrics_port) == ("https", "/m", 9100)
    assert scraper.interval == pytest.approx(0.1)  # a multiple of --refresh-metrics-interval (50ms)
    with pytest.raises(ValueError, match="--model-server-metrics-path=/other, but the config's"):
        scrape.scraper(serve_args("--model-server-metrics-path=/other"), Datastore(), "p", source)
    engines = datalayer.MetricsScrape(engines=scrape.DEFAULT_ENGINES)
    with pytest.raises(ValueError, match="give them one way"):
        scrape.scraper(serve_args("--total-queued-requests-metric=q"), Datastore(), "p", engines)
    flagged = scrape.scraper(
        serve_args("--total-queued-requests-metric=q"), Datastore(), "p", datalayer.MetricsScrape()
    )
    assert flagged._engines.default.queued is not None and flagged._engines.default.queued.name == b"q"


def _run_serve(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "epp", "serve", "--secure-serving=false"]
    return subprocess.run(
        [*command, "--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_alpha_plugin_needs_the_flag_at_serve() -> None:
    config = LLMD + "plugins: [{type: queue-scorer}, {type: agent-identity}]\n"
    done = _run_serve("--endpoints=127.0.0.1:1", "--config-text", config)
    assert done.returncode == 2, done.stderr
    assert "--allow-experimental-plugins is not set" in done.stderr


def test_file_discovery_replaces_the_endpoint_flags(tmp_path: Any) -> None:
    path = tmp_path / "eps.yaml"
    path.write_text('endpoints: [{name: a, address: "10.0.0.1", port: "8000"}]\n')
    config = (
        LLMD
        + "plugins:\n- {type: queue-scorer}\n"
        + f"- {{type: file-discovery, parameters: {{path: {str(path)!r}}}}}\n"
        + "dataLayer: {discovery: {pluginRef: file-discovery}}\n"
    )
    done = _run_serve("--endpoints=127.0.0.1:1", "--config-text", config)
    assert done.returncode == 2, done.stderr
    assert "the config's dataLayer.discovery lists the endpoints: drop --endpoints" in done.stderr


def test_a_worker_follows_the_supervisors_scrape_unless_the_config_says_otherwise() -> None:
    from epp.datastore.endpoints import Datastore
    from epp.datastore.scraper import MetricsScraper
    from epp.scheduling import datalayer
    from epp.serve import scrape
    from epp.workers.shared_metrics import MetricsFollower
    from epp.workers.worker import WorkerRole

    role = WorkerRole(0, "epp-test", -1, 4)
    # Listed without parameters, or repeating the flags: the supervisor's scrape is the same.
    for same in (
        datalayer.MetricsScrape(),
        datalayer.MetricsScrape(scheme="http", path="/metrics", engines=scrape.DEFAULT_ENGINES),
        datalayer.MetricsScrape(interval=0.05, models_path="/v1/models"),
    ):
        assert isinstance(scrape.scraper(serve_args(), Datastore(), "p", same, role), MetricsFollower)
    # A config that says otherwise: the worker scrapes itself, as the config says.
    source = datalayer.MetricsScrape(scheme="https", path="/m", interval=0.12)
    own = scrape.scraper(serve_args(), Datastore(), "p", source, role)
    assert isinstance(own, MetricsScraper) and not isinstance(own, MetricsFollower)
    # A contrary flag is the same error as in one process.
    with pytest.raises(ValueError, match="--model-server-metrics-path=/other, but the config's"):
        scrape.scraper(serve_args("--model-server-metrics-path=/other"), Datastore(), "p", source, role)
