"""vLLM's context-length rules for chat and completions requests, so that epp answers 400 where the
model server would, before spending a pick, a booking and a prefill estimate on the request.

The rules, as vLLM 0.32 applies them (`vllm/renderers/params.py` TokenizeParams, the entrypoints'
`build_tok_params`, `get_max_tokens` in `entrypoints/serve/utils/api_utils.py`), checked against a
real vLLM 0.32 at `--max-model-len 256` (e2e/vllm/test_max_model_len.py keeps them checked):

1. The output budget is `max_completion_tokens` if the chat body gives one, else `max_tokens`
   (0 when neither). A budget above `max_model_len` is refused, whatever the prompt.
2. `truncate_prompt_tokens` above `max_model_len` is refused; -1 means `max_model_len - 1` (one
   token of context held back for the output). The prompt is cut to that many tokens: from the
   left (its last tokens are kept) unless `truncation_side` says otherwise; with no side given,
   a text prompt keeps its special tokens (the tokenizer truncates only the text's own tokens), with
   a side the whole sequence is sliced. Cut to nothing, the prompt is refused as empty.
3. A prompt of more than `max_model_len` tokens is refused ("exceeds this limit even without any
   output tokens"). A prompt of exactly `max_model_len` tokens is refused too: the output budget
   is clamped to what is left of the context (`max_model_len - prompt`), and 0 is not a valid
   budget ("max_tokens must be at least 1, got 0"). Below that a budget larger than what is left is
   clamped, never refused: prompt + max_tokens > max_model_len is served (vLLM < 0.11 refused it).

So the boundary is: budget <= max_model_len, and prompt tokens (after truncation) < max_model_len.
Messages carry the same words as vLLM's, so a client sees the same reason whichever answers.

vLLM also refuses, before tokenizing, a text longer than `max_model_len` x its tokenizer's longest
vocabulary entry in characters. Every such text has more than `max_model_len` tokens, so rule 3
refuses it too (same status, token-count wording).

What `max_model_len` is, per model, is the caller's business (`ContextLimits`): an operator's
override, else what the pods' `/v1/models` report, else the tokenizer config's `model_max_length`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence

from epp.api import errors
from epp.api.requests import Api, InferenceRequest

MaxModelLenSource = Callable[[str], "int | None"]


@dataclasses.dataclass(frozen=True, slots=True)
class ContextLimits:
    """Where a model's `max_model_len` comes from, in precedence order.

    `overrides` (model -> tokens; the key "*" for every model no other key names) come from the
    operator and win; `from_pods(model)` is the largest value the pool's pods report for the model
    (a pod that serves more than another is where the request can still go); `from_tokenizer(model)`
    is the serving tokenizer's `model_max_length`. None from all three: no limit is enforced.
    """

    overrides: Mapping[str, int] = dataclasses.field(default_factory=dict)
    from_pods: MaxModelLenSource | None = None
    from_tokenizer: MaxModelLenSource | None = None

    def max_model_len(self, model: str) -> int | None:
        found = self.overrides.get(model)
        if found is not None:
            return found
        if self.from_pods is not None:
            found = self.from_pods(model)
            if found is not None:
                return found
        found = self.overrides.get("*")
        if found is not None:
            return found
        if self.from_tokenizer is not None:
            return self.from_tokenizer(model)
        return None


# The APIs whose prompt vLLM holds to these rules (their /render routes too); Anthropic's bodies
# become chat requests, the Responses API has its own budget field and truncation.
_APPLIES = frozenset((Api.CHAT, Api.COMPLETIONS, Api.MESSAGES, Api.COUNT_TOKENS, Api.RESPONSES, Api.GENERATE))


def applies(request: InferenceRequest) -> bool:
    return request.api in _APPLIES


def check_parameters(request: InferenceRequest, max_model_len: int) -> None:
    """Rules 1 and 2's bounds: what needs no token ids. Raises `errors.BadRequest`."""
    if request.api is Api.GENERATE:
        return  # /inference/v1/generate clamps the budget, and holds only the prompt to the context
    budget = request.max_output_tokens
    if budget is not None and budget > max_model_len:
        raise errors.BadRequest(
            f"{request.max_output_param}={budget} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens."
        )
    truncate = request.truncate_prompt_tokens
    if truncate is not None and truncate > max_model_len:
        raise errors.BadRequest(
            f"truncate_prompt_tokens={truncate} cannot be greater than max_model_len = {max_model_len}. "
            "Please request a smaller truncation size."
        )


def truncate(
    ids: list[int], request: InferenceRequest, max_model_len: int, *, specials: tuple[int, int] = (0, 0)
) -> list[int]:
    """The ids vLLM keeps of a prompt under `truncate_prompt_tokens` (rule 2); `ids` itself when
    nothing is cut. `specials` is (leading, trailing) special tokens the tokenizer added to a text
    prompt: with no `truncation_side` they survive the cut (0, 0 for token-id prompts)."""
    keep = request.truncate_prompt_tokens
    if keep is None:
        return ids
    if keep < 0:
        # vLLM's TokenizeParams.max_truncation_tokens: one token held back for the output,
        # unless the request asks for none (no budget at all), when the whole context is kept
        keep = max(0, max_model_len - 1) if request.max_output_tokens else max_model_len
    if keep >= len(ids):
        return ids
    side = request.truncation_side
    if side is None and any(specials):
        lead, trail = specials
        body = ids[lead : len(ids) - trail]
        room = max(0, keep - lead - trail)
        return ids[:lead] + (body[len(body) - room :] if room else []) + ids[len(ids) - trail :]
    if side == "right":
        return ids[:keep]
    return ids[len(ids) - keep :] if keep else []


def special_counts(plain: Sequence[int], full: Sequence[int]) -> tuple[int, int]:
    """(leading, trailing) special tokens a tokenizer adds, from one text encoded without and with
    them (a BOS: (1, 0)); what `truncate` keeps of a text prompt."""
    n = len(plain)
    if not n:
        return (0, 0)
    for lead in range(len(full) - n + 1):
        if list(full[lead : lead + n]) == list(plain):
            return (lead, len(full) - lead - n)
    return (0, 0)


async def text_specials(encode: Callable[[str, bool], Awaitable[list[int] | None]]) -> tuple[int, int]:
    """`special_counts` of a tokenizer, given `encode(text, add_special_tokens)`: one short text
    encoded without and with them. Only truncation needs it, so it is found when needed."""
    plain = await encode("a", False)
    full = await encode("a", True)
    return special_counts(plain or [], full or [])


def check_prompt(n_tokens: int, request: InferenceRequest, max_model_len: int, *, from_text: bool) -> None:
    """Rule 3 for a prompt of `n_tokens` (after truncation). Raises `errors.BadRequest`.

    `from_text`: the ids were encoded from text, where vLLM's tokenizer stops at `max_model_len + 1`
    tokens, so its message says "at least" that many."""
    if n_tokens == 0 and request.truncate_prompt_tokens is not None:
        raise errors.BadRequest("The decoder prompt cannot be empty")
    if n_tokens > max_model_len:
        shown = max_model_len + 1 if from_text else n_tokens
        qualifier = "at least " if shown == max_model_len + 1 else ""
        raise errors.BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
            f"contains {qualifier}{shown} input tokens, which exceeds this limit even without any "
            "output tokens. Please reduce the length of the input prompt."
        )
    if n_tokens == max_model_len:
        # The budget is clamped to max_model_len - prompt = 0, which SamplingParams refuses.
        raise errors.BadRequest("max_tokens must be at least 1, got 0.")


def check_given_ids(prompts: Sequence[list[int]], request: InferenceRequest, max_model_len: int) -> list[int]:
    """Rules 2 and 3 for prompts given as token ids (every prompt of a batch): the first prompt's
    ids as vLLM keeps them. Raises `errors.BadRequest`."""
    if request.api is Api.GENERATE:
        return check_generate(prompts[0], max_model_len)
    first: list[int] = []
    for i, ids in enumerate(prompts):
        kept = truncate(ids, request, max_model_len)
        check_prompt(len(kept), request, max_model_len, from_text=False)
        if i == 0:
            first = kept
    return first


def check_generate(ids: list[int], max_model_len: int) -> list[int]:
    """/inference/v1/generate: the engine's own check (vLLM's input processor), a prompt that
    leaves no room for one output token is refused; the budget is clamped, never refused."""
    n = len(ids)
    if n > max_model_len:
        raise errors.BadRequest(
            f"The decoder prompt (length {n}) is longer than the maximum model length of "
            f"{max_model_len}. Make sure that `max_model_len` is no smaller than the number of text tokens."
        )
    if n == max_model_len:
        raise errors.BadRequest(
            f"The decoder prompt (length {n}) plus the number of requested output tokens (at least 1) "
            f"is longer than the maximum model length of {max_model_len}. Make sure that `max_model_len` "
            "is no smaller than the number of text tokens (prompt + requested output tokens)."
        )
    return ids
