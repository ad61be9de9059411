"""The demo's workload and its client: seeded tenants and prompts, one request, its TTFT.

`build_workload` is a function of its arguments only, so every arm sends the same requests in the
same order. `run_workload` sends them through the gateway from closed-loop aiohttp clients and
records, per request, what the report needs (TTFT to the first SSE data chunk, end-to-end latency,
prompt and cached tokens from the final usage chunk, the HTTP status and the serving pod).
`best_hit_rate` is the cache hit rate no router could beat on a workload.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Imported where used at run time: `epp.cli` imports the demo package on every start of
    # `epp serve`, which should not pay for the HTTP client.
    import aiohttp

MODEL = "demo-model"
CHARS_PER_TOKEN = 4  # a rough sizing rule (epp-tiny gives ~3.7 for these prompts)
BLOCK_TOKENS = 16  # KV block size reported by the sims; epp's prefix scorer uses 16 too

# Bounds: one request may take at most this long; an arm's whole workload at most ARM_TIMEOUT_S.
REQUEST_TIMEOUT_S = 60.0
ARM_TIMEOUT_S = 600.0


# --- tenants and prompts ---------------------------------------------------------------------------

_TOPICS = (
    "billing", "refunds", "shipping", "warranty", "accounts", "security", "privacy", "returns",
    "invoices", "subscriptions", "installations", "upgrades", "outages", "discounts", "exports",
)  # fmt: skip
_WORDS = (
    "always", "never", "customer", "order", "policy", "agent", "confirm", "verify", "escalate",
    "within", "business", "days", "record", "ticket", "reference", "number", "request", "manager",
    "approve", "receipt", "account", "detail", "summary", "polite", "concise", "answer", "before",
    "after", "unless", "explicitly", "written", "consent", "region", "currency", "limit", "standard",
)  # fmt: skip
_VERBS = ("change", "cancel", "move", "merge", "reset", "export", "renew", "split", "pause", "transfer")
_NOUNS = ("order", "invoice", "plan", "address", "password", "device", "licence", "payment", "seat")
_EVENTS = ("a failed payment", "moving abroad", "a price change", "a duplicate charge", "a late delivery")


@dataclasses.dataclass(frozen=True, slots=True)
class DemoRequest:
    group: int
    question: str


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    system_prompts: tuple[str, ...]
    requests: tuple[DemoRequest, ...]

    def body(self, i: int, output_tokens: int) -> dict[str, Any]:
        req = self.requests[i]
        return {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": self.system_prompts[req.group]},
                {"role": "user", "content": req.question},
            ],
            "max_tokens": output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


def _system_prompt(rng: random.Random, group: int, chars: int) -> str:
    """A readable tenant-specific policy text of exactly `chars` characters."""
    head = (
        f"You are the support assistant of tenant {group + 1:02d}. Follow the policies below for "
        "every answer.\n"
    )
    parts = [head]
    length = len(head)
    rule = 1
    # Bounded: each rule adds at least ~40 characters, so chars/40 + 1 rules always suffice.
    while length < chars and rule <= chars // 40 + 1:
        topic = rng.choice(_TOPICS)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 16)))
        line = f"Rule {group + 1}.{rule} ({topic}): {words}.\n"
        parts.append(line)
        length += len(line)
        rule += 1
    return "".join(parts)[:chars]


def build_workload(*, groups: int, requests: int, seed: int, prompt_chars: int) -> Workload:
    """Tenants' system prompts and the request sequence; a function of its arguments only."""
    rng = random.Random(seed)
    prompts = tuple(_system_prompt(rng, g, prompt_chars) for g in range(groups))
    reqs = []
    for i in range(requests):
        group = rng.randrange(groups)
        question = (
            f"Customer {i + 1} (tenant {group + 1:02d}): how do I {rng.choice(_VERBS)} my "
            f"{rng.choice(_NOUNS)} after {rng.choice(_EVENTS)}? Reference {rng.randrange(10**8):08d}."
        )
        reqs.append(DemoRequest(group, question))
    return Workload(prompts, tuple(reqs))


def best_hit_rate(workload: Workload) -> float:
    """Cached/prompt tokens if every request hit its tenant's whole system prompt except the first.

    Counted on the tokens the simulator computes (the chat template of epp-tiny, as vLLM's chat
    endpoint renders it): only full blocks are cacheable, so a request can at best reuse the full
    blocks it shares with its tenant's first request, and never its own last token.
    """
    from epp.tokenize.chat import encode_chat
    from epp.tokenize.tokenizer import load_shipped

    tok = load_shipped()
    bs = BLOCK_TOKENS
    first: dict[int, list[int]] = {}
    cached = prompt = 0
    for i, req in enumerate(workload.requests):
        ids = encode_chat(tok, workload.body(i, 1))
        n = len(ids)
        prompt += n
        seen = first.get(req.group)
        if seen is None:
            first[req.group] = ids
            continue
        pairs = enumerate(zip(ids, seen, strict=False))
        common = next((k for k, (a, b) in pairs if a != b), min(n, len(seen)))
        cached += min(common // bs, (n - 1) // bs) * bs
    return cached / prompt if prompt else 0.0


# --- measuring ----------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class RequestResult:
    index: int
    group: int
    status: int = 0
    error: str = ""
    ttft_s: float = math.nan
    latency_s: float = math.nan
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    pod: str = ""
    dropped: str = ""  # x-llm-d-request-dropped-reason of a request epp answered itself


async def _one_request(
    session: aiohttp.ClientSession, url: str, workload: Workload, index: int, output_tokens: int
) -> RequestResult:
    result = RequestResult(index=index, group=workload.requests[index].group)
    body = json.dumps(workload.body(index, output_tokens)).encode()
    await post_streaming(session, url, body, result)
    return result


async def post_streaming(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    result: RequestResult,
    headers: dict[str, str] | None = None,
) -> None:
    """POST one streaming OpenAI request and fill `result`: status, serving pod, TTFT (to the first
    SSE data line), end-to-end latency and the final usage chunk's token counts. Never raises for a
    failed request: the failure is `result.error`. (`epp bench --mode live` sends its requests
    through this too.)"""
    import aiohttp

    started = time.perf_counter()
    try:
        sent = {"content-type": "application/json", **(headers or {})}
        async with session.post(url, data=body, headers=sent) as resp:
            result.status = resp.status
            result.pod = resp.headers.get("x-sim-server", "")
            result.dropped = resp.headers.get("x-llm-d-request-dropped-reason", "")
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return
            done = False
            # Lines, not chunks: an SSE event may be split across reads. The loop ends with the
            # stream, whose length the server bounds (output_tokens + a few events).
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                if math.isnan(result.ttft_s):
                    result.ttft_s = time.perf_counter() - started
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                elif b'"usage"' in payload:
                    _read_usage(json.loads(payload), result)
            result.latency_s = time.perf_counter() - started
            if not done:
                result.error = "stream ended without [DONE]"
            elif not result.prompt_tokens:
                result.error = "no usage in the stream"
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]


def _read_usage(event: Any, result: RequestResult) -> None:
    """Prompt and cached tokens from the final chunk's OpenAI `usage` (vLLM's spelling)."""
    usage = event.get("usage") if isinstance(event, dict) else None
    if not isinstance(usage, dict):
        return
    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    result.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    result.cached_tokens = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0


async def run_workload(
    base_url: str, workload: Workload, *, concurrency: int, output_tokens: int
) -> tuple[list[RequestResult], float]:
    """Send every request of `workload` from `concurrency` closed-loop clients; (results, wall s)."""
    import asyncio

    import aiohttp

    url = base_url + "/v1/chat/completions"
    results: list[RequestResult | None] = [None] * len(workload.requests)
    next_index = iter(range(len(workload.requests)))

    async def client(session: aiohttp.ClientSession) -> None:
        # Each client takes the next request in workload order, so all arms see the same sequence.
        for i in next_index:
            results[i] = await _one_request(session, url, workload, i, output_tokens)

    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        # A TaskGroup (not gather) so that Ctrl-C cancels the clients without stray
        # "exception was never retrieved" reports.
        async with asyncio.timeout(ARM_TIMEOUT_S), asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(client(session))
        wall = time.perf_counter() - started
    return [r for r in results if r is not None], wall


async def wait_routable(base_url: str, *, within: float = 20.0) -> None:
    """GET /v1/models through the gateway until a pod answers 200 (bounded by `within`)."""
    import asyncio

    import aiohttp

    deadline = time.monotonic() + within
    last = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(base_url + "/v1/models") as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.1)
    raise TimeoutError(f"gateway {base_url} never answered GET /v1/models with 200 (last: {last})")
