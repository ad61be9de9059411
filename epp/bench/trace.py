"""`trace:<path.jsonl>`: replay a user's own traffic through every policy.

One JSON object per line, in any order (sorted by time on loading):

    {"t": 0.25, "prompt": "text ...", "max_tokens": 128}
    {"t": 0.31, "prompt_token_ids": [1, 887, ...], "max_tokens": 64, "group": "tenant-a"}

- `t`: seconds from the start of the trace (>= 0); `max_tokens`: the output length (>= 1).
- `prompt` (text, tokenized once at load with epp's shipped tokenizer, epp-tiny, as the simulator
  does) or `prompt_token_ids`: exactly one of them.
- `group` (optional): a label for reports. Whatever the labels, a prompt's shared tokens (for
  `prefix_hit_rate`) are its longest common prefix with any other prompt of the trace.

`scale` replays the first `scale` share of the trace's time span at its own rate (0.1: the first
tenth). Errors name the line and the field.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Annotated

import msgspec

from epp.bench.workload import Fleet, OpenLoop, Prompt


class TraceError(ValueError):
    """A trace file epp cannot replay; the message names the file, line and field."""


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    t: Annotated[float, msgspec.Meta(ge=0.0)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    prompt: str | None = None
    prompt_token_ids: list[Annotated[int, msgspec.Meta(ge=0)]] | None = None
    group: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    t: float
    ids: list[int]
    max_tokens: int
    group: str


def load(path: str) -> list[_Entry]:
    """The trace's requests in time order, text prompts tokenized. Raises TraceError."""
    decoder = msgspec.json.Decoder(_Line)
    entries: list[_Entry] = []
    texts: list[tuple[int, str]] = []  # (entry index, text) tokenized in one go below
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = decoder.decode(line)
        except msgspec.DecodeError as err:
            raise TraceError(f"{path} line {n}: {err}") from None
        if (item.prompt is None) == (item.prompt_token_ids is None):
            raise TraceError(f"{path} line {n}: give exactly one of `prompt` and `prompt_token_ids`")
        if item.prompt is not None:
            texts.append((len(entries), item.prompt))
        entries.append(_Entry(item.t, item.prompt_token_ids or [], item.max_tokens, item.group))
    if not entries:
        raise TraceError(f"{path}: no requests in the trace")
    if texts:
        from epp.tokenize.tokenizer import load_shipped

        tokenizer = load_shipped()
        for i, text in texts:
            e = entries[i]
            entries[i] = dataclasses.replace(e, ids=tokenizer.encode(text))
    entries.sort(key=lambda e: e.t)
    return entries


def shared_prefixes(prompts: Sequence[list[int]]) -> list[int]:
    """For each prompt, its longest common prefix (tokens) with any other prompt.

    In lexicographic order a prompt's longest common prefix with any other is with one of its
    neighbours, so one sort and a comparison per neighbour pair suffice.
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    out = [0] * len(prompts)
    for a, b in itertools.pairwise(order):
        x, y = prompts[a], prompts[b]
        n = 0
        for u, v in zip(x, y, strict=False):
            if u != v:
                break
            n += 1
        out[a] = max(out[a], n)
        out[b] = max(out[b], n)
    return out


class Trace(OpenLoop):
    name = "trace"
    description = "replay of a JSONL trace"
    default_profile = "codellama-13b-a100"
    default_pods = 8

    def __init__(self, path: str, *, seed: int, scale: float, fleet: Fleet) -> None:
        super().__init__(seed=seed, scale=scale, fleet=fleet)
        self.name = f"trace:{path}"
        self.description = f"replay of {path}"
        entries = load(path)
        end = entries[-1].t * scale
        self._entries = [e for e in entries if e.t <= end] or entries[:1]
        self._shared = shared_prefixes([e.ids for e in self._entries])
        last = self._entries[-1].t
        self.stages = self.scaled_stages([("trace", (last + 1e-9) / scale, None, None)])

    def arrivals(self) -> Iterator[tuple[float, Prompt]]:
        for e, shared in zip(self._entries, self._shared, strict=True):
            yield e.t, Prompt(e.ids, e.max_tokens, e.group, shared, 0)
