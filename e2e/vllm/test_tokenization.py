"""epp's token ids equal the ids vLLM feeds its engine, or both refuse: the differential test, a
seeded few hundred requests of every kind (e2e/vllm/chat_requests.py) in every chat-template style.

Each request goes to vLLM (pod-0, directly: through Envoy, epp's own refusal would stand in for
vLLM's) and to epp's `POST /debug/tokenize` (e2e/vllm/differential.py). vLLM's side is the
request itself with `"return_token_ids": true`, which answers the engine prompt's ids; vLLM's
POST /tokenize takes another path (reference notes, vllm-chat-preprocessing.md) and is not used.
Every disagreement fails the test - different ids, a refusal on one side only, a different status
- listed with both answers. The one tolerance (differential.classify): over-long prompts while epp
does not yet refuse them. `scripts/differential_tokenize.py` runs the same comparison at scale.
The routes beyond chat and completions (Anthropic's, Responses, generate, the /render routes) get
a seeded few dozen each.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from e2e.harness import EppProcess
from e2e.vllm import api_requests, chat_requests, differential
from e2e.vllm.chat_requests import Case
from e2e.vllm.fleet import MAX_MODEL_LEN, STARTUP_TIMEOUT, render_server
from e2e.vllm.stack import VllmStack
from epp.gateway.processes import HOST, stable_ports

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

SEED = 20261125
CASES = 360
BOUNDARY_CHATS = 2


def _urls(stack: VllmStack) -> tuple[str, str]:
    return stack.pods[0].url, f"http://{HOST}:{stack.epp.metrics_port}"


def test_epp_tokenizes_like_vllm(stack: VllmStack) -> None:
    vllm_url, epp_url = _urls(stack)
    cases = chat_requests.cases(SEED, CASES)

    def measure(case: Case) -> int | None:
        ids = differential.vllm_answer(vllm_url, case).ids
        return None if ids is None else len(ids)

    cases += chat_requests.boundary_cases(measure, SEED, n_chats=BOUNDARY_CHATS)
    epp_length = differential.epp_checks_length(epp_url, MAX_MODEL_LEN)
    started = time.monotonic()
    results = differential.run(cases, vllm_url=vllm_url, epp_url=epp_url, epp_length=epp_length)
    counts = differential.counts(results)
    print(f"differential: {len(results)} requests in {time.monotonic() - started:.0f} s: {counts}")
    bad = differential.disagreements(results)
    listed = "\n".join(r.describe() for r in bad[:10])
    assert not bad, f"{len(bad)} of {len(results)} requests disagree:\n{listed}"
    # The mix must keep exercising both sides of the comparison.
    assert counts.get("equal", 0) >= CASES // 2, counts
    assert counts.get("both refuse", 0) >= CASES // 20, counts


def test_completions_without_special_tokens(stack: VllmStack) -> None:
    """vLLM's completions endpoint takes `add_special_tokens` (default true): false means no BOS."""
    vllm_url, epp_url = _urls(stack)
    prompts = ["Hello there, how are you?", "  leading spaces", "<s> a literal BOS string", "12345 numbers"]
    cases = [
        Case("/v1/completions", {"model": "tiny", "prompt": p, "add_special_tokens": False, "max_tokens": 1})
        for p in prompts
    ]
    results = differential.run(cases, vllm_url=vllm_url, epp_url=epp_url, epp_length=True)
    assert [r.outcome for r in results] == ["equal"] * len(prompts), [r.describe() for r in results]
    # No BOS (id 1) added: only the prompt that spells "<s>" itself starts with it.
    assert [(r.vllm.ids or [0])[0] == 1 for r in results] == [False, False, True, False]


# --- the routes beyond chat and completions (e2e/vllm/api_requests.py) ----------------------------

ROUTE_CASES = 30  # per route; `scripts/differential_tokenize.py --routes` runs thousands


@pytest.mark.parametrize("route", api_requests.ROUTES)
def test_every_route_tokenizes_and_refuses_like_vllm(stack: VllmStack, route: str) -> None:
    """Anthropic's Messages and count_tokens, Responses, /inference/v1/generate and the /render
    routes, in the pods' own template (`tiny`: Anthropic and Responses bodies cannot carry one)."""
    vllm_url, epp_url = _urls(stack)
    cases = api_requests.route_cases(SEED, route, ROUTE_CASES, ["tiny"])
    results = differential.run(cases, vllm_url=vllm_url, epp_url=epp_url, epp_length=True)
    counts = differential.counts(results)
    bad = differential.disagreements(results)
    listed = "\n".join(r.describe() for r in bad[:10])
    assert not bad, f"{route}: {len(bad)} of {len(results)} disagree:\n{listed}"
    assert counts.get("equal", 0) >= ROUTE_CASES // 2, counts


def test_a_token_producer_renders_at_the_pods(stack: VllmStack, tmp_path: Path) -> None:
    """llm-d's token-producer without a local tokenizer: epp asks the pods' /render, and routes on
    exactly the ids vLLM would feed its engine."""
    _renders_like_the_pods(stack, tmp_path, "{modelName: tiny}")


def test_a_token_producer_renders_at_a_render_server(
    stack: VllmStack, tmp_path: Path, vllm_python: Path, model_root: Path
) -> None:
    """llm-d's render sidecar (`router.tokenizer.enabled` in its chart and in epp's): a `vllm
    launch render` server of the model beside epp, named by the token-producer's `vllm.url`. epp
    routes on the ids the pods' engine would be fed, from a process that runs no engine."""
    (port,) = stable_ports(1)
    server = render_server(
        name="render",
        python=vllm_python,
        model_dir=model_root / "model",
        served_name="tiny",
        port=port,
        workdir=tmp_path,
    )
    server.start()
    try:
        server.wait_healthy(time.monotonic() + STARTUP_TIMEOUT)
        served = _renders_like_the_pods(
            stack, tmp_path, f'{{modelName: tiny, vllm: {{url: "http://{HOST}:{port}"}}}}'
        )
    finally:
        server.stop()
    # The ids came from the render server, not from the pods (epp's fallback without a url).
    renders = server.log_path.read_text(errors="replace").count('/render HTTP/1.1" 200')
    assert renders >= served, (renders, served)


def _renders_like_the_pods(stack: VllmStack, tmp_path: Path, parameters: str) -> int:
    """The differential test of epp's ids against the pods' engine, with `parameters` for the
    token-producer; returns how many requests the pods served (each compared)."""
    config = (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        f"- type: token-producer\n  parameters: {parameters}\n- {{type: prefix-cache-scorer}}\n"
    )
    epp = EppProcess(
        tmp_path, endpoints=[p.address for p in stack.pods], extra_args=["--config-text", config]
    )
    epp.start(timeout=60)
    try:
        epp_url = f"http://{HOST}:{epp.metrics_port}"
        rng_cases = [
            c
            for c in chat_requests.cases(SEED + 1, 30)
            if c.style == "tiny" and "chat_template" not in c.body
        ]
        cases = [c for c in rng_cases if not c.kind.startswith(("refused", "edge"))][:8]
        cases += api_requests.route_cases(SEED, "/v1/messages", 4, ["tiny"])
        cases += api_requests.route_cases(SEED, "/v1/responses", 4, ["tiny"])
        served = [c for c in cases if differential.vllm_answer(stack.pods[0].url, c).status == 200]
        results = differential.run(served, vllm_url=stack.pods[0].url, epp_url=epp_url, epp_length=True)
        assert [r.outcome for r in results] == ["equal"] * len(served), [r.describe() for r in results]
        assert len(served) >= 8
        return len(served)
    finally:
        epp.stop()
