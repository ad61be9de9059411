"""llm-d Router v0.10's configuration shape end to end, through a real Envoy: the endpoints from
llm-d's file discovery, a session pinned by the `x-session-token` epp's session-affinity scorer
answers with, GIE's conformance verifier reporting the endpoint Envoy served from, and one epp
serving every stage of llm-d's coordinator pipeline (`header-profile-handler`)."""

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


STAGES = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: encode-filter}
- {type: prefill-filter}
- {type: decode-filter}
- {type: queue-scorer}
- {type: max-score-picker, name: pick}
- {type: header-profile-handler}
schedulingProfiles:
- {name: encode, plugins: [{pluginRef: encode-filter}, {pluginRef: pick}]}
- {name: prefill, plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}, {pluginRef: pick}]}
- {name: decode, plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}, {pluginRef: pick}]}
"""


async def test_the_epp_profile_header_picks_the_stage_and_its_pod(
    stacks: Callable[..., Stack], session: aiohttp.ClientSession
) -> None:
    roles = ["encode", "prefill", "decode"]
    stack = stacks(
        n_backends=3,
        endpoints_source="file",
        endpoint_labels=[{"llm-d.ai/role": r} for r in roles],
        epp_args=["--allow-experimental-plugins", "--config-text", STAGES],
    )
    await wait_routable(session, stack.url)
    body = {"model": "sim-model", "prompt": "Once upon a time", "max_tokens": 2}
    url = f"{stack.url}/v1/completions"
    for header, role in (("encode", "encode"), ("prefill", "prefill"), ("decode", "decode"), ("", "decode")):
        for _ in range(3):
            headers = {"EPP-Profile": header} if header else {}
            reply = await request(session, "POST", url, body=body, headers=headers)
            assert reply.status == 200, reply.text[:300]
            assert reply.served_by == stack.sims.addresses[roles.index(role)], (header, reply.served_by)
    wrong = await request(session, "POST", url, body=body, headers={"EPP-Profile": "prefil"})
    assert wrong.status == 400 and "no scheduling profile 'prefil'" in wrong.text, wrong.text[:300]
