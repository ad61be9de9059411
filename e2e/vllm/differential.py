"""epp against real vLLM, request by request: the same body to both, their token ids (or refusals)
compared.

vLLM's side is the request itself, POSTed straight to one vLLM server (never through Envoy, where
epp's own refusal would stand in for vLLM's) with `"return_token_ids": true`: the answer carries
the ids the engine was fed (`prompt_token_ids`), or a 400 with vLLM's reason. epp's side is its
`POST /debug/tokenize`: exactly the ids epp scores, or epp's refusal (status and reason).

Each route has its own way of telling what vLLM fed its engine (`vllm_answer`):
- chat and completions: `"return_token_ids": true` (the engine prompt's ids);
- /inference/v1/generate: the same (`prompt_token_ids`);
- the /render routes: the ids they render (`token_ids`; completions: the first prompt's);
- /v1/messages and /v1/responses: the request itself for vLLM's status, and, when it serves it,
  the same body rendered by the route's /render twin for the ids - held to the prompt token
  count the answer's usage reports (Anthropic's input + cache read + cache creation; Responses'
  input_tokens), so the twin cannot stand in for a different prompt unnoticed;
- /v1/messages/count_tokens: the count it answers (epp's ids are compared by their number).

Outcomes (`OUTCOMES`): "equal"; "both refuse" (same status, same error shape: OpenAI's, or
Anthropic's `{"type": "error"}`); the rest are disagreements: "mismatch" (different ids), "epp
refuses, vLLM ids", "epp no ids, vLLM ids", "epp ids, vLLM refuses", "status differs", "shape
differs", "vLLM's render twin differs" (the twin's ids do not have the served request's count).
One tolerance: while epp does not yet refuse prompts longer than the context (`epp_checks_length`
probes it once), "epp ids, vLLM refuses" on a request vLLM refuses for its length is counted as
"length, not yet checked by epp"; once epp refuses the probe, those requests must agree like every
other.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from e2e.vllm.chat_requests import Case

OUTCOMES = (
    "equal",
    "both refuse",
    "length, not yet checked by epp",
    "mismatch",
    "epp refuses, vLLM ids",
    "epp no ids, vLLM ids",
    "epp ids, vLLM refuses",
    "status differs",
    "shape differs",
    "vLLM's render twin differs",
)
AGREE = frozenset({"equal", "both refuse", "length, not yet checked by epp"})
# vLLM's reasons for refusing a prompt that does not fit its context (renderers/params.py).
_LENGTH_WORDS = ("max_model_len", "maximum context length", "context length")


@dataclasses.dataclass(frozen=True)
class Answer:
    """One side's answer: token ids, or a refusal (status, reason); `ids` None with status 200
    means epp answered without ids."""

    status: int
    ids: list[int] | None = None
    reason: str = ""
    shape: str = "openai"  # a refusal's error shape: "openai" or "anthropic"
    count: int | None = None  # count_tokens: the number vLLM answers instead of ids
    twin_differs: bool = False  # the render twin's ids have another count than the served request

    def short(self) -> str:
        if self.status != 200:
            return f"{self.status} ({self.shape}) {self.reason[:300]}"
        if self.count is not None:
            return f"{self.count} tokens counted"
        if self.ids is None:
            return "no ids"
        return f"{len(self.ids)} ids" + (
            " (render twin differs from the served count)" if self.twin_differs else ""
        )


@dataclasses.dataclass(frozen=True)
class Result:
    case: Case
    outcome: str
    vllm: Answer
    epp: Answer

    def describe(self) -> str:
        lines = [
            f"[{self.outcome}] {self.case.describe()}",
            f"  vLLM {self.vllm.short()}",
            f"  epp  {self.epp.short()}",
        ]
        if self.outcome == "mismatch" and self.vllm.ids is not None and self.epp.ids is not None:
            a, b = self.epp.ids, self.vllm.ids
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            lines.append(
                f"  first difference at {at} (lengths epp {len(a)} / vLLM {len(b)}): "
                f"epp {a[max(0, at - 4) : at + 8]} vLLM {b[max(0, at - 4) : at + 8]}"
            )
        return "\n".join(lines)


def _post(url: str, body: dict[str, Any], timeout: float) -> tuple[int, Any]:
    data = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            try:
                return resp.status, json.loads(raw)
            except ValueError:  # a streamed answer (SSE): its status is what is compared
                return resp.status, raw.decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        with err:  # it holds the response's socket
            raw = err.read().decode("utf-8", "replace")
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, raw


def _shape(payload: Any) -> str:
    return "anthropic" if isinstance(payload, dict) and payload.get("type") == "error" else "openai"


def _refused(status: int, payload: Any) -> Answer:
    return Answer(status, reason=_reason(payload), shape=_shape(payload))


def _reason(payload: Any) -> str:
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        if isinstance(inner, dict):
            return str(inner.get("message", inner))
        return str(inner)
    return str(payload)


def vllm_answer(base_url: str, case: Case, timeout: float = 300.0) -> Answer:
    """The prompt ids vLLM's engine was fed for `case` (its first prompt), or vLLM's refusal
    (the module docstring says how, per route)."""
    path = case.path
    if path in ("/v1/messages", "/v1/responses"):
        return _served_then_twin(base_url, case, timeout)
    body = case.body
    if path in ("/v1/chat/completions", "/v1/completions", "/inference/v1/generate"):
        body = {**body, "return_token_ids": True}
    status, payload = _post(base_url + path, body, timeout)
    if status != 200:
        return _refused(status, payload)
    if path.endswith("/count_tokens"):
        return Answer(200, count=int(payload["input_tokens"]))
    if path == "/v1/completions/render":
        return Answer(200, ids=list(payload[0]["token_ids"]))
    if path.endswith("/render"):
        return Answer(200, ids=list(payload["token_ids"]))
    if isinstance(payload, str):  # streamed: the first event carries the prompt's ids
        refusal = _stream_error(payload)
        if refusal is not None:
            return refusal
        payload = _first_event_with(payload, "prompt_token_ids")
    if path in ("/v1/chat/completions", "/inference/v1/generate"):
        return Answer(200, ids=list(payload["prompt_token_ids"]))
    return Answer(200, ids=list(payload["choices"][0]["prompt_token_ids"]))


def _stream_error(sse: str) -> Answer | None:
    """A streamed answer whose first event is an error: vLLM refused the request inside the
    stream it had opened (200, then the error: /inference/v1/generate does so), which counts as
    the refusal the event says (its code)."""
    for line in sse.splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            event = json.loads(line[5:])
            error = event.get("error") if isinstance(event, dict) else None
            if isinstance(error, dict):
                return Answer(int(error.get("code") or 500), reason=str(error.get("message")))
            return None
    return None


def _first_event_with(sse: str, key: str) -> dict[str, Any]:
    for line in sse.splitlines():
        if line.startswith("data:") and key in line:
            event: dict[str, Any] = json.loads(line[5:])
            return event
    raise AssertionError(f"no event with {key!r} in the stream: {sse[:500]}")


def _served_then_twin(base_url: str, case: Case, timeout: float) -> Answer:
    status, payload = _post(base_url + case.path, case.body, timeout)
    if status != 200:
        return _refused(status, payload)
    twin_status, twin = _post(f"{base_url}{case.path}/render", case.body, timeout)
    if twin_status != 200:  # served, yet its render twin refuses it
        return Answer(200, twin_differs=True, reason=f"render twin: {twin_status} {_reason(twin)}")
    ids = list(twin["token_ids"])
    served = _prompt_tokens(payload)
    return Answer(200, ids=ids, twin_differs=served is not None and served != len(ids))


def _prompt_tokens(payload: Any) -> int | None:
    """The prompt tokens a served /v1/messages or /v1/responses answer reports (None: streamed)."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        return sum(
            int(usage.get(k) or 0)
            for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        )
    return int(usage["input_tokens"])


def epp_answer(metrics_url: str, case: Case, timeout: float = 60.0) -> Answer:
    """epp's ids for `case` (POST /debug/tokenize on its metrics port), or its refusal. A 503
    (no ready endpoint: the vLLM is busy generating a boundary case's tokens and missed a metrics
    scrape) says nothing about tokenization: asked again, for up to a minute."""
    deadline = time.monotonic() + 60
    while True:
        status, payload = _post(f"{metrics_url}/debug/tokenize?path={case.path}", case.body, timeout)
        if status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if status != 200:
        return _refused(status, payload)
    ids = payload.get("token_ids")
    return Answer(200, ids=None if ids is None else list(ids))


def is_length_refusal(answer: Answer) -> bool:
    return answer.status == 400 and any(w in answer.reason for w in _LENGTH_WORDS)


def classify(vllm: Answer, epp: Answer, *, epp_checks_length: bool) -> str:
    if vllm.status == 200:
        if vllm.twin_differs:
            return "vLLM's render twin differs"
        if epp.status != 200:
            return "epp refuses, vLLM ids"
        if epp.ids is None:
            return "epp no ids, vLLM ids"
        if vllm.count is not None:
            return "equal" if len(epp.ids) == vllm.count else "mismatch"
        return "equal" if epp.ids == vllm.ids else "mismatch"
    if epp.status == 200:
        if not epp_checks_length and is_length_refusal(vllm):
            return "length, not yet checked by epp"
        return "epp ids, vLLM refuses"
    if epp.status != vllm.status:
        return "status differs"
    return "both refuse" if epp.shape == vllm.shape else "shape differs"


def epp_checks_length(
    metrics_url: str, max_model_len: int, within: float = 15.0, model: str = "tiny"
) -> bool:
    """Whether epp refuses a prompt longer than the context (completions ids: no tokenizer doubt).
    epp learns a model's context from its pods' /v1/models after it starts: asked until `within`."""
    body = {"model": model, "prompt": [100] * (max_model_len + 8), "max_tokens": 1}
    deadline = time.monotonic() + within
    while True:
        if epp_answer(metrics_url, Case("/v1/completions", body)).status == 400:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def run(
    cases: Sequence[Case],
    *,
    vllm_url: str | Callable[[Case], str],
    epp_url: str,
    epp_length: bool,
    workers: int = 2,
    progress: Callable[[int], None] | None = None,
) -> list[Result]:
    """Each case to both sides (`workers` at a time), classified; in the order of `cases`.
    `vllm_url` may depend on the case (one server per chat-template style)."""

    def one(case: Case) -> Result:
        theirs = vllm_answer(vllm_url(case) if callable(vllm_url) else vllm_url, case)
        ours = epp_answer(epp_url, case)
        return Result(case, classify(theirs, ours, epp_checks_length=epp_length), theirs, ours)

    out: list[Result] = []
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for i, result in enumerate(pool.map(one, cases), 1):
            out.append(result)
            if progress is not None:
                progress(i)
    return out


def counts(results: Iterable[Result]) -> dict[str, int]:
    out = dict.fromkeys(OUTCOMES, 0)
    for r in results:
        out[r.outcome] += 1
    return {k: v for k, v in out.items() if v}


def disagreements(results: Iterable[Result]) -> list[Result]:
    return [r for r in results if r.outcome not in AGREE]
