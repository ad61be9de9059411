"""epp against real vLLM, request by request: the same body to both, their token ids (or refusals)
compared.

vLLM's side is the request itself, POSTed straight to one vLLM server (never through Envoy, where
epp's own refusal would stand in for vLLM's) with `"return_token_ids": true`: the answer carries
the ids the engine was fed (`prompt_token_ids`), or a 400 with vLLM's reason. epp's side is its
`POST /debug/tokenize`: exactly the ids epp scores, or epp's refusal (status and reason).

Outcomes (`OUTCOMES`): "equal"; "both refuse" (same status); the rest are disagreements:
"mismatch" (different ids), "epp refuses, vLLM ids", "epp no ids, vLLM ids", "epp ids, vLLM
refuses", "status differs". One tolerance: while epp does not yet refuse prompts longer than the
context (`epp_checks_length` probes it once), "epp ids, vLLM refuses" on a request vLLM refuses
for its length is counted as "length, not yet checked by epp"; once epp refuses the probe, those
requests must agree like every other.
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

    def short(self) -> str:
        if self.status != 200:
            return f"{self.status} {self.reason[:300]}"
        if self.ids is None:
            return "no ids"
        return f"{len(self.ids)} ids"


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
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:  # it holds the response's socket
            raw = err.read().decode("utf-8", "replace")
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, raw


def _reason(payload: Any) -> str:
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        if isinstance(inner, dict):
            return str(inner.get("message", inner))
        return str(inner)
    return str(payload)


def vllm_answer(base_url: str, case: Case, timeout: float = 300.0) -> Answer:
    """The prompt ids vLLM's engine was fed for `case` (its first prompt), or vLLM's refusal."""
    body = {**case.body, "return_token_ids": True}
    status, payload = _post(base_url + case.path, body, timeout)
    if status != 200:
        return Answer(status, reason=_reason(payload))
    if case.path.endswith("/chat/completions"):
        return Answer(200, ids=list(payload["prompt_token_ids"]))
    return Answer(200, ids=list(payload["choices"][0]["prompt_token_ids"]))


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
        return Answer(status, reason=_reason(payload))
    ids = payload.get("token_ids")
    return Answer(200, ids=None if ids is None else list(ids))


def is_length_refusal(answer: Answer) -> bool:
    return answer.status == 400 and any(w in answer.reason for w in _LENGTH_WORDS)


def classify(vllm: Answer, epp: Answer, *, epp_checks_length: bool) -> str:
    if vllm.status == 200:
        if epp.status != 200:
            return "epp refuses, vLLM ids"
        if epp.ids is None:
            return "epp no ids, vLLM ids"
        return "equal" if epp.ids == vllm.ids else "mismatch"
    if epp.status == 200:
        if not epp_checks_length and is_length_refusal(vllm):
            return "length, not yet checked by epp"
        return "epp ids, vLLM refuses"
    return "both refuse" if epp.status == vllm.status else "status differs"


def epp_checks_length(metrics_url: str, max_model_len: int, within: float = 15.0) -> bool:
    """Whether epp refuses a prompt longer than the context (completions ids: no tokenizer doubt).
    epp learns a model's context from its pods' /v1/models after it starts: asked until `within`."""
    body = {"model": "tiny", "prompt": [100] * (max_model_len + 8), "max_tokens": 1}
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
    vllm_url: str,
    epp_url: str,
    epp_length: bool,
    workers: int = 2,
    progress: Callable[[int], None] | None = None,
) -> list[Result]:
    """Each case to both sides (`workers` at a time), classified; in the order of `cases`."""

    def one(case: Case) -> Result:
        theirs = vllm_answer(vllm_url, case)
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
