"""The parts of `epp serve`, built from its flags and config, started in order and stopped in reverse.

See `epp.serve` for the start and stop order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging

import grpc

from epp import drain, garbage, tasks
from epp.api.context_length import ContextLimits
from epp.api.limits import RequestLimits
from epp.datastore import standalone
from epp.datastore.dcgm import DcgmPoller
from epp.datastore.endpoints import Datastore
from epp.datastore.file_discovery import FileDiscovery
from epp.datastore.model_rewrites import ModelRewriteStore
from epp.extproc import server as extproc_server
from epp.extproc import tls
from epp.extproc.limits import StreamGuard, StreamLimits, sized_limits
from epp.flags import extproc as flags_extproc
from epp.flags.serve import response_sampling
from epp.flowcontrol import controller as flowcontrol
from epp.k8s import connections as k8s_connections
from epp.k8s import metricsauth as k8s_metricsauth
from epp.k8s import objectives as k8s_objectives
from epp.k8s.from_flags import kubernetes_source, leader_elector
from epp.k8s.operator import PoolOperator
from epp.kvcache.index import BlockIndex
from epp.kvcache.ingest import KVEventIngester
from epp.observability import collectors, metrics, metrics_tls
from epp.observability import http as obs_http
from epp.observability.looplag import LoopLagMonitor
from epp.prewarm import sender as prewarm_sender
from epp.requestcontrol import admission
from epp.requestcontrol.director import Director, DirectorSettings, plugin_hooks
from epp.requestcontrol.offload import BodyParsers
from epp.rpc import http as rpc_http
from epp.rpc import service as rpc_service
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.serve import scrape
from epp.tokenize import registry as tokenize_registry
from epp.tokenize.registry import Tokenizers
from epp.tokenize.render import Renderer
from epp.workers import memory as workers_memory
from epp.workers import shared_kv
from epp.workers import worker as workers_worker

log = logging.getLogger("epp")


async def run_until_stopped(
    args: argparse.Namespace,
    datastore: Datastore,
    handle: Handle,
    tokenizers: Tokenizers,
    role: workers_worker.WorkerRole | None = None,
    parsers: BodyParsers | None = None,
) -> None:
    """Build every part, start them in order, serve until a signal, then stop them in reverse
    (an AsyncExitStack: a part that started is stopped, also when a later one fails to start)."""
    config = _load_config(args, handle, tokenizers)
    objective_store = k8s_objectives.ObjectiveStore()
    rewrite_store = ModelRewriteStore()  # filled by the pool operator (Kubernetes only, as llm-d)
    pool_label = args.pool_name or "standalone"
    # llm-d's token-producer with its vllm backend: the models' ids from the pods' /render (or
    # the url it names), for models no local tokenizer is named for.
    renderer = (
        Renderer(config.render, lambda: [ep.hostport for ep in datastore.routable()])
        if config.render
        else None
    )
    director = _director(
        args, config, datastore, tokenizers, (objective_store, rewrite_store), parsers, pool_label, renderer
    )
    flow = director.flow_control
    pool_gauge = metrics.ready_endpoints.labels(pool_label)
    datastore.subscribe(lambda added, removed: pool_gauge.set(len(datastore.routable())))
    ingester = _kv_ingester(args, handle, datastore)
    endpoints_file, pool_operator, discovery = _endpoint_sources(
        args, datastore, tokenizers, config, objective_store, rewrite_store
    )
    elector: workers_worker.Lease | None = role.lease if role is not None else None
    if role is None:
        elector = leader_elector(args, pool_operator)
    pool_gauge.set(len(datastore.routable()))
    if ingester is not None:
        ingester.set_feeds(shared_kv.feed_spec(ep, args) for ep in datastore.endpoints())
    booked = 0.0 if flowcontrol.dispatch_reads_scrapes(flow) else args.booked_metrics_interval
    metrics_source = scrape.scraper(args, datastore, pool_label, config.data_layer.metrics, role, booked)
    dcgm = [
        DcgmPoller(
            datastore,
            dataclasses.replace(src, interval=scrape.tick(src.interval, args.refresh_metrics_interval)),
        )
        for src in config.data_layer.dcgm
    ]
    health = extproc_server.Health()
    grpc_server = _grpc_server(args, director, health, role)
    # A worker's health port is its supervisor's.
    health_server = (
        extproc_server.build_health_server(health, bind=args.bind_address, port=args.grpc_health_port)
        if role is None
        else None
    )
    if args.enable_debug_api:  # the gRPC twin of /debug/*: UNIMPLEMENTED without the flag
        rpc_service.add_to_server(grpc_server, director)

    received: list[int] = []  # the first signal decides the drain delay (epp.drain)
    async with contextlib.AsyncExitStack() as running:
        if role is not None:
            running.push_async_callback(role.close)  # last: the supervisor hears of the drain's end
        if renderer is not None:
            running.push_async_callback(renderer.close)
            render_metrics = collectors.RenderCollector(renderer)
            metrics.REGISTRY.register(render_metrics)
            running.callback(metrics.REGISTRY.unregister, render_metrics)
        if isinstance(director.prewarmer, prewarm_sender.Sender):
            running.push_async_callback(director.prewarmer.close)
        await _start_http(args, director, role, running)
        for part in (ingester, metrics_source, endpoints_file, discovery, *dcgm):
            if part is not None:
                await part.start()
                running.push_async_callback(part.stop)
        if pool_operator is not None:
            await pool_operator.start()
            running.push_async_callback(pool_operator.stop)
            try:  # usually listed within milliseconds; if not, serve NOT_SERVING until it is
                await asyncio.wait_for(pool_operator.wait_synced(), 5.0)
            except TimeoutError:
                log.warning("%s: not synced yet; health stays NOT_SERVING until it is", pool_operator.source)
        loop_lag = LoopLagMonitor(args.event_loop_lag_interval)
        await loop_lag.start()
        running.push_async_callback(loop_lag.stop)
        await grpc_server.start()
        if health_server is not None:
            await health_server.start()
            running.push_async_callback(health_server.stop, 0)

        async def drain_streams() -> None:
            delay = drain.delay_for(received[0] if received else None, args.drain_delay)
            # Held requests keep being dispatched while streams drain; those still held when the
            # drain ends are answered 503 (flow control closes) rather than cut.
            await drain.drain(grpc_server, args.drain_timeout, delay, before_cut=flow.close if flow else None)

        running.push_async_callback(drain_streams)
        if flow is not None:
            flow.register_metrics()
            running.callback(flow.unregister_metrics)
        stop = asyncio.Event()
        if role is not None:
            await role.connect(on_lost=stop.set)
            await role.report(started=True)
        # Start-up is over: its one full collection runs before the pod reports ready, not
        # while the first requests wait on the loop.
        garbage.settle()
        await _follow_readiness(datastore, pool_operator, elector, health, role, running)
        _log_serving(args, datastore, config, tokenizers, director)

        def on_signal(signum: int) -> None:
            received.append(signum)
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in drain.SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        await stop.wait()


def _load_config(
    args: argparse.Namespace, handle: Handle, tokenizers: Tokenizers
) -> sched_config.SchedulerConfig:
    allow = bool(args.allow_experimental_plugins)
    if args.config_file:
        config = sched_config.load_config_file(args.config_file, handle, allow_experimental=allow)
    else:
        config = sched_config.load_config(args.config_text, handle, allow_experimental=allow)
    for warning in config.warnings:
        log.warning("config: %s", warning)
    if config.tokenizers:
        tokenizers.load_models(tokenize_registry.CONFIG, config.tokenizers)
    return config


def _director(
    args: argparse.Namespace,
    config: sched_config.SchedulerConfig,
    datastore: Datastore,
    tokenizers: Tokenizers,
    stores: tuple[k8s_objectives.ObjectiveStore, ModelRewriteStore],
    parsers: BodyParsers | None,
    pool_label: str,
    renderer: Renderer | None = None,
) -> Director:
    objective_store, rewrite_store = stores
    detector, flow, warnings = flowcontrol.from_scheduler_config(
        config, datastore.candidates, pool_name=pool_label
    )
    for warning in warnings:
        log.warning("config: %s", warning)
    if flow is not None:
        log.info(
            "flow control on: defaultRequestTTL %gs, noEndpointRequestTTL %gs, usage limit %s, detector %s",
            flow.config.default_request_ttl,
            flow.config.no_endpoint_request_ttl,
            flow.config.usage_limit.type,
            detector.name,
        )
    return Director(
        datastore=datastore,
        scheduler=config.scheduler,
        **plugin_hooks(config),
        settings=DirectorSettings(
            max_body_bytes=args.max_body_bytes,
            limits=RequestLimits(
                max_messages=args.max_request_messages,
                max_content_parts=args.max_request_content_parts,
                max_tools=args.max_request_tools,
                max_json_depth=args.max_request_json_depth,
            ),
            disable_subset_filter=args.disable_endpoint_subset_filter,
            **response_sampling(args),
            trust_model_rewrite_header=bool(args.trust_model_name_rewrite_header),
            parsers=config.parsers,
            emit_endpoint_scores=bool(args.emit_endpoint_scores),
        ),
        tokenizer=tokenizers,
        admission_controller=admission.LegacyAdmissionController(detector),
        objectives=objective_store,
        context_limits=_context_limits(args, datastore, tokenizers),
        body_parsers=parsers,
        flow_control=flow,
        rewrites=rewrite_store,
        renderer=renderer,
        # Pre-warms go to the serving port, on the scheme (and certificate check) the pods'
        # /metrics are read with.
        prewarmer=prewarm_sender.Sender(
            scheme=args.model_server_metrics_scheme,
            verify=args.model_server_metrics_https_insecure_skip_verify is False,
        ),
    )


def _kv_ingester(args: argparse.Namespace, handle: Handle, datastore: Datastore) -> KVEventIngester | None:
    """The KV-event ingestion feeding `handle.kv_index`; none for a worker, which reads its
    supervisor's index (epp.workers.shared_kv)."""
    if not isinstance(handle.kv_index, BlockIndex):
        return None
    return shared_kv.kv_ingester(
        args,
        handle.kv_index,
        datastore,
        routed_tokens=lambda pod: ep.routed_tokens if (ep := datastore.get(pod)) is not None else 0,
    )


def _endpoint_sources(
    args: argparse.Namespace,
    datastore: Datastore,
    tokenizers: Tokenizers,
    config: sched_config.SchedulerConfig,
    objective_store: k8s_objectives.ObjectiveStore,
    rewrite_store: ModelRewriteStore,
) -> tuple[standalone.EndpointsFile | None, PoolOperator | None, FileDiscovery | None]:
    """The flag's endpoints (synced now), the endpoints file (loaded now), the Kubernetes pool
    operator (started later) or the config's file discovery (loaded now); the tokenizers they
    and the config name, epp-tiny if none."""
    discovery: FileDiscovery | None = None
    if config.data_layer.discovery is not None:
        # llm-d: a discovery plugin replaces Kubernetes; --pool-name only names the pool.
        if args.endpoints or args.endpoints_file or args.endpoint_selector:
            raise ValueError(
                "the config's dataLayer.discovery lists the endpoints: drop --endpoints, "
                "--endpoints-file and --endpoint-selector"
            )
        discovery = FileDiscovery(config.data_layer.discovery, datastore)
        discovery.load()
    endpoints_file: standalone.EndpointsFile | None = None
    if args.endpoints:
        datastore.sync("flag", standalone.parse_endpoints_arg(args.endpoints))
    if args.endpoints_file:
        endpoints_file = standalone.EndpointsFile(
            args.endpoints_file,
            datastore,
            tokenizers=tokenizers.source(
                tokenize_registry.ENDPOINTS_FILE, origin=f"endpoints file {args.endpoints_file}"
            ),
            objectives=objective_store,  # standalone: the file's `objectives:` give priorities
        )
        endpoints_file.load()
    if config.stand_in or (not args.tokenizer and not tokenizers.models and not config.render):
        # nothing named anywhere (or llm-d's estimate backend asked for): epp-tiny stands in
        tokenizers.use_shipped_default()
    pool_operator = (
        None if discovery is not None else kubernetes_source(args, datastore, objective_store, rewrite_store)
    )
    if not args.endpoints and not args.endpoints_file and pool_operator is None and discovery is None:
        raise ValueError(
            "no endpoint source: give --pool-name, --endpoint-selector, --endpoints or --endpoints-file"
        )
    return endpoints_file, pool_operator, discovery


def _grpc_server(
    args: argparse.Namespace,
    director: Director,
    health: extproc_server.Health,
    role: workers_worker.WorkerRole | None,
) -> grpc.aio.Server:
    credentials: grpc.ServerCredentials | None = None
    if args.secure_serving and role is not None and role.tls_pair is not None:
        credentials = grpc.ssl_server_credentials([role.tls_pair])  # the pod's, from the supervisor
    elif args.secure_serving:
        credentials = tls.server_credentials(args.cert_path, reload=bool(args.enable_cert_reload))
    max_receive, max_send = flags_extproc.grpc_message_limits(args)
    return extproc_server.build_server(
        director,
        health,
        bind=args.bind_address,
        port=args.grpc_port,
        credentials=credentials,
        reuse_port=role is not None,
        max_receive_message=max_receive,
        max_send_message=max_send,
        stream_metrics=bool(args.enable_grpc_stream_metrics),
        guard=StreamGuard(
            StreamLimits(
                **_memory_limits(args, role),
                request_body_timeout=args.request_body_timeout,
                large_body_bytes=args.large_body_min_bytes,
                large_body_lanes=args.max_concurrent_large_bodies,
                large_body_rate=args.large_body_rate,
                max_unfinished_bodies_per_connection=args.max_unfinished_bodies_per_connection,
                max_buffered_body_bytes_per_connection=args.max_buffered_body_bytes_per_connection,
            )
        ),
    )


def _memory_limits(args: argparse.Namespace, role: workers_worker.WorkerRole | None) -> dict[str, int]:
    """--max-buffered-body-bytes and --max-concurrent-streams, each sized from the pod's memory
    limit unless given (`epp.extproc.limits.sized_limits`: a share per worker, less what every
    process and body parser holds)."""
    given = {
        "max_buffered_body_bytes": args.max_buffered_body_bytes,
        "max_concurrent_streams": args.max_concurrent_streams,
    }
    if None not in given.values():
        return given
    limit = workers_memory.memory_limit()
    defaults = StreamLimits()
    sized = (defaults.max_buffered_body_bytes, defaults.max_concurrent_streams)
    processes = role.workers if role is not None else 1
    if limit is not None:
        sized = sized_limits(limit.bytes, processes, args.body_parser_processes)
    out = {k: v if v is not None else d for (k, v), d in zip(given.items(), sized, strict=True)}
    if role is None or role.index == 0:
        log.info(
            "request limits: --max-buffered-body-bytes %d, --max-concurrent-streams %d per process "
            "(from %s of memory in %s, %d process(es), %d body parser(s) each)",
            out["max_buffered_body_bytes"],
            out["max_concurrent_streams"],
            f"{limit.bytes >> 20} MiB" if limit is not None else "no known amount",
            limit.source if limit is not None else "-",
            processes,
            args.body_parser_processes,
        )
    return out


async def _start_http(
    args: argparse.Namespace,
    director: Director,
    role: workers_worker.WorkerRole | None,
    running: contextlib.AsyncExitStack,
) -> None:
    """The metrics port (/metrics, /debug/*): this process's own, or a worker's private one."""
    app = obs_http.build_app()
    rpc_http.add_routes(app, director, enabled=bool(args.enable_debug_api))
    # GIE's: TokenReview + SubjectAccessReview per (cached) caller; a worker's port is private.
    if args.metrics_endpoint_auth and role is None:
        metrics_auth = k8s_metricsauth.ApiServerAuth(k8s_connections.load(args.kubeconfig))
        await metrics_auth.start()
        running.push_async_callback(metrics_auth.close)
        app.middlewares.append(metrics_auth.middleware)
    if role is None:
        tls = metrics_tls.from_flags(args.metrics_cert_dir, args.metrics_client_ca_file)
        if tls is not None:
            running.push_async_callback(tls.stop)
        http_runner = await obs_http.start(
            app,
            host=args.bind_address,
            port=args.metrics_port,
            ssl_context=tls.context if tls is not None else None,
        )
    else:
        http_runner = await role.start_http(app)
    running.push_async_callback(http_runner.cleanup)


async def _follow_readiness(
    datastore: Datastore,
    pool_operator: PoolOperator | None,
    elector: workers_worker.Lease | None,
    health: extproc_server.Health,
    role: workers_worker.WorkerRole | None,
    running: contextlib.AsyncExitStack,
) -> None:
    """Readiness: the pool is listed (or the static endpoints are loaded) and, with leader
    election, this replica holds the Lease (GIE: followers are NOT_SERVING, liveness stays up).
    On the way out, before anything else stops, neither may turn health back on, and the Lease is
    handed back before the drain, so a follower takes the traffic while this one's streams finish
    (as GIE, which releases on cancel)."""
    pool_ready = datastore.synced if pool_operator is None else pool_operator.ready

    async def update_health() -> None:
        await health.set(pool_ready and (elector is None or elector.leading))
        if role is not None:
            await role.report(ready=bool(health.serving))

    await update_health()
    ready_tasks: list[asyncio.Task[None]] = []
    if pool_operator is not None:
        operator = pool_operator

        async def follow_pool() -> None:  # NOT_SERVING while the pool is missing, till listed
            nonlocal pool_ready
            async for ready in operator.readiness():
                pool_ready = ready
                await update_health()

        ready_tasks.append(
            tasks.create_guarded_task(follow_pool(), name="health follows the pool", logger=log)
        )
    if elector is not None:
        campaign = elector

        async def follow_leadership() -> None:
            while True:
                await campaign.wait_changed()
                await update_health()

        await campaign.start()
        running.push_async_callback(campaign.stop, release=True)
        ready_tasks.append(
            tasks.create_guarded_task(follow_leadership(), name="health follows the lease", logger=log)
        )

    async def not_serving() -> None:
        await tasks.cancel_and_wait(ready_tasks)
        await health.set(False)

    running.push_async_callback(not_serving)


def _log_serving(
    args: argparse.Namespace,
    datastore: Datastore,
    config: sched_config.SchedulerConfig,
    tokenizers: Tokenizers,
    director: Director,
) -> None:
    detector = director.admission_controller.detector if director.admission_controller else None
    log.info(
        "epp serving",
        extra={
            "grpc_port": args.grpc_port,
            "health_port": args.grpc_health_port,
            "metrics_port": args.metrics_port,
            "tls": bool(args.secure_serving),
            "endpoints": len(datastore.endpoints()),
            "profiles": ",".join(config.scheduler.profile_names()),
            "saturation_detector": detector.name if detector is not None else "",
            "flow_control": director.flow_control is not None,
            "kv_events": args.kv_events,
            "tokenizers": _tokenizer_names(tokenizers),
        },
    )


def _context_limits(args: argparse.Namespace, datastore: Datastore, tokenizers: Tokenizers) -> ContextLimits:
    """max_model_len per model: `--max-model-len`, else the pods' /v1/models, else the tokenizer's
    `model_max_length` (docs/tokenization.md#context-length)."""

    def from_tokenizer(model: str) -> int | None:
        tok = tokenizers.for_model(model, base_model=datastore.base_model)
        return tok.model_max_length if tok is not None else None

    return ContextLimits(
        overrides=dict(args.max_model_len),
        from_pods=datastore.max_model_len,
        from_tokenizer=from_tokenizer,
    )


def _tokenizer_names(tokenizers: Tokenizers) -> str:
    names = [f"{model}={tok.name}" for model, tok in sorted(tokenizers.models.items())]
    if tokenizers.default is not None:
        names.append(f"*={tokenizers.default.name}")
    return ",".join(names) or "none"
