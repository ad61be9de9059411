"""The whole path against real vLLM: client -> Envoy -> (ext-proc) epp -> a fleet of CPU vLLMs.

    OpenAI client ──► Envoy ──────────────────────────────► vLLM pod-0, pod-1, pod-2
                        │ ext_proc                             │ KV events (ZMQ PUB), replay (ROUTER)
                        ▼                                      ▼
                   epp serve --kv-events connect ◄── pod-0, pod-1 directly; pod-2 via `Forwarder`
                   (--endpoints-file, --tokenizer per chat-template style)

* One model (e2e/vllm/build_model.py) served by every pod under the name `tiny` and under one alias
  per chat-template style; epp knows the styles' templates from `--tokenizer STYLE=DIR`, and `tiny`
  gets the tokenizer epp ships (the `--tokenizer PATH` default names epp/tokenize/data itself).
* Every pod has a small KV cache (`NUM_BLOCKS` blocks of 32 tokens), so a few prompts evict.
* pod-0 and pod-1 bind their publisher and replay sockets on ephemeral loopback ports
  (`tcp://*:0` with VLLM_HOST_IP=127.0.0.1), read back from GET /kv_event_sources; pod-2 dials
  a `Forwarder` (faults on demand) and binds its replay socket on a fixed port, so both survive
  its restart.
* epp reads a standalone endpoints file naming each pod's publisher and replay endpoints and its
  model; tests edit the file to take a pod out of the pool.

`start_stack` waits until every pod is routable and its events reach epp: each pod is sent short
prompts until epp has applied a batch from it (a PUB drops what it sends before the subscription
is in place, so one attempt is not enough).
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import openai
import yaml

from e2e.harness import EnvoyGateway, EppProcess, parse_prometheus
from e2e.vllm.fleet import VllmServer, start_all
from e2e.vllm.forwarder import Forwarder
from epp.gateway.envoy import GatewayParams, PodsMode
from epp.gateway.processes import HOST, free_ports, stable_ports

MODEL = "tiny"
NUM_BLOCKS = 128  # 4,096 tokens of KV cache per pod: a few 1k-token prompts evict
EPP_TINY = Path(__file__).resolve().parent.parent.parent / "epp" / "tokenize" / "data"


@dataclasses.dataclass
class Pod:
    server: VllmServer
    kv_events: str  # what epp subscribes to
    kv_replay: str
    forwarder: Forwarder | None = None

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def url(self) -> str:
        return self.server.url

    def entry(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "model": MODEL,
            "kvEvents": self.kv_events,
            "kvReplay": self.kv_replay,
        }


class VllmStack:
    def __init__(self, pods: list[Pod], epp: EppProcess, envoy: EnvoyGateway, endpoints_file: Path) -> None:
        self.pods = pods
        self.epp = epp
        self.envoy = envoy
        self.endpoints_file = endpoints_file
        self._clients: list[openai.OpenAI] = []

    @property
    def url(self) -> str:
        return self.envoy.url

    def client(self, timeout: float) -> openai.OpenAI:
        """An OpenAI client through Envoy, closed after the test (`close_clients`): its pooled
        connections must not outlive it (pytest turns the unclosed sockets into errors)."""
        c = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=timeout)
        self._clients.append(c)
        return c

    def close_clients(self) -> None:
        while self._clients:
            self._clients.pop().close()

    def logs(self) -> list[tuple[str, Path]]:
        out = [("epp log", self.epp.process.log_path), ("envoy log", self.envoy.log_path)]
        return out + [(f"vLLM {p.server.name} log", p.server.log_path) for p in self.pods]

    def write_endpoints(self, pods: Sequence[Pod]) -> None:
        # Write-then-rename: epp must never read a half-written file.
        tmp = self.endpoints_file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump({"endpoints": [p.entry() for p in pods]}))
        tmp.replace(self.endpoints_file)

    # --- epp's debug API and metrics ----------------------------------------------------------

    def _debug(self, what: str, body: dict[str, Any], path: str) -> dict[str, Any]:
        url = f"http://{HOST}:{self.epp.metrics_port}/debug/{what}?path={path}"
        req = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                out: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            with err:  # it holds the response's socket
                return {"status": err.code, "error": err.read().decode("utf-8", "replace")}
        return out

    def explain(self, body: dict[str, Any], path: str = "/v1/completions") -> dict[str, Any]:
        """POST /debug/score: the decision epp would make now, with per-endpoint predictions."""
        return self._debug("score", body, path)

    def tokenize(self, body: dict[str, Any], path: str) -> dict[str, Any]:
        """POST /debug/tokenize: exactly the token ids epp scores for this request."""
        return self._debug("tokenize", body, path)

    def endpoints(self) -> dict[str, dict[str, Any]]:
        with urllib.request.urlopen(
            f"http://{HOST}:{self.epp.metrics_port}/debug/endpoints", timeout=10
        ) as r:
            rows = json.loads(r.read())["endpoints"]
        return {row["address"]: row for row in rows}

    def epp_metric(self, name: str) -> dict[str, float]:
        return parse_prometheus(self.epp.metrics_text(), name)

    def kv_counter(self, name: str, pod: Pod, **labels: str) -> float:
        """An `epp_kv_events_*` counter of one pod (labels given narrow it further), 0 if absent."""
        want = {"pod": pod.address, **labels}
        total = 0.0
        for key, value in self.epp_metric(name).items():
            have = dict(part.split("=", 1) for part in key.split(",") if "=" in part)
            if all(have.get(k, "").strip('"') == v for k, v in want.items()):
                total += value
        return total


def prediction(explained: dict[str, Any], pod: Pod) -> dict[str, Any]:
    """The explain row of `pod` (matched_blocks, tier, cached_tokens, ...)."""
    for row in explained.get("endpoints", []):
        if row["endpoint"] == pod.address:
            return dict(row)
    raise AssertionError(f"{pod.address} not among the candidates: {json.dumps(explained)[:1500]}")


def wait_for(check: Callable[[], bool], *, within: float, what: str, interval: float = 0.1) -> None:
    """Poll `check` until it holds (bounded); the assertion names what never happened."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    if not check():
        raise AssertionError(f"{what} (not within {within:.0f} s)")


def post(url: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


def complete_on(pod: Pod, prompt: str | list[int], max_tokens: int = 1) -> dict[str, Any]:
    """A completion sent straight to one pod (not through Envoy), with its prompt token ids."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "return_token_ids": True}
    return post(f"{pod.url}/v1/completions", body)


def cached_tokens(answer: dict[str, Any]) -> int:
    details = answer["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def request_body(prompt: str | list[int] | dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(body, API path) of a completions prompt, or of a whole chat body given as a dict."""
    if isinstance(prompt, dict):
        return prompt, "/v1/chat/completions"
    return {"model": MODEL, "prompt": prompt}, "/v1/completions"


def settle(
    stack: VllmStack, pod: Pod, prompt: str | list[int] | dict[str, Any], within: float = 20.0
) -> dict[str, Any]:
    """Wait until epp's index holds, for `pod`, every full block of `prompt` (a completions prompt
    or a chat body) from real KV events (tier "gpu", not a speculative entry of epp's own); the
    explain row is returned."""
    body, path = request_body(prompt)
    seen: dict[str, Any] = {}

    def held() -> bool:
        found = stack.explain(body, path)
        row = prediction(found, pod)
        seen.update(row, request_blocks=found["request_blocks"])
        return bool(row["tier"] == "gpu" and row["matched_blocks"] == found["request_blocks"] > 0)

    wait_for(held, within=within, what=f"epp never indexed the prompt's blocks on {pod.address}: {seen}")
    return seen


def ensure_events_flow(stack: VllmStack, pod: Pod, within: float = 90.0) -> None:
    """Send short distinct prompts to `pod` until epp applies one of its batches."""
    before = stack.kv_counter("epp_kv_events_batches_total", pod)
    deadline = time.monotonic() + within
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        complete_on(pod, [1000 + attempt % 5000, *range(100, 140)])  # 41 ids: one full block
        try:
            wait_for(
                lambda: stack.kv_counter("epp_kv_events_batches_total", pod) > before,
                within=2.0,
                what="batch",
            )
            return
        except AssertionError:
            continue
    raise AssertionError(f"no KV-event batch of {pod.address} reached epp in {within:.0f} s")


# --- starting it ----------------------------------------------------------------------------------


def epp_tokenizer_args(tokenizers_dir: Path) -> list[str]:
    args = ["--tokenizer", str(EPP_TINY)]
    for d in sorted(tokenizers_dir.iterdir()):
        args += ["--tokenizer", f"{d.name}={d}"]
    return args


def start_stack(
    workdir: Path, python: Path, model_root: Path, on_stop: Callable[[str, Callable[[], None]], None]
) -> VllmStack:
    """Start the fleet, epp and Envoy; `on_stop(what, fn)` registers each stop as soon as it exists."""
    model_dir = model_root / "model"
    styles = sorted(d.name for d in (model_root / "tokenizers").iterdir())
    ports = stable_ports(6) + free_ports(1)
    fwd = Forwarder(ports[3], ports[4])
    fwd.start()
    on_stop("forwarder", fwd.stop)
    pods: list[Pod] = []
    for i in range(3):
        if i < 2:
            events = {"endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"}
        else:
            events = {"endpoint": fwd.upstream, "replay_endpoint": f"tcp://{HOST}:{ports[5]}"}
        server = VllmServer(
            name=f"pod-{i}",
            python=python,
            model_dir=model_dir,
            served_names=[MODEL, *styles],
            port=ports[i],
            kv_events={"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv", **events},
            workdir=workdir,
            num_blocks=NUM_BLOCKS,
        )
        on_stop(f"vLLM {server.name}", server.stop)
        pods.append(Pod(server, kv_events="", kv_replay=""))
    start_all([p.server for p in pods])
    for pod in pods[:2]:
        sources = pod.server.kv_sources()
        pod.kv_events, pod.kv_replay = sources["endpoint"], sources["replay_endpoint"]
    pods[2].kv_events, pods[2].kv_replay, pods[2].forwarder = fwd.downstream, f"tcp://{HOST}:{ports[5]}", fwd

    endpoints_file = workdir / "endpoints.yaml"
    endpoints_file.write_text(yaml.safe_dump({"endpoints": [p.entry() for p in pods]}))
    epp = EppProcess(
        workdir,
        endpoints_file=endpoints_file,
        # A scrape costs a vLLM API server ~0.7 ms of CPU (4-5 ms for the whole page, before the
        # scraper asked for the filtered one): 4/s per pod, not 20, on this suite's two cores.
        extra_args=[
            "--kv-events",
            "connect",
            "--refresh-metrics-interval",
            "250ms",
            *epp_tokenizer_args(model_root / "tokenizers"),
        ],
    )
    on_stop("epp", epp.stop)
    epp.start(timeout=60)
    params = GatewayParams(
        listen_port=ports[6],
        admin_port=free_ports(1)[0],
        epp_addresses=(epp.grpc_address,),
        pods_mode=PodsMode.ORIGINAL_DST,
        process_responses=True,
        route_timeout=300.0,
        access_log_path=str(workdir / "access.log"),
    )
    envoy = EnvoyGateway(workdir, params)
    on_stop("envoy", envoy.stop)
    envoy.start(timeout=60)
    stack = VllmStack(pods, epp, envoy, endpoints_file)
    wait_for(
        lambda: all(row["routable"] for row in stack.endpoints().values()) and len(stack.endpoints()) == 3,
        within=60,
        what="epp never saw every pod routable",
    )
    for pod in pods:
        ensure_events_flow(stack, pod)
    return stack
