"""Workload prompts as text that the simulated pods tokenize back to the intended token ids.

Live mode compares routers that read the request's text (smg's, SGLang's and vLLM Router's
`cache_aware` match characters), so every arm must get text prompts, and the pods must see the
prompts the workload meant: the same lengths and the same shared prefixes. A workload's token ids
(below `workload.VOCAB`) are mapped, one for one, onto words that are single tokens of the pods'
tokenizer: a space and 2+ lowercase letters, a vocabulary entry of its own. Byte-level BPE splits
text at spaces before merging, so a run of such words encodes to exactly their ids, whatever their
neighbours: two prompts sharing their first N token ids share their first N words and their first
N tokens (plus the tokenizer's BOS). The map is `id % len(words)`, so distinct ids may meet on the
same word; that changes nothing a router or the cache can tell apart, since a shared prefix stays
shared and an unshared one differs somewhere in every block (the chance that a whole 16-token block
collides is ~1e-57).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from epp.tokenize.tokenizer import load_shipped

_WORD: Final = re.compile("\u0120[a-z]{2,}")  # byte-level BPE's space marker, then letters


class WordCodec:
    """Token ids -> text (and -> the pods' ids of that text) for one tokenizer."""

    def __init__(self, tokenizer_json: Path | None = None) -> None:
        """`tokenizer_json`: the pods' tokenizer.json (a byte-level BPE); None = epp-tiny, the
        simulator's default."""
        path = tokenizer_json if tokenizer_json is not None else load_shipped().path
        if path is None:
            raise ValueError("the shipped tokenizer has no tokenizer.json")
        vocab: dict[str, int] = json.loads(Path(path).read_text("utf-8"))["model"]["vocab"]
        entries = sorted((token, i) for token, i in vocab.items() if _WORD.fullmatch(token))
        if len(entries) < 256:
            raise ValueError(f"{path}: {len(entries)} single-token words; 256 are needed")
        self.words = [" " + token[1:] for token, _ in entries]
        self.ids = [i for _, i in entries]

    def text(self, token_ids: Sequence[int]) -> str:
        words, n = self.words, len(self.words)
        return "".join([words[t % n] for t in token_ids])

    def pod_ids(self, token_ids: Sequence[int]) -> list[int]:
        """The ids the pods' tokenizer gives `text(token_ids)`, BOS aside."""
        ids, n = self.ids, len(self.ids)
        return [ids[t % n] for t in token_ids]
