"""`epp serve`: wire the datastore, its sources, the scheduler, the director and the servers.

Start order: tokenizers and config (fail fast on a bad one) -> endpoint sources -> KV-event
ingestion -> metrics scraper -> servers.
Stop order on SIGTERM/SIGINT: health goes NOT_SERVING, the ext-proc server drains in-flight
streams for a grace period, then background tasks stop.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import zmq

from epp.datastore import standalone
from epp.datastore.endpoints import Datastore, Endpoint
from epp.datastore.scraper import MetricsScraper
from epp.extproc import server as extproc_server
from epp.extproc import tls
from epp.kvcache.index import BlockIndex
from epp.kvcache.ingest import FeedSpec, KVEventIngester
from epp.observability import http as obs_http
from epp.observability import logs, metrics
from epp.requestcontrol.director import Director, DirectorSettings
from epp.rpc import http as rpc_http
from epp.rpc import service as rpc_service
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.tokenize.registry import Tokenizers, parse_tokenizer_arg
from epp.tokenize.tokenizer import TokenizerError

log = logging.getLogger("epp")

DRAIN_GRACE_S = 5.0


def main(args: argparse.Namespace) -> int:
    logs.setup(level=args.log_level, fmt=args.log_format)
    try:
        asyncio.run(run(args))
    except sched_config.ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    except (ValueError, OSError, TokenizerError, zmq.ZMQError) as exc:
        # ZMQError (e.g. --kv-events-bind on a port in use) is not an OSError.
        log.error("cannot start: %s", exc)
        return 2
    return 0


def feed_spec(ep: Endpoint, args: argparse.Namespace) -> FeedSpec:
    """Where `ep`'s KV events come from: its entry's kvEvents/kvReplay, else the default ports
    offset by its data-parallel rank (vLLM's DP ranks publish on base port + rank)."""
    spec = ep.spec
    host = f"[{spec.address}]" if ":" in spec.address else spec.address
    events = None
    if args.kv_events == "connect":
        events = spec.kv_events or f"tcp://{host}:{args.kv_events_port + spec.rank}"
    replay = spec.kv_replay
    if replay is None and args.kv_replay_port is not None:
        replay = f"tcp://{host}:{args.kv_replay_port + spec.rank}"
    return FeedSpec(
        pod=ep.name, model=spec.model, events=events, replay=replay, hostport=ep.hostport, rank=spec.rank
    )


async def run(args: argparse.Namespace) -> None:
    datastore = Datastore()
    index = BlockIndex(max_entries=args.kv_index_max_entries) if args.kv_events != "off" else None
    handle = Handle(datastore=datastore, kv_index=index)
    tokenizers = Tokenizers.from_spec(parse_tokenizer_arg(args.tokenizer), workers=args.tokenizer_workers)
    collector = metrics.TokenizerCollector(lambda: tokenizers.missing, lambda: tokenizers.truncated)
    metrics.REGISTRY.register(collector)
    try:
        await _run(args, datastore, handle, tokenizers)
    finally:
        metrics.REGISTRY.unregister(collector)
        tokenizers.close()


async def _run(
    args: argparse.Namespace, datastore: Datastore, handle: Handle, tokenizers: Tokenizers
) -> None:
    if args.config_file:
        config = sched_config.load_config_file(args.config_file, handle)
    else:
        config = sched_config.load_config(args.config_text, handle)
    for warning in config.warnings:
        log.warning("config: %s", warning)

    director = Director(
        datastore=datastore,
        scheduler=config.scheduler,
        pre_request=config.pre_request,
        response_complete=config.response_complete,
        settings=DirectorSettings(
            max_body_bytes=args.max_body_bytes,
            disable_subset_filter=args.disable_endpoint_subset_filter,
        ),
        tokenizer=tokenizers,
    )

    pool_gauge = metrics.ready_endpoints.labels(args.pool_name)
    datastore.subscribe(lambda added, removed: pool_gauge.set(len(datastore.candidates())))
    ingester: KVEventIngester | None = None
    if handle.kv_index is not None:
        ingester = KVEventIngester(
            handle.kv_index,
            bind=args.kv_events_bind if args.kv_events == "bind" else None,
            default_block_size=args.kv_block_size,
        )
        feeds = ingester

        def follow_membership(added: list[Endpoint], removed: list[Endpoint]) -> None:
            # Every change re-states the whole set: the ingester reconciles (new, gone, moved).
            feeds.set_feeds(feed_spec(ep, args) for ep in datastore.endpoints())

        datastore.subscribe(follow_membership)
    endpoints_file: standalone.EndpointsFile | None = None
    if args.endpoints:
        datastore.sync("flag", standalone.parse_endpoints_arg(args.endpoints))
    if args.endpoints_file:
        endpoints_file = standalone.EndpointsFile(args.endpoints_file, datastore)
        endpoints_file.load()
    if not args.endpoints and not args.endpoints_file:
        raise ValueError("no endpoint source: give --endpoints or --endpoints-file")
    pool_gauge.set(len(datastore.candidates()))
    if ingester is not None:
        ingester.set_feeds(feed_spec(ep, args) for ep in datastore.endpoints())

    scraper = MetricsScraper(
        datastore,
        interval=args.refresh_metrics_interval,
        staleness=args.metrics_staleness_threshold,
        failure_threshold=args.scrape_failure_threshold,
        pool_name=args.pool_name,
    )

    health = extproc_server.Health()
    credentials = tls.server_credentials(args.cert_path) if args.secure_serving else None
    grpc_server = extproc_server.build_server(
        director, health, bind=args.bind_address, port=args.grpc_port, credentials=credentials
    )
    health_server = extproc_server.build_health_server(
        health, bind=args.bind_address, port=args.grpc_health_port
    )
    rpc_service.add_to_server(grpc_server, director)
    app = obs_http.build_app()
    rpc_http.add_routes(app, director)
    http_runner = await obs_http.start(app, host=args.bind_address, port=args.metrics_port)

    if ingester is not None:
        await ingester.start()
    await scraper.start()
    if endpoints_file is not None:
        await endpoints_file.start()
    await grpc_server.start()
    await health_server.start()
    await health.set(datastore.synced)
    log.info(
        "epp serving",
        extra={
            "grpc_port": args.grpc_port,
            "health_port": args.grpc_health_port,
            "metrics_port": args.metrics_port,
            "tls": bool(args.secure_serving),
            "endpoints": len(datastore.endpoints()),
            "profiles": ",".join(config.scheduler.profile_names()),
            "kv_events": args.kv_events,
            "tokenizers": _tokenizer_names(tokenizers),
        },
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("stopping: draining ext-proc streams for up to %.0fs", DRAIN_GRACE_S)
        await health.set(False)
        await grpc_server.stop(DRAIN_GRACE_S)
        await health_server.stop(0)
        if endpoints_file is not None:
            await endpoints_file.stop()
        await scraper.stop()
        if ingester is not None:
            await ingester.stop()
        await http_runner.cleanup()


def _tokenizer_names(tokenizers: Tokenizers) -> str:
    names = [f"{model}={tok.name}" for model, tok in sorted(tokenizers.models.items())]
    if tokenizers.default is not None:
        names.append(f"*={tokenizers.default.name}")
    return ",".join(names) or "none"
