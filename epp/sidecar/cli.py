"""`epp sidecar`: run the prefill/decode sidecar beside a decode pod's vLLM (epp.sidecar.proxy).

It takes llm-d v0.10's routing-sidecar flags, so a decode pod's `routing-sidecar` container runs it
with the arguments it has (docs/disaggregation.md#epp-sidecar lists each):

- what it does as llm-d's does: `--port`, `--model-server-port` (and its deprecated
  `--vllm-port`), `--data-parallel-size` (one listener per rank, and llm-d's deprecated
  `x-data-parallel-host-port` on the first), `--secure-proxy` and
  `--cert-path` (TLS on the listeners, on by default as llm-d's), `--enable-tls` and
  `--tls-insecure-skip-verify` for the prefill and decode legs, `--enable-prefiller-sampling`,
  `--kv-connector nixlv2`, `--prefill-max-retries`, `--prefill-retry-backoff`, `--metrics-port`,
  `-v` and `--zap-log-level`;
- what only matters for a path it does not run, and does nothing in llm-d's there either: the
  Mooncake and P2P ports (other connectors), `--inference-pool` and `--pool-group` (SSRF
  protection), the MoRI-IO ports and sizes (`--moriio-write-mode`), `--max-idle-conns-per-host`
  (aiohttp keeps every idle connection until its keep-alive timeout);
- what it does not do, refused at start-up with the reason when asked for: other KV connectors,
  `--ec-connector`, `--enable-ssrf-protection`, `--enable-p2p-pull`, `--decode-chunk-size`,
  `--moriio-write-mode`, `--tracing`.

`--configuration` (inline YAML) or `--configuration-file` sets the same flags by their names, as
llm-d's: a flag given on the command line wins over the configuration's value.

epp's own flags bound what llm-d leaves unbounded (`--prefill-timeout`, `--decode-idle-timeout`,
`--prefill-fallback`, `--connect-timeout`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import pathlib
import signal
import ssl
import tempfile
import urllib.parse
from collections.abc import Sequence
from typing import Final

import yaml
from aiohttp import web
from prometheus_client import generate_latest

from epp import certs
from epp.flags import types as flags
from epp.observability import logs
from epp.sidecar import proxy

log = logging.getLogger("epp.sidecar")

CONNECTORS = ("nixlv2",)
"""llm-d's `--kv-connector` values this sidecar speaks. NixlConnector's protocol is the one
checked against real vLLM here; llm-d's others (shared-storage, sglang, mooncake, offloading) are
refused at start-up: run llm-d's routing sidecar for those."""

TLS_STAGES = ("prefiller", "decoder", "encoder")
"""llm-d's stage names for `--enable-tls` and `--tls-insecure-skip-verify`. epp sidecar runs no
encode stage (the prefilling vLLM encodes), so `encoder` has nothing to apply to here."""

DEFAULT_MODEL_SERVER_PORT = 8200


def _stages(text: str) -> list[str]:
    """A comma-separated list of llm-d's TLS stage names (the flag may also repeat)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if name not in TLS_STAGES:
            raise argparse.ArgumentTypeError(f"unknown stage {name!r}: one of {', '.join(TLS_STAGES)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    parser.add_argument(
        "--port",
        type=flags.port_number,
        default=8000,
        help="port to listen on; rank r of --data-parallel-size listens on port + r (default: %(default)s)",
    )
    parser.add_argument(
        "--model-server-port",
        type=flags.port_number,
        default=None,
        help=f"the local vLLM's port on 127.0.0.1 (default: {DEFAULT_MODEL_SERVER_PORT}); see --decoder-url",
    )
    parser.add_argument(
        "--vllm-port",
        type=flags.port_number,
        default=None,
        help="llm-d's older name for --model-server-port, which wins when both are given",
    )
    parser.add_argument(
        "--decoder-url", default="", help="the local vLLM's URL (default: http://127.0.0.1:MODEL_SERVER_PORT)"
    )
    parser.add_argument(
        "--data-parallel-size",
        type=flags.positive_int,
        default=1,
        help="the local vLLM's data-parallel ranks: rank r is served on --port + r and relayed to "
        "the model server's port + r (default: %(default)s)",
    )
    parser.add_argument(
        "--kv-connector",
        default="nixlv2",
        help="the KV transfer protocol; nixlv2 (vLLM's NixlConnector) only (default: %(default)s)",
    )
    parser.add_argument(
        "--prefill-max-retries",
        type=int,
        default=2,
        help="retries of a prefill leg refused, reset or answered 502/503/504 (default: %(default)s)",
    )
    parser.add_argument(
        "--prefill-retry-backoff",
        type=flags.duration,
        default=0.1,
        help="wait between prefill retries, a Go duration or seconds (default: 100ms)",
    )
    parser.add_argument(
        "--prefill-timeout",
        type=flags.duration,
        default=120.0,
        help="the whole prefill leg, queueing included (default: 2m)",
    )
    parser.add_argument(
        "--prefill-fallback",
        choices=("local", "error"),
        default="local",
        help="when the prefill leg or the KV pull fails: prefill on the local vLLM, or answer 502 "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--connect-timeout", type=flags.duration, default=5.0, help="TCP connect, both legs (default: 5s)"
    )
    parser.add_argument(
        "--decode-idle-timeout",
        type=flags.duration,
        default=300.0,
        help="the longest the local vLLM may send nothing (default: 5m)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve the sidecar's own /metrics on this port (default: off); "
        "other paths, /metrics included, go to the local vLLM",
    )
    flags.go_bool(
        parser.add_argument_group("prefill pods"),
        "enable-prefiller-sampling",
        default=_env_bool("ENABLE_PREFILLER_SAMPLING"),
        help="of several prefill pods in x-prefiller-host-port, pick one at random rather than the "
        "first (default: $ENABLE_PREFILLER_SAMPLING, else false)",
    )
    _tls_arguments(parser.add_argument_group("TLS (llm-d's flags)"))
    config = parser.add_argument_group("configuration (llm-d's flags)")
    config.add_argument(
        "--configuration",
        default="",
        help="the flags as inline YAML, e.g. '{port: 8085, model-server-port: 8203}'",
    )
    config.add_argument("--configuration-file", default="", help="the flags in a YAML file")
    _inert_arguments(parser.add_argument_group("llm-d flags for paths epp sidecar does not run"))
    logging_group = parser.add_argument_group("logging")
    logging_group.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    logging_group.add_argument(
        "-v",
        "--v",
        type=int,
        default=None,
        metavar="N",
        help="llm-d's verbosity: 4+ debug (overrides --log-level)",
    )
    logging_group.add_argument(
        "--zap-log-level",
        type=flags.zap_level,
        default=None,
        help="debug, info, error, panic, or a verbosity N as for -v (overrides -v and --log-level)",
    )


def _tls_arguments(g: argparse._ArgumentGroup) -> None:
    flags.go_bool(
        g,
        "secure-proxy",
        default=True,
        help="serve TLS on the sidecar's ports, as llm-d's sidecar does by default: --cert-path's "
        "pair, else a self-signed certificate; --secure-proxy=false for plain HTTP",
    )
    g.add_argument("--cert-path", default="", help="directory with tls.crt and tls.key for --secure-proxy")
    g.add_argument(
        "--enable-tls",
        type=_stages,
        action="extend",
        default=[],
        help="legs to send over HTTPS: prefiller, decoder (comma-separated or repeated)",
    )
    g.add_argument(
        "--tls-insecure-skip-verify",
        type=_stages,
        action="extend",
        default=[],
        help="legs whose server certificate is not checked: prefiller, decoder",
    )


def _inert_arguments(g: argparse._ArgumentGroup) -> None:
    """llm-d's flags for connectors, encode stages and features epp sidecar does not run: each is
    taken as llm-d takes it, and `refusals` stops the sidecar when one asks for what it lacks."""
    g.add_argument("--ec-connector", default="", help="refused when set: epp sidecar runs no encode stage")
    g.add_argument(
        "--mooncake-bootstrap-port",
        type=flags.port_number,
        default=_env_int("MOONCAKE_BOOTSTRAP_PORT", 8998),
        help="used with --kv-connector=mooncake only (refused)",
    )
    g.add_argument(
        "--p2p-connector-port",
        type=flags.port_number,
        default=_env_int("P2P_CONNECTOR_PORT", 7777),
        help="used with --kv-connector=offloading or --enable-p2p-pull only (both refused)",
    )
    flags.go_bool(g, "enable-p2p-pull", default=False, help="refused when true")
    flags.go_bool(g, "enable-ssrf-protection", default=False, help="refused when true")
    g.add_argument(
        "--inference-pool",
        default=os.environ.get("INFERENCE_POOL", ""),
        help="used by --enable-ssrf-protection only (refused)",
    )
    g.add_argument("--pool-group", default="inference.networking.k8s.io", help="as --inference-pool")
    g.add_argument(
        "--max-idle-conns-per-host",
        type=flags.non_negative_int,
        default=1024,
        help="Go's idle-connection cap; aiohttp keeps every idle connection until its keep-alive timeout",
    )
    g.add_argument("--decode-chunk-size", type=flags.non_negative_int, default=0, help="refused when > 0")
    flags.go_bool(g, "tracing", default=False, help="refused when true")
    flags.go_bool(g, "moriio-write-mode", default=False, help="refused when true")
    flags.go_bool(g, "moriio-parallel-dispatch", default=False, help="with --moriio-write-mode only")
    g.add_argument(
        "--moriio-parallel-decode-wait-timeout", type=flags.duration, default=30.0, help="as above"
    )
    for name, default in (
        ("moriio-decode-notify-port", 61005),
        ("moriio-decode-handshake-port", 6301),
        ("moriio-prefill-handshake-port", 6301),
        ("moriio-prefill-notify-port", 61005),
    ):
        g.add_argument(f"--{name}", type=flags.port_number, default=default, help="as above")
    for name, default in (("moriio-tp-size", 1), ("moriio-dp-size", 1), ("moriio-dp-size-local", 0)):
        g.add_argument(f"--{name}", type=flags.non_negative_int, default=default, help="as above")
    g.add_argument("--moriio-local-pod-ip", default=os.environ.get("POD_IP", ""), help="as above")
    g.add_argument("--moriio-remote-hosts", default="", help="as above")
    g.add_argument("--moriio-decode-hosts", default="", help="as above")


def _env_bool(name: str) -> bool:
    # llm-d parses the variable with Go's strconv.ParseBool and ignores what it cannot parse.
    try:
        return flags.boolean(os.environ.get(name, ""))
    except argparse.ArgumentTypeError:
        return False


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


CONFIGURATION_KEYS: Final = frozenset(
    {
        "port", "model-server-port", "vllm-port", "mooncake-bootstrap-port", "p2p-connector-port",
        "data-parallel-size", "kv-connector", "ec-connector", "enable-ssrf-protection",
        "enable-prefiller-sampling", "enable-p2p-pull", "secure-proxy", "cert-path", "enable-tls",
        "tls-insecure-skip-verify", "inference-pool", "pool-group", "max-idle-conns-per-host",
        "prefill-max-retries", "prefill-retry-backoff", "decode-chunk-size", "tracing", "metrics-port",
    }
)  # fmt: skip
"""The keys of llm-d's sidecar configuration (its `yamlConfiguration`): flag names."""


def with_configuration(args: argparse.Namespace, argv: Sequence[str]) -> argparse.Namespace:
    """`args` with `--configuration` or `--configuration-file` applied: each key sets its flag
    unless `argv` (the command line after `sidecar`) gives that flag. ValueError for both at once,
    an unreadable file, YAML that is not a mapping, or a key that is not one of llm-d's."""
    if args.configuration and args.configuration_file:
        raise ValueError("--configuration and --configuration-file are mutually exclusive")
    if args.configuration:
        text, source = args.configuration, "--configuration"
    elif args.configuration_file:
        try:
            with open(args.configuration_file, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise ValueError(f"--configuration-file: {err}") from err
        source = args.configuration_file
    else:
        return args
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: not YAML: {err}") from err
    if config is None:
        return args
    if not isinstance(config, dict):
        raise ValueError(f"{source}: a mapping of flag names to values is expected")
    unknown = sorted(str(key) for key in config if key not in CONFIGURATION_KEYS)
    if unknown:
        raise ValueError(f"{source}: unknown keys {', '.join(unknown)} (llm-d's keys are its flags' names)")

    def given(flag: str) -> bool:
        return any(token == f"--{flag}" or token.startswith(f"--{flag}=") for token in argv)

    tokens = []
    for key, value in config.items():
        if given(key) or (key == "model-server-port" and given("vllm-port")):
            continue  # the command line wins, the deprecated --vllm-port too (as llm-d's)
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, list):
            value = ",".join(str(item) for item in value)
        tokens.append(f"--{key}={value}")
    parser = argparse.ArgumentParser(prog="epp sidecar")
    add_arguments(parser)
    return parser.parse_args([*tokens, *argv])


def refusals(args: argparse.Namespace) -> list[str]:
    """What the flags ask for that epp sidecar does not do: one sentence each."""
    out: list[str] = []
    if args.kv_connector not in CONNECTORS:
        out.append(
            f"--kv-connector {args.kv_connector!r}: epp sidecar speaks {', '.join(CONNECTORS)} "
            "(vLLM's NixlConnector); for shared-storage, sglang, mooncake or offloading run llm-d's "
            "routing sidecar"
        )
    asked = {
        "--ec-connector": bool(args.ec_connector) and "E/P/D's encode stage",
        "--enable-ssrf-protection": args.enable_ssrf_protection
        and "SSRF protection (InferencePool allowlisting of prefill hosts)",
        "--enable-p2p-pull": args.enable_p2p_pull and "OffloadingConnector's P2P pulls",
        "--decode-chunk-size": args.decode_chunk_size > 0 and "chunked decode",
        "--moriio-write-mode": args.moriio_write_mode and "MoRI-IO's WRITE mode",
        "--tracing": args.tracing and "OpenTelemetry tracing",
    }
    for flag, what in asked.items():
        if what:
            out.append(f"{flag}: epp sidecar does not do {what}; run llm-d's routing sidecar for it")
    if args.prefill_max_retries < 0:
        out.append("--prefill-max-retries must be >= 0")
    return out


@dataclasses.dataclass(frozen=True)
class Listener:
    """One rank's listener: its port and the Sidecar settings that relay to its model server."""

    port: int
    settings: proxy.Settings


def listeners_from(args: argparse.Namespace) -> list[Listener]:
    """One listener per data-parallel rank: rank r on --port + r, relaying to the model server's
    port + r (llm-d's layout). ValueError for what `refusals` finds or ports past 65535."""
    problems = refusals(args)
    if problems:
        raise ValueError("; ".join(problems))
    ranks = args.data_parallel_size
    decoder_tls = "decoder" in args.enable_tls
    if args.decoder_url:
        base = urllib.parse.urlsplit(args.decoder_url)
        if decoder_tls and base.scheme != "https":
            raise ValueError("--enable-tls decoder needs an https --decoder-url")
    else:
        port = args.model_server_port or args.vllm_port or DEFAULT_MODEL_SERVER_PORT
        base = urllib.parse.urlsplit(f"{'https' if decoder_tls else 'http'}://127.0.0.1:{port}")
    if base.port is None:
        if ranks > 1:
            raise ValueError("--data-parallel-size > 1 needs a --decoder-url with a port")
        first_model_port = 0
    else:
        first_model_port = base.port
    if args.port + ranks - 1 > 65535 or first_model_port + ranks - 1 > 65535:
        raise ValueError(f"--data-parallel-size {ranks}: the ranks' ports would pass 65535")
    urls = [
        args.decoder_url if ranks == 1 and args.decoder_url else _with_port(base, first_model_port + rank)
        for rank in range(ranks)
    ]
    out = []
    for rank, url in enumerate(urls):
        settings = proxy.Settings(
            decoder_url=url,
            prefill_timeout_s=args.prefill_timeout,
            prefill_max_retries=args.prefill_max_retries,
            prefill_retry_backoff_s=args.prefill_retry_backoff,
            prefill_fallback=args.prefill_fallback,
            connect_timeout_s=args.connect_timeout,
            decode_idle_timeout_s=args.decode_idle_timeout,
            prefill_tls="prefiller" in args.enable_tls,
            prefill_verify="prefiller" not in args.tls_insecure_skip_verify,
            decoder_verify="decoder" not in args.tls_insecure_skip_verify,
            prefiller_sampling=bool(args.enable_prefiller_sampling),
            # The first rank's listener also takes any rank's requests by llm-d's rank header.
            rank_decoders={args.port + r: u for r, u in enumerate(urls)} if rank == 0 else {},
            pod_ip=os.environ.get("POD_IP", ""),
        )
        out.append(Listener(args.port + rank, settings))
    return out


def _with_port(base: urllib.parse.SplitResult, port: int) -> str:
    host = base.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return urllib.parse.urlunsplit((base.scheme, f"{host}:{port}", base.path, "", ""))


def server_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The listeners' TLS context (`--secure-proxy`): `--cert-path`'s pair, else self-signed."""
    if not args.secure_proxy:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    if args.cert_path:
        base = pathlib.Path(args.cert_path)
        try:  # ssl.SSLError (an OSError) too when the key does not belong to the certificate
            context.load_cert_chain(base / "tls.crt", base / "tls.key")
        except OSError as err:
            raise ValueError(f"--cert-path {args.cert_path}: tls.crt and tls.key: {err}") from err
        return context
    key, cert = certs.self_signed()
    # ssl loads a chain from files only: write the pair to a private directory, load, remove.
    with tempfile.TemporaryDirectory(prefix="epp-sidecar-tls-") as tmp:
        cert_file, key_file = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        with open(cert_file, "wb") as f:
            f.write(cert)
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(key)
        context.load_cert_chain(cert_file, key_file)
    return context


async def _metrics(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(proxy.REGISTRY), content_type="text/plain")


async def serve(args: argparse.Namespace, listeners: list[Listener], tls: ssl.SSLContext | None) -> None:
    runners: list[web.AppRunner] = []
    try:
        for listener in listeners:
            # Handler cancellation: a client that goes away cancels its handler, closing both legs.
            runner = web.AppRunner(
                proxy.Sidecar(listener.settings).app(), handler_cancellation=True, access_log=None
            )
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, args.host, listener.port, ssl_context=tls).start()
            log.info(
                "epp sidecar on %s:%d (%s) in front of %s",
                args.host,
                listener.port,
                "https" if tls is not None else "http",
                listener.settings.decoder_url,
            )
        if args.metrics_port:
            metrics_app = web.Application()
            metrics_app.router.add_get("/metrics", _metrics)
            metrics_runner = web.AppRunner(metrics_app, access_log=None)
            await metrics_runner.setup()
            runners.append(metrics_runner)
            await web.TCPSite(metrics_runner, args.host, args.metrics_port).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        for runner in reversed(runners):
            with contextlib.suppress(Exception):
                await runner.cleanup()


def log_level(args: argparse.Namespace) -> str:
    """--zap-log-level, else -v, else --log-level (llm-d's precedence)."""
    if args.zap_log_level is not None:
        zap: str = args.zap_log_level
        return flags.verbosity_level(int(zap)) if zap.isdigit() else {"panic": "critical"}.get(zap, zap)
    if args.v is not None:
        return flags.verbosity_level(args.v)
    return str(args.log_level)


def run(args: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    """`argv`: the command line after `sidecar`, which tells the flags given from the defaults."""
    logs.setup(level=log_level(args), fmt="text")
    try:
        args = with_configuration(args, argv)
        logs.setup(level=log_level(args), fmt="text")
        listeners = listeners_from(args)
        tls = server_tls(args)
    except (ValueError, OSError) as err:
        log.error("%s", err)
        return 2
    if args.max_idle_conns_per_host != 1024:
        log.info(
            "--max-idle-conns-per-host %d: epp sidecar keeps every idle connection to a pod until "
            "aiohttp's keep-alive timeout",
            args.max_idle_conns_per_host,
        )
    asyncio.run(serve(args, listeners, tls))
    return 0
