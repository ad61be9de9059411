"""A model server's model cards (`GET /v1/models`) as the context length of each model it serves.

vLLM lists each served model and LoRA adapter with its `max_model_len`, vLLM's extension of
OpenAI's card. An adapter's card has none: it runs within its base model's context, the card
named by `parent`. Other servers' cards carry no length, which leaves nothing to enforce."""

from __future__ import annotations

from typing import Any

import msgspec

# /v1/models lists a card per model and adapter: a few KB even for a server with many adapters.
MAX_BODY_BYTES = 1024 * 1024


class _Card(msgspec.Struct):
    id: str
    max_model_len: Any = None  # vLLM's extension of OpenAI's model card; others have none
    parent: Any = None  # a LoRA adapter's base model (vLLM lists adapters with max_model_len null)


class _Cards(msgspec.Struct):
    data: list[_Card]


_DECODER = msgspec.json.Decoder(_Cards)


def context_lengths(body: bytes) -> dict[str, int]:
    """Each listed model's `max_model_len` (an adapter's from its base model's card); raises
    msgspec.MsgspecError for a body that is not an OpenAI model list."""
    cards = _DECODER.decode(body).data
    limits = {c.id: c.max_model_len for c in cards if type(c.max_model_len) is int and c.max_model_len > 0}
    for card in cards:
        if card.id not in limits and isinstance(card.parent, str) and card.parent in limits:
            limits[card.id] = limits[card.parent]
    return limits
