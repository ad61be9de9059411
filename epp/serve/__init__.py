"""`epp serve`: wire the datastore, its sources, the scheduler, the director and the servers.

This module starts the process (flags checked, worker count, the supervisor or one routing
process); `epp.serve.parts` builds every part and runs them until a signal.

Start order: `--tokenizer` tokenizers and config (fail fast on a bad one) -> the config's
tokenizers (and its /render producers) -> endpoint sources (the endpoints file's tokenizers with
it) -> epp-tiny as the stand-in if no tokenizer was named anywhere -> KV-event ingestion ->
metrics scraper -> servers.
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
import os
import sys

import zmq

from epp import malloc
from epp.datastore.endpoints import Datastore
from epp.flags import compat as flags_compat
from epp.flags import extproc as flags_extproc
from epp.flags import kv_events as kv_events_flags
from epp.flags import metrics_port as flags_metrics_port
from epp.kvcache.index import BlockIndex, IndexReader, KVIndexView
from epp.observability import collectors, logs, metrics, tracing
from epp.requestcontrol.offload import BodyParsers
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.serve import parts
from epp.tokenize.registry import Tokenizers, parse_tokenizer_arg
from epp.tokenize.tokenizer import TokenizerError
from epp.workers import cpus, supervisor
from epp.workers import worker as workers_worker

log = logging.getLogger("epp")
GIL_SWITCH_INTERVAL = 0.001  # seconds; see `main`


def main(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    level, fmt = flags_compat.log_settings(args)
    stack_level = {"panic": "critical"}.get(args.zap_stacktrace_level, args.zap_stacktrace_level)
    logs.setup(level=level, fmt=fmt, time_encoding=args.zap_time_encoding, stacktrace_level=stack_level)
    errors, notes = flags_compat.gie_flag_problems(args)
    errors += flags_metrics_port.metrics_port_problems(args)
    args.metrics_endpoint_auth = flags_metrics_port.metrics_auth(args)
    ciphers: str | None = None
    try:
        ciphers = flags_extproc.grpc_cipher_list(args)
    except ValueError as exc:
        errors.append(str(exc))
    if ciphers is not None and not errors and os.environ.get(flags_extproc.CIPHER_ENV) != ciphers:
        return _restart_for_ciphers(ciphers, argv)  # the notes are logged by the new process
    for note in notes:
        log.info("GIE flag: %s", note)
    for note in flags_extproc.extproc_notes(args):
        log.info("flag: %s", note)
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
        # each time the loop wants it back: 5 ms by default, 1 ms here
        # (docs/bench/overhead.md#large-bodies).
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


def _restart_for_ciphers(ciphers: str, argv: list[str] | None) -> int:
    """gRPC reads its TLS 1.2 cipher list from the environment once, when it starts (before any
    flag is parsed): start `epp serve` again with it set. The process is replaced (same pid)."""
    name = flags_extproc.CIPHER_ENV
    given = os.environ.get(name)
    if given is not None:
        log.error("cannot start: %s=%s is set, but the TLS flags ask for %s", name, given, ciphers)
        return 2
    if argv is None:
        log.error("cannot start: the TLS flags need `epp serve` started from its command line")
        return 2
    log.info("TLS: starting again with %s=%s (gRPC reads it once, at start)", name, ciphers)
    logging.shutdown()
    os.execve(sys.executable, [sys.executable, "-m", "epp", *argv], {**os.environ, name: ciphers})
    return 2  # not reached: execve returns only by raising


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
        # the connections the kernel hands it: prefix hits fall with every worker
        # (docs/bench/routing-live.md#replicas: 91.8% -> 70.2% on chat at 4 schedulers). One
        # process keeps one table; --workers N opts in.
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
    index: KVIndexView | None = None
    if role is not None and role.kv_index_fd is not None:
        index = role.kv_reader = IndexReader(role.kv_index_fd)  # the supervisor's (epp.workers.shared_kv)
    elif args.kv_events != "off":
        index = BlockIndex(max_entries=args.kv_index_max_entries)
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
        await parts.run_until_stopped(args, datastore, handle, tokenizers, role, parsers)
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
