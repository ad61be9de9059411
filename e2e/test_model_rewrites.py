"""InferenceModelRewrite end to end: a Kubernetes API server (tests/k8s/fake_apiserver.py, the real
list/watch protocol) holds an InferencePool, its pod and an llm-d.ai InferenceModelRewrite;
`epp serve --pool-name` reads them; a real Envoy sends client requests for the alias through epp
to a simulated vLLM that serves only the target models (`strict_models`: the alias itself would be
a 404). The pod counts the model names it received (/sim/stats `models`), and the client sees
the name it asked for in every answer, streamed or not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e.harness import (
    Cleanup,
    EnvoyGateway,
    EppProcess,
    SimBackends,
    eventually,
    parse_prometheus,
    request,
    wait_routable,
)
from epp.gateway.envoy import GatewayParams, PodsMode
from epp.gateway.processes import free_ports
from epp.sim.engine import SimConfig
from tests.k8s import fake_apiserver as fake

pytestmark = pytest.mark.e2e

REWRITES = "inferencemodelrewrites.llm-d.ai"


@pytest.fixture
async def api() -> AsyncIterator[fake.FakeApiServer]:
    server = fake.FakeApiServer()
    await server.start()
    yield server
    await server.stop()


async def test_an_alias_reaches_the_pod_as_its_targets_by_weight_and_returns_as_asked(
    tmp_path: Path, cleanup: Cleanup, session: aiohttp.ClientSession, api: fake.FakeApiServer
) -> None:
    sims = SimBackends(
        [SimConfig(time_scale=0.01, strict_models=True, served_model="llama-v1", lora_adapters=("llama-v2",))]
    )
    cleanup.push("sim backends", sims.stop)
    sims.start()
    (address,) = sims.addresses
    host, port = address.rsplit(":", 1)
    api.create("inferencepools", fake.pool(ports=(int(port),)))
    api.create("pods", fake.pod("vllm-0", host))
    api.create(REWRITES, fake.rewrite("canary", [fake.rule("llama", targets={"llama-v1": 3, "llama-v2": 1})]))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(fake.kubeconfig(api.url))

    epp = EppProcess(
        tmp_path,
        # Metrics auth (on by default with a pool) is tests/k8s/test_metricsauth.py's: off here, so
        # the test reads the decisions without a token.
        extra_args=["--pool-name", "pool", "--pool-namespace", "default", "--kubeconfig", str(kubeconfig),
                    "--metrics-endpoint-auth=false"],
    )  # fmt: skip
    cleanup.add_log("epp log", epp.process.log_path)
    cleanup.push("epp", epp.stop)
    # Starting blocks while it waits for epp: off this loop, which serves the API server.
    await asyncio.to_thread(epp.start)
    listen, admin = free_ports(2)
    envoy = EnvoyGateway(
        tmp_path,
        GatewayParams(
            listen_port=listen,
            admin_port=admin,
            epp_addresses=(epp.grpc_address,),
            pods_mode=PodsMode.ORIGINAL_DST,
            route_timeout=60.0,
            access_log_path=str(tmp_path / "access.log"),
        ),
    )
    cleanup.add_log("envoy log", envoy.log_path)
    cleanup.push("envoy", envoy.stop)
    await asyncio.to_thread(envoy.start)
    await wait_routable(session, envoy.url)

    url = envoy.url + "/v1/chat/completions"
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    n = 40
    for _ in range(n):
        reply = await request(session, "POST", url, body=body)
        assert reply.status == 200, reply.text
        assert reply.json()["model"] == "llama"  # the name the client asked for
    reply = await request(session, "POST", url, body={**body, "stream": True})
    assert reply.status == 200
    assert "llama-v" not in reply.text and reply.text.count('"model":"llama"') >= 2

    received = dict(sims.stats()[0]["models"])
    assert "llama" not in received  # every request reached the pod as a target model
    assert received["llama-v1"] + received["llama-v2"] == n + 1
    assert abs(received["llama-v2"] - n / 4) <= 2  # weights 3:1, spread evenly

    # A model without a rule passes unchanged (and the strict pod refuses it, as vLLM would).
    reply = await request(session, "POST", url, body={**body, "model": "mistral"})
    assert reply.status == 404

    # Rewrites follow the API: retarget the rule, and the requests that follow go to the new model.
    def retarget(obj: dict[str, Any]) -> None:
        obj["spec"]["rules"] = [fake.rule("llama", targets={"llama-v2": None})]

    api.update(REWRITES, "canary", retarget)

    async def settled() -> bool:
        v1 = sims.stats()[0]["models"]["llama-v1"]
        for _ in range(5):
            assert (await request(session, "POST", url, body=body)).status == 200
        return bool(sims.stats()[0]["models"]["llama-v1"] == v1)

    for _ in range(20):
        if await settled():
            break
    else:
        raise AssertionError("requests for the alias still reach llama-v1 after the rewrite changed")

    def counted() -> float:
        decisions = parse_prometheus(epp.metrics_text(), "llm_d_epp_model_rewrite_decisions_total")
        return sum(v for k, v in decisions.items() if 'model_rewrite_name="canary"' in k)

    await eventually(lambda: counted() >= n + 1 + 5, within=5.0, what="rewrite decisions in epp's metrics")
