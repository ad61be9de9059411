"""A request inside the simulated engine (`epp.sim.core`): what the caller gives, what the engine
fills in, and the step's outcome. The underscored fields are the engine's own state (its scheduler
reads and writes them); a caller reads the rest."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import overload

from epp.sim import blocks


class RequestRejected(ValueError):
    """vLLM answers 400 (a prompt vLLM cannot run); the message is vLLM's."""


def default_output_token(index: int) -> int:
    """The id of a request's `index`-th generated token when the caller gives none: a fixed filler,
    the same for every request (as greedy decoding of one prompt always yields the same text)."""
    return 1 + index % 1000


NEW, WAITING, RUNNING, DONE = 0, 1, 2, 3  # EngineRequest._state


class _Tokens(Sequence[int]):
    """A request's sequence (prompt then generated tokens) without copying the prompt."""

    __slots__ = ("out", "prompt")

    def __init__(self, prompt: Sequence[int], out: list[int]) -> None:
        self.prompt = prompt
        self.out = out

    def __len__(self) -> int:
        return len(self.prompt) + len(self.out)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        p = len(self.prompt)
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            assert step == 1
            if stop <= p:
                return list(self.prompt[start:stop])
            if start >= p:
                return self.out[start - p : stop - p]
            return [*self.prompt[start:p], *self.out[: stop - p]]
        if index < 0:
            index += len(self)
        return self.prompt[index] if index < p else self.out[index - p]

    def __iter__(self) -> Iterator[int]:
        yield from self.prompt
        yield from self.out


class EngineRequest:
    """One request in the engine: what the caller gives, and what the engine fills in."""

    __slots__ = (
        "_blocks",
        "_digests",
        "_num_cached_blocks",
        "_num_computed",
        "_num_prompt",
        "_script",
        "_state",
        "_tokens",
        "arrival_time",
        "cache_salt",
        "finish_time",
        "finished",
        "first_scheduled_time",
        "first_token_time",
        "lora_id",
        "lora_name",
        "max_tokens",
        "num_cached_tokens",
        "num_output_tokens",
        "num_preemptions",
        "output_token_ids",
        "prompt_token_ids",
        "remote_tokens",
        "request_id",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        lora_id: int | None = None,
        output_token_ids: Sequence[int] | None = None,
        prefix_digests: Sequence[blocks.Digest] = (),
        remote_tokens: int = 0,
    ) -> None:
        """`remote_tokens`: leading prompt tokens whose KV another pod computed and this one
        received (a P/D decode: vLLM's NixlConnector loads them before the request runs); at its
        admission they count as computed at no step cost, beyond the local cache hit, and are
        not reported as cached tokens (vLLM reports the local hit only). At most the prompt minus
        its last token; a preempted request recomputes them.

        `prefix_digests`: the hashes of the prompt's first full blocks when the caller already has
        them (`blocks.block_digests` of a shared system prompt, computed once per tenant), so only
        the rest of the prompt is hashed; trusted, not checked."""
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids  # held, not copied
        self.max_tokens = max_tokens
        self.lora_name = lora_name
        self.cache_salt = cache_salt
        self.lora_id = lora_id  # vLLM's int adapter id in BlockStored (deprecated field)
        self._script = output_token_ids  # the tokens to "generate"; None = default_output_token
        self.remote_tokens = remote_tokens
        # Filled in by the engine.
        self.arrival_time = 0.0
        self.first_scheduled_time: float | None = None  # first admission (queue time ends)
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.num_cached_tokens = 0
        self.num_output_tokens = 0
        self.num_preemptions = 0
        self.finished = False
        self.output_token_ids: list[int] = []
        # Engine state: the sequence's block hashes (full blocks, computed once), the blocks held
        # (block i holds tokens [i * block_size, (i + 1) * block_size)), tokens whose KV is
        # computed or scheduled, and how many leading blocks this request has committed to the
        # cache (vLLM's num_cached_block).
        self._state = NEW
        self._tokens = _Tokens(prompt_token_ids, self.output_token_ids)
        self._digests: list[blocks.Digest] = list(prefix_digests)
        self._blocks: list[blocks.Block] = []
        self._num_computed = 0
        self._num_cached_blocks = 0
        self._num_prompt = len(prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens so far (the last one's KV is not computed yet)."""
        return len(self.prompt_token_ids) + self.num_output_tokens

    def __repr__(self) -> str:
        state = ("new", "waiting", "running", "finished")[self._state]
        return (
            f"EngineRequest({self.request_id!r}, {state}, prompt={self.num_prompt_tokens}, "
            f"computed={self._num_computed}, out={self.num_output_tokens}/{self.max_tokens}, "
            f"cached={self.num_cached_tokens}, preempted={self.num_preemptions})"
        )


@dataclasses.dataclass(slots=True)
class StepResult:
    duration: float  # the step runs from `now` to `now + duration`
    first_tokens: list[EngineRequest]  # first token ready at now + duration
    finished: list[EngineRequest]  # finished at now + duration
    num_prefill_tokens: int
    num_decode_seqs: int
