"""`epp serve`: wire the datastore, its sources, the scheduler, the director and the servers.

Start order: `--tokenizer` tokenizers and config (fail fast on a bad one) -> the config's
tokenizers -> endpoint sources (the endpoints file's tokenizers with it) -> epp-tiny as the
default if no tokenizer was named anywhere -> KV-event ingestion -> metrics scraper -> servers.
Stop order on SIGTERM/SIGINT: health goes NOT_SERVING (both ports); on SIGTERM new ext-proc
streams are still served for --drain-delay (default 5 s, so the gateway's health check sees
NOT_SERVING first); then the ext-proc server refuses new streams and lets in-flight ones (a long
streamed response is one stream) finish for up to --drain-timeout (default 130 s, GIE's
terminationGracePeriodSeconds), then background tasks stop. A second signal ends the drain at
once (epp.drain).

With `--workers N` (N > 1; the default `auto` is the cores the pod may use) this process becomes
the supervisor of N such processes sharing the ext-proc port (epp.workers); each worker runs the
code below with the few differences epp.workers.worker lists.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import grpc
import zmq

from epp import drain, gie_flags, kv_events_flags, malloc, tasks
from epp.api.context_length import ContextLimits
from epp.api.limits import RequestLimits
from epp.datastore import standalone
from epp.datastore.endpoints import Datastore, Endpoint
from epp.datastore.scraper import MetricsScraper
from epp.extproc import server as extproc_server
from epp.extproc import tls
from epp.extproc.limits import StreamGuard, StreamLimits
from epp.k8s import connections as k8s_connections
from epp.k8s import metricsauth as k8s_metricsauth
from epp.k8s import objectives as k8s_objectives
from epp.k8s.from_flags import kubernetes_source, leader_elector
from epp.kvcache.index import BlockIndex
from epp.kvcache.ingest import FeedSpec, KVEventIngester
from epp.observability import collectors, logs, metrics, tracing
from epp.observability import http as obs_http
from epp.observability.looplag import LoopLagMonitor
from epp.requestcontrol import admission
from epp.requestcontrol.director import Director, DirectorSettings
from epp.requestcontrol.offload import BodyParsers
from epp.rpc import http as rpc_http
from epp.rpc import service as rpc_service
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.tokenize import registry as tokenize_registry
from epp.tokenize.registry import Tokenizers, parse_tokenizer_arg
from epp.tokenize.tokenizer import TokenizerError
from epp.workers import cpus, supervisor
from epp.workers import worker as workers_worker

log = logging.getLogger("epp")
GIL_SWITCH_INTERVAL = 0.001  # seconds; see `main`

_warned_bind_ranks: list[bool] = []  # warn once per process


def main(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    level, fmt = gie_flags.log_settings(args)
    stack_level = {"panic": "critical"}.get(args.zap_stacktrace_level, args.zap_stacktrace_level)
    logs.setup(level=level, fmt=fmt, time_encoding=args.zap_time_encoding, stacktrace_level=stack_level)
    errors, notes = gie_flags.gie_flag_problems(args)
    for note in notes:
        log.info("GIE flag: %s", note)
    if errors:
        for error in errors:
            log.error("cannot start: %s", error)
        return 2
    role = workers_worker.from_environment()
    try:
        if role is None:
            _kv_events_from_config(args)
            count = _worker_count(args)
            if count > 1:
                if argv is None:
                    raise ValueError("--workers above 1 needs `epp serve` started from its command line")
                return asyncio.run(supervisor.supervise(args, argv, count))
        malloc.tune()  # the process that routes (a worker, or the only one) copies the bodies
        # A thread holding the GIL (the tokenizers' bookkeeping, the body parsers' feeder, a long
        # prompt's block keys) keeps the event loop waiting for it up to the switch interval
        # each time the loop wants it back: 5 ms by default, 1 ms here (BENCHMARKS.md 1f).
        sys.setswitchinterval(GIL_SWITCH_INTERVAL)
        asyncio.run(run(args, role))
    except sched_config.ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    except (ValueError, OSError, TokenizerError, zmq.ZMQError, tracing.TracingUnavailable) as exc:
        # ZMQError (e.g. --kv-events-bind on a port in use) is not an OSError.
        log.error("cannot start: %s", exc)
        return 2
    return 0


def _worker_count(args: argparse.Namespace) -> int:
    """`--workers`, or auto's count. Bind mode runs one process (epp.workers.supervisor says why)."""
    if args.workers:
        if args.workers > 1 and args.kv_events == "bind":
            raise ValueError(
                f"--workers {args.workers} with --kv-events bind: only one process can bind the "
                "KV-event port; use --kv-events connect (each worker subscribes to every pod) or --workers 1"
            )
        if args.workers > 1 and args.grpc_port == 0:
            raise ValueError(f"--workers {args.workers} needs a fixed --grpc-port for the workers to share")
        return int(args.workers)
    if args.kv_events == "bind":
        log.info("workers: 1 (auto; --kv-events bind needs a single process to bind the port)")
        return 1
    if args.kv_events == "off":
        # Without KV events each worker would keep its own approximate prefix table and see only
        # the connections the kernel hands it: prefix hits fall with every worker (BENCHMARKS 7c:
        # 91.8% -> 70.2% on chat at 4 schedulers). One process keeps one table; --workers N opts in.
        log.info("workers: 1 (auto; without KV events one process keeps one prefix table)")
        return 1
    budget = cpus.cpu_budget()
    count = cpus.default_workers(budget) if args.grpc_port != 0 else 1
    log.info(
        "workers: %d (auto: %d core(s) usable, %d in the affinity mask, CPU limit %s)",
        count,
        budget.cores,
        budget.affinity,
        f"{budget.quota:g} from {budget.source}" if budget.quota is not None else "none",
    )
    return count


def feed_spec(ep: Endpoint, args: argparse.Namespace) -> FeedSpec:
    """Where `ep`'s KV events come from: its entry's kvEvents/kvReplay, else the default ports
    offset by its data-parallel rank (vLLM's DP ranks publish on base port + rank)."""
    spec = ep.spec
    if args.kv_events == "bind" and spec.rank > 0 and not _warned_bind_ranks:
        # vLLM offsets every rank's endpoint port, connect or bind: rank r dials <epp>:5557+r,
        # and epp binds one port. Until it binds one per rank, DP servers need connect mode.
        _warned_bind_ranks.append(True)
        log.warning(
            "kv events: bind mode receives only data-parallel rank 0 (rank %d of %s dials another "
            "port); use --kv-events connect for data-parallel servers",
            spec.rank,
            ep.name,
        )
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


async def run(args: argparse.Namespace, role: workers_worker.WorkerRole | None = None) -> None:
    if args.tracing:
        tracing.setup()
    try:
        await _run_traced(args, role)
    finally:
        tracing.shutdown()  # flushes the spans still buffered


async def _run_traced(args: argparse.Namespace, role: workers_worker.WorkerRole | None) -> None:
    _kv_events_from_config(args)
    if role is not None:
        role.adjust(args)
    datastore = Datastore()
    index = BlockIndex(max_entries=args.kv_index_max_entries) if args.kv_events != "off" else None
    handle = Handle(datastore=datastore, kv_index=index)
    # epp-tiny as the default is decided in _run, once the config and the endpoints file are read.
    tokenizers = Tokenizers.from_spec(
        parse_tokenizer_arg(args.tokenizer),
        shipped_default=False,
        workers=args.tokenizer_workers,
        prefix_cache_bytes=args.tokenizer_prefix_cache_bytes,
    )
    collector = collectors.TokenizerCollector(
        lambda: tokenizers.missing,
        lambda: tokenizers.truncated,
        lambda: tokenizers.prefix_caches,
        lambda: tokenizers.engines,
        lambda: tokenizers.commits_dropped,
    )
    metrics.REGISTRY.register(collector)
    parsers = None
    if args.body_parser_processes:
        try:
            parsers = BodyParsers(args.body_parser_processes, min_bytes=args.body_parser_min_bytes)
        except OSError as exc:  # no POSIX semaphores (/dev/shm) for multiprocessing's queues
            log.warning("body parsers unavailable, large bodies are parsed in process: %s", exc)
    try:
        if parsers is not None:
            parsers.start()
        await _run(args, datastore, handle, tokenizers, role, parsers)
    finally:
        metrics.REGISTRY.unregister(collector)
        tokenizers.close()
        if parsers is not None:
            await asyncio.to_thread(parsers.close)


def _kv_events_from_config(args: argparse.Namespace) -> None:
    """An llm-d config's `kvEventsConfig` (precise-prefix-cache-scorer) turns KV events on as the
    `--kv-events` flags would; a flag that says otherwise is a startup error (ValueError)."""
    text = args.config_text
    if args.config_file:
        try:
            with open(args.config_file, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return  # load_config_file reports it, with the file name
    wanted = sched_config.requested_kv_events(text)
    if wanted is None:
        return
    if args.kv_events == "off":
        args.kv_events = wanted.mode
    elif args.kv_events != wanted.mode:
        raise ValueError(
            f"--kv-events {args.kv_events}, but the config's kvEventsConfig asks for {wanted.mode} mode"
        )
    # The flag's default gives way to the config; an explicit other value is a contradiction.
    if wanted.mode == "bind" and wanted.bind and wanted.bind != args.kv_events_bind:
        if args.kv_events_bind != kv_events_flags.KV_EVENTS_BIND_DEFAULT:
            raise ValueError(
                f"--kv-events-bind {args.kv_events_bind}, but the config's kvEventsConfig binds {wanted.bind}"
            )
        args.kv_events_bind = wanted.bind
    if wanted.mode == "connect" and wanted.port != args.kv_events_port:
        if args.kv_events_port != kv_events_flags.KV_EVENTS_PORT_DEFAULT:
            raise ValueError(
                f"--kv-events-port {args.kv_events_port}, but the config's kvEventsConfig says {wanted.port}"
            )
        args.kv_events_port = wanted.port
    log.info("kv events: %s mode, from the config's kvEventsConfig", args.kv_events)


async def _run(
    args: argparse.Namespace,
    datastore: Datastore,
    handle: Handle,
    tokenizers: Tokenizers,
    role: workers_worker.WorkerRole | None = None,
    parsers: BodyParsers | None = None,
) -> None:
    if args.config_file:
        config = sched_config.load_config_file(args.config_file, handle)
    else:
        config = sched_config.load_config(args.config_text, handle)
    for warning in config.warnings:
        log.warning("config: %s", warning)
    if config.tokenizers:
        tokenizers.load_models(tokenize_registry.CONFIG, config.tokenizers)

    objective_store = k8s_objectives.ObjectiveStore()
    director = Director(
        datastore=datastore,
        scheduler=config.scheduler,
        pre_request=config.pre_request,
        response_complete=config.response_complete,
        settings=DirectorSettings(
            max_body_bytes=args.max_body_bytes,
            limits=RequestLimits(
                max_messages=args.max_request_messages,
                max_content_parts=args.max_request_content_parts,
                max_tools=args.max_request_tools,
                max_json_depth=args.max_request_json_depth,
            ),
            disable_subset_filter=args.disable_endpoint_subset_filter,
            response_sample_ratio=args.response_sample_ratio,
            response_sample_min_interval=args.response_sample_min_interval,
            trust_model_rewrite_header=bool(args.trust_model_name_rewrite_header),
        ),
        tokenizer=tokenizers,
        admission_controller=admission.LegacyAdmissionController(config.saturation_detector),
        objectives=objective_store,
        context_limits=_context_limits(args, datastore, tokenizers),
        body_parsers=parsers,
    )

    pool_label = args.pool_name or "standalone"
    pool_gauge = metrics.ready_endpoints.labels(pool_label)
    datastore.subscribe(lambda added, removed: pool_gauge.set(len(datastore.routable())))
    ingester: KVEventIngester | None = None
    if handle.kv_index is not None:
        ingester = KVEventIngester(
            handle.kv_index,
            bind=args.kv_events_bind if args.kv_events == "bind" else None,
            default_block_size=args.kv_block_size,
            access=args.kv_events_allow,
            max_message_bytes=args.kv_events_max_message_bytes,
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
        endpoints_file = standalone.EndpointsFile(
            args.endpoints_file,
            datastore,
            tokenizers=tokenizers.source(
                tokenize_registry.ENDPOINTS_FILE, origin=f"endpoints file {args.endpoints_file}"
            ),
        )
        endpoints_file.load()
    # llm-d's tokenizer plugin without a path names a model whose tokenizer llm-d downloads or asks
    # a sidecar for; epp tokenizes in-process from files, so one of its sources must name them.
    unnamed = [m for m in config.tokenizer_models if tokenizers.for_model(m) is None]
    if unnamed:
        raise ValueError(
            "the config's tokenizer plugin names "
            + ", ".join(repr(m) for m in unnamed)
            + " without a path: give --tokenizer MODEL=PATH (a directory with tokenizer.json), "
            "a `path` in the plugin's parameters, or a tokenizer in the endpoints file"
        )
    if not args.tokenizer and not tokenizers.models:
        tokenizers.use_shipped_default()  # nothing named anywhere: epp-tiny for every model
    pool_operator = kubernetes_source(args, datastore, objective_store)
    if not args.endpoints and not args.endpoints_file and pool_operator is None:
        raise ValueError(
            "no endpoint source: give --pool-name, --endpoint-selector, --endpoints or --endpoints-file"
        )
    elector: workers_worker.Lease | None = role.lease if role is not None else None
    if role is None:
        elector = leader_elector(args, pool_operator)
    pool_gauge.set(len(datastore.routable()))
    if ingester is not None:
        ingester.set_feeds(feed_spec(ep, args) for ep in datastore.endpoints())

    scraper = MetricsScraper(
        datastore,
        interval=args.refresh_metrics_interval,
        staleness=args.metrics_staleness_threshold,
        failure_threshold=args.scrape_failure_threshold,
        pool_name=pool_label,
        path=args.model_server_metrics_path.strip('"') or "/metrics",
        scheme=args.model_server_metrics_scheme,
        port=args.model_server_metrics_port or None,
        # GIE's default is to skip verification (model servers' certificates are often self-signed).
        insecure_skip_verify=args.model_server_metrics_https_insecure_skip_verify is not False,
    )

    health = extproc_server.Health()
    credentials: grpc.ServerCredentials | None = None
    if args.secure_serving and role is not None and role.tls_pair is not None:
        credentials = grpc.ssl_server_credentials([role.tls_pair])  # the pod's, from the supervisor
    elif args.secure_serving:
        credentials = tls.server_credentials(args.cert_path, reload=bool(args.enable_cert_reload))
    grpc_server = extproc_server.build_server(
        director,
        health,
        bind=args.bind_address,
        port=args.grpc_port,
        credentials=credentials,
        reuse_port=role is not None,
        guard=StreamGuard(
            StreamLimits(
                max_buffered_body_bytes=args.max_buffered_body_bytes,
                max_concurrent_streams=args.max_concurrent_streams,
                request_body_timeout=args.request_body_timeout,
                large_body_bytes=args.large_body_min_bytes,
                large_body_lanes=args.max_concurrent_large_bodies,
                large_body_rate=args.large_body_rate,
            )
        ),
    )
    # A worker's health port is its supervisor's.
    health_server = (
        extproc_server.build_health_server(health, bind=args.bind_address, port=args.grpc_health_port)
        if role is None
        else None
    )
    if args.enable_debug_api:  # the gRPC twin of /debug/*: UNIMPLEMENTED without the flag
        rpc_service.add_to_server(grpc_server, director)
    app = obs_http.build_app()
    rpc_http.add_routes(app, director, enabled=bool(args.enable_debug_api))
    metrics_auth: k8s_metricsauth.ApiServerAuth | None = None
    # GIE's: TokenReview + SubjectAccessReview per (cached) caller; a worker's port is private.
    if args.metrics_endpoint_auth and role is None:
        metrics_auth = k8s_metricsauth.ApiServerAuth(k8s_connections.load(args.kubeconfig))
        await metrics_auth.start()
        app.middlewares.append(metrics_auth.middleware)
    if role is None:
        http_runner = await obs_http.start(app, host=args.bind_address, port=args.metrics_port)
    else:
        http_runner = await role.start_http(app)

    if ingester is not None:
        await ingester.start()
    await scraper.start()
    if endpoints_file is not None:
        await endpoints_file.start()
    if pool_operator is not None:
        await pool_operator.start()
        try:  # usually listed within milliseconds; if not, serve NOT_SERVING until it is
            await asyncio.wait_for(pool_operator.wait_synced(), 5.0)
        except TimeoutError:
            log.warning("%s: not synced yet; health stays NOT_SERVING until it is", pool_operator.source)
    loop_lag = LoopLagMonitor()
    await loop_lag.start()
    await grpc_server.start()
    if health_server is not None:
        await health_server.start()
    stop = asyncio.Event()
    if role is not None:
        await role.connect(on_lost=stop.set)
        await role.report(started=True)
    # Readiness: the pool is listed (or the static endpoints are loaded) and, with leader
    # election, this replica holds the Lease (GIE: followers are NOT_SERVING, liveness stays up).
    pool_ready = datastore.synced if pool_operator is None else pool_operator.ready

    async def update_health() -> None:
        await health.set(pool_ready and (elector is None or elector.leading))
        if role is not None:
            await role.report(ready=bool(health.serving))

    await update_health()
    ready_tasks: list[asyncio.Task[None]] = []
    if pool_operator is not None:
        operator = pool_operator

        async def follow_readiness() -> None:  # NOT_SERVING while the pool is missing, till listed
            nonlocal pool_ready
            async for ready in operator.readiness():
                pool_ready = ready
                await update_health()

        ready_tasks.append(
            tasks.create_guarded_task(follow_readiness(), name="health follows the pool", logger=log)
        )
    if elector is not None:
        campaign = elector

        async def follow_leadership() -> None:
            while True:
                await campaign.wait_changed()
                await update_health()

        await campaign.start()
        ready_tasks.append(
            tasks.create_guarded_task(follow_leadership(), name="health follows the lease", logger=log)
        )
    log.info(
        "epp serving",
        extra={
            "grpc_port": args.grpc_port,
            "health_port": args.grpc_health_port,
            "metrics_port": args.metrics_port,
            "tls": bool(args.secure_serving),
            "endpoints": len(datastore.endpoints()),
            "profiles": ",".join(config.scheduler.profile_names()),
            "saturation_detector": config.saturation_detector.name,
            "kv_events": args.kv_events,
            "tokenizers": _tokenizer_names(tokenizers),
        },
    )

    loop = asyncio.get_running_loop()
    received: list[int] = []  # the first signal decides the drain delay (epp.drain)

    def on_signal(signum: int) -> None:
        received.append(signum)
        stop.set()

    for sig in drain.SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await stop.wait()
    finally:
        # First: neither the pool nor the lease may turn health back on while draining.
        await tasks.cancel_and_wait(ready_tasks)
        await health.set(False)
        if elector is not None:
            # Handed back before the drain, so a follower takes the traffic while this one's
            # streams finish (as GIE, which releases on cancel).
            await elector.stop(release=True)
        delay = drain.delay_for(received[0] if received else None, args.drain_delay)
        await drain.drain(grpc_server, args.drain_timeout, delay)
        if health_server is not None:
            await health_server.stop(0)
        if pool_operator is not None:
            await pool_operator.stop()
        if endpoints_file is not None:
            await endpoints_file.stop()
        await scraper.stop()
        if ingester is not None:
            await ingester.stop()
        await http_runner.cleanup()
        if metrics_auth is not None:
            await metrics_auth.close()
        await loop_lag.stop()
        if role is not None:
            await role.close()


def _context_limits(args: argparse.Namespace, datastore: Datastore, tokenizers: Tokenizers) -> ContextLimits:
    """max_model_len per model: `--max-model-len`, else the pods' /v1/models, else the tokenizer's
    `model_max_length` (docs/tokenization.md, "Context length")."""

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
