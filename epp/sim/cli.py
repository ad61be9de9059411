"""`epp sim`: simulated vLLM pods, each on its own HTTP port, all in one process and one event loop.

Each pod is `epp.sim.server` over the real-time step engine (`epp.sim.engine`, `epp.sim.core`):
vLLM's OpenAI routes, /metrics, /tokenize, /reset_prefix_cache, and KV events over ZMQ in vLLM's
wire format. Flags are named as vLLM's where vLLM has one (`--served-model-name`, `--block-size`,
`--num-gpu-blocks-override`, `--max-num-seqs`, `--max-num-batched-tokens`, `--max-model-len`,
`--kv-events-config`, `--lora-modules`, `--tokenizer`, `--host`, `--port`); the rest are the
simulator's own (`--pods`, `--profile`, `--time-scale`, `--kv-events`, `--kv-replay`).

With `--pods N`, pod i listens on `--port` + i and publishes on the `--kv-events` / `--kv-replay`
ports + i (port 0 stays 0: each pod gets a free port; an ipc:// path gets "-i" appended). One
line per pod tells where it listens and publishes; SIGTERM or Ctrl-C stops every pod cleanly.

Engine limits come from `--profile` (default codellama-13b-a100) and are overridden one by one by
the flags; `--block-size` alone keeps the profile's KV capacity in tokens (as vLLM sizes its
blocks from memory), and `max_model_len` is cut to the capacity unless given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import TYPE_CHECKING

from epp import flags
from epp.sim.profiles import PROFILES, Profile, get_profile

if TYPE_CHECKING:
    from epp.sim.engine import SimConfig

DEFAULT_PROFILE = "codellama-13b-a100"


class _UsageError(ValueError):
    pass


def _port(text: str) -> int:
    """A TCP port, or 0 for any free one (each pod its own)."""
    return 0 if text.strip() == "0" else flags.port_number(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Simulated vLLM pods (continuous batching, prefix cache, KV events) in one process; "
        "one HTTP port per pod."
    )
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--port", type=_port, default=8000, help="first pod's HTTP port; 0 = any (default 8000)")
    g.add_argument("--pods", type=flags.positive_int, default=1, help="pods to run (default 1)")
    g.add_argument(
        "--served-model-name", default="sim-model", help="the model name served (default sim-model)"
    )
    g.add_argument(
        "--lora-modules",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME[=PATH]",
        help="LoRA adapters served beside the model (the path is ignored)",
    )
    g.add_argument("--tokenizer", default=None, help="tokenizer.json or its directory (default epp-tiny)")
    g.add_argument(
        "--api-key",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY",
        help="as vLLM's: /v1, /v2, /inference and /cohere need 'Authorization: Bearer KEY' "
        "(default $VLLM_API_KEY, else open)",
    )
    g.add_argument(
        "--enable-scale-out",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve the /render routes and /inference/v1/generate, as vLLM's flag does (default on; "
        "--no-enable-scale-out answers them 403, as a vLLM started without the flag)",
    )
    g.add_argument(
        "--enable-server-load-tracking",
        action="store_true",
        help="GET /load counts the requests in flight, as vLLM's flag (default off: 0, as vLLM)",
    )
    g.add_argument(
        "--default-max-tokens",
        type=flags.positive_int,
        default=16,
        help="tokens generated when a request names none (default 16; vLLM: the rest of the context)",
    )

    g = parser.add_argument_group("engine")
    g.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        choices=sorted(PROFILES),
        help=f"pod hardware and model: step costs and default limits (default {DEFAULT_PROFILE})",
    )
    g.add_argument("--block-size", type=flags.positive_int, default=None, help="tokens per KV block")
    g.add_argument(
        "--num-gpu-blocks-override",
        "--num-blocks",
        dest="num_blocks",
        type=flags.positive_int,
        default=None,
        help="KV capacity in blocks, as vLLM's flag: one of them is vLLM's null block, so N-1 hold tokens",
    )
    g.add_argument("--max-num-seqs", type=flags.positive_int, default=None, help="running requests at most")
    g.add_argument(
        "--max-num-batched-tokens", type=flags.positive_int, default=None, help="token budget per step"
    )
    g.add_argument(
        "--max-model-len", type=flags.positive_int, default=None, help="prompt + output tokens at most"
    )
    g.add_argument(
        "--prefix-caching-hash-algo",
        choices=["sha256", "sha256_cbor"],
        default="sha256",
        help="how block hashes are computed, as vLLM 0.32's flag (default sha256, vLLM's; seeded from "
        "$PYTHONHASHSEED, else vLLM's fixed seed). KV events carry each hash's low 64 bits, or the "
        "whole digest with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 in the environment, as vLLM's do",
    )
    g.add_argument(
        "--metrics-engine",
        choices=["vllm", "sglang"],
        default="vllm",
        help="whose metric names /metrics uses: vLLM's (default) or SGLang's (sglang:num_queue_reqs, "
        "sglang:num_running_reqs, sglang:token_usage, sglang:cache_config_info, ...)",
    )
    g.add_argument(
        "--time-scale",
        type=flags.positive_float,
        default=1.0,
        help="wall seconds per simulated second (default 1; 0.1 runs ten times faster)",
    )

    g = parser.add_argument_group("KV events")
    g.add_argument(
        "--kv-events", metavar="ENDPOINT", default=None, help="ZMQ PUB endpoint, e.g. tcp://*:5557"
    )
    g.add_argument(
        "--kv-replay", metavar="ENDPOINT", default=None, help="ZMQ ROUTER replay endpoint, e.g. tcp://*:5558"
    )
    g.add_argument(
        "--kv-topic",
        default="",
        help="topic of every message, a template of {address} (the pod's host:port) and {model}: "
        "default '' (vLLM's); llm-d's is 'kv@{address}@{model}', which epp's --kv-events bind needs",
    )
    g.add_argument(
        "--kv-events-encoding",
        choices=["map", "array"],
        default="map",
        help="map: vLLM >= 0.24's encoding (default); array: the legacy layout of vLLM 0.22-0.23",
    )
    g.add_argument(
        "--kv-events-config",
        metavar="JSON",
        default=None,
        help='vLLM\'s form: {"enable_kv_cache_events": true, "endpoint": ..., "replay_endpoint": ...}',
    )


def build_profile(args: argparse.Namespace) -> Profile:
    """The profile named by `--profile` with the limit flags applied."""
    base = get_profile(args.profile)
    block_size = args.block_size or base.block_size
    if args.num_blocks is not None:
        num_blocks = args.num_blocks
    elif args.block_size is not None:
        num_blocks = max(1, base.kv_capacity_tokens // block_size)  # the same KV memory
    else:
        num_blocks = base.num_gpu_blocks
    # Cut to what the usable blocks hold (the null block holds none).
    max_model_len = args.max_model_len or max(1, min(base.max_model_len, block_size * (num_blocks - 1)))
    return base.replace(
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        max_num_seqs=args.max_num_seqs or base.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens or base.max_num_batched_tokens,
        max_model_len=max_model_len,
    )


def nth_endpoint(endpoint: str | None, i: int) -> str | None:
    """Pod i's ZMQ endpoint: a tcp port counted up by i (0 stays 0), an ipc path suffixed "-i"."""
    if endpoint is None or i == 0:
        return endpoint
    if endpoint.startswith("ipc://"):
        return f"{endpoint}-{i}"
    head, sep, port = endpoint.rpartition(":")
    if not endpoint.startswith("tcp://") or not sep or not port.isdigit():
        raise _UsageError(f"with --pods > 1, an endpoint must be tcp://HOST:PORT or ipc://PATH: {endpoint!r}")
    n = int(port)
    return endpoint if n == 0 else f"{head}:{n + i}"


def _kv_endpoints(args: argparse.Namespace) -> tuple[str | None, str | None, str]:
    """(events, replay, topic) from --kv-events/--kv-replay/--kv-topic or vLLM's --kv-events-config."""
    if args.kv_events_config is None:
        if args.kv_replay is not None and args.kv_events is None:
            raise _UsageError("--kv-replay needs --kv-events")
        return args.kv_events, args.kv_replay, args.kv_topic
    if args.kv_events is not None or args.kv_replay is not None:
        raise _UsageError("give --kv-events-config or --kv-events/--kv-replay, not both")
    try:
        conf = json.loads(args.kv_events_config)
    except ValueError as exc:
        raise _UsageError(f"--kv-events-config: invalid JSON: {exc}") from None
    if not isinstance(conf, dict):
        raise _UsageError("--kv-events-config must be a JSON object")
    if not conf.get("enable_kv_cache_events", False) or conf.get("publisher", "zmq") != "zmq":
        return None, None, ""
    topic = conf.get("topic") or args.kv_topic
    return conf.get("endpoint", "tcp://*:5557"), conf.get("replay_endpoint"), topic


def sim_configs(args: argparse.Namespace) -> list[SimConfig]:
    """One `SimConfig` per pod."""
    from epp.sim.engine import SimConfig  # heavy (tokenizers, ZMQ): not at `epp --help`

    profile = build_profile(args)
    events, replay, topic = _kv_endpoints(args)
    adapters = tuple(dict.fromkeys(m.partition("=")[0] for m in args.lora_modules))
    # vLLM's environment variable, read as vLLM reads it (an integer; non-zero means int hashes).
    int_hashes = bool(int(os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")))
    return [
        SimConfig.from_profile(
            profile,
            served_model=args.served_model_name,
            lora_adapters=adapters,
            strict_models=True,  # vLLM answers 404 for a model it does not serve
            api_keys=tuple(k for k in (args.api_key or [os.environ.get("VLLM_API_KEY", "")]) if k),
            tokenizer=args.tokenizer,
            time_scale=args.time_scale,
            default_max_tokens=args.default_max_tokens,
            max_output_tokens=sys.maxsize,  # no cap of its own: max_model_len decides (400)
            kv_events=nth_endpoint(events, i),
            kv_replay=nth_endpoint(replay, i),
            kv_topic=topic,
            kv_encoding=args.kv_events_encoding,
            hash_algo=args.prefix_caching_hash_algo,
            kv_int_hashes=int_hashes,
            metrics_engine=args.metrics_engine,
            scale_out=args.enable_scale_out,
            server_load_tracking=args.enable_server_load_tracking,
        )
        for i in range(args.pods)
    ]


async def _serve(args: argparse.Namespace, configs: list[SimConfig]) -> int:
    import zmq

    from epp.sim.server import bound_address, sim_state, start_sim_server

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runners = []
    try:
        for i, cfg in enumerate(configs):
            port = args.port + i if args.port else 0
            try:
                runner = await start_sim_server(args.host, port, config=cfg)
            except (OSError, zmq.ZMQError) as exc:  # a port in use, a ZMQ endpoint that cannot bind
                print(f"epp sim: pod {i}: cannot start: {exc}", file=sys.stderr)
                return 1
            runners.append(runner)
            state = sim_state(runner)
            p = state.profile
            events = state.kv_endpoint or "off"
            replay = f", replay {state.kv_replay_endpoint}" if state.kv_replay_endpoint else ""
            print(
                f"epp sim: pod {i} serving {cfg.served_model!r} on http://{bound_address(runner)} "
                f"(kv-events {events}{replay}; {p.name}, {p.num_gpu_blocks} blocks x {p.block_size} "
                f"tokens, max_num_seqs {p.max_num_seqs}, time scale {cfg.time_scale:g})",
                flush=True,
            )
        print(f"epp sim: {len(runners)} pod(s) ready; SIGTERM or Ctrl-C stops them", flush=True)
        await stop.wait()
        print("epp sim: stopping", flush=True)
        return 0
    finally:
        for r in runners:
            await r.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def run(args: argparse.Namespace) -> int:
    """Serve the pods until SIGTERM or Ctrl-C; 0 then, 1 if a pod cannot start, 2 on bad flags."""
    try:
        configs = sim_configs(args)
    except (_UsageError, ValueError) as exc:  # ValueError: a profile vLLM would not start with
        print(f"epp sim: error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(args, configs))
