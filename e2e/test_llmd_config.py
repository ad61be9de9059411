"""llm-d Router v0.10's configuration shape end to end, through a real Envoy: the endpoints from
llm-d's file discovery, a session pinned by the `x-session-token` epp's session-affinity scorer
answers with, and GIE's conformance verifier reporting the endpoint Envoy served from."""

from __future__ import annotations

import base64
from collections.abc import Callable

import aiohttp
import pytest

from e2e.harness import Stack, request, wait_routable
from epp.gateway.envoy import PodsMode

pytestmark = pytest.mark.e2e

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: file-discovery, parameters: {path: DISCOVERY_FILE}}
- {type: max-score-picker}
- {type: session-affinity-scorer}
- {type: destination-endpoint-served-verifier}
dataLayer:
  discovery: {pluginRef: file-discovery}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: session-affinity-scorer, weight: 10}, {pluginRef: max-score-picker}]
"""


async def test_file_discovery_session_tokens_and_the_served_endpoint(
    stacks: Callable[..., Stack], session: aiohttp.ClientSession
) -> None:
    stack = stacks(
        n_backends=3,
        endpoints_source="discovery",
        pods_mode=PodsMode.OVERRIDE_HOST,  # Envoy's override_host reports the host it served from
        epp_args=["--allow-experimental-plugins", "--config-text", CONFIG],
    )
    await wait_routable(session, stack.url)
    body = {"model": "sim-model", "prompt": "Once upon a time", "max_tokens": 2}
    first = await request(session, "POST", f"{stack.url}/v1/completions", body=body)
    assert first.status == 200, first.text[:300]
    assert first.headers["x-conformance-test-served-endpoint"] == first.served_by
    token = first.headers["x-session-token"]
    index = stack.sims.addresses.index(first.served_by)
    assert base64.b64decode(token).decode() == f"default/sim-{index}"  # llm-d's namespace/name
    for _ in range(6):  # ties break at random without the token; it pins them
        again = await request(
            session, "POST", f"{stack.url}/v1/completions", body=body, headers={"x-session-token": token}
        )
        assert again.status == 200 and again.served_by == first.served_by
