"""Parsing of OpenAI-style request bodies into an `InferenceRequest`.

TO BE IMPLEMENTED (helper H1): see the docstring of `parse_request`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any


class Api(enum.Enum):
    COMPLETIONS = "completions"
    CHAT = "chat/completions"
    RESPONSES = "responses"
    EMBEDDINGS = "embeddings"
    OTHER = "other"  # header-only requests (GET /v1/models) and unknown paths without a body


@dataclasses.dataclass(slots=True)
class InferenceRequest:
    """What the scheduler needs to know about one request. Built once per request."""

    request_id: str
    api: Api
    path: str
    headers: Mapping[str, str]  # lower-case names, as received
    model: str = ""  # the model name the client asked for ("" for header-only requests)
    target_model: str = ""  # after x-gateway-model-name-rewrite; what the model server sees
    stream: bool = False
    # The prompt in the forms available: text (completions string / chat rendered later by the
    # tokenizer component), token ids (completions given as ids). Batched prompts keep all items.
    prompt_texts: list[str] = dataclasses.field(default_factory=list)
    prompt_token_ids: list[list[int]] = dataclasses.field(default_factory=list)
    # The decoded JSON body as plain Python objects, for components that need more (chat template).
    body: Mapping[str, Any] | None = None
    body_bytes: bytes = b""
    # A cheap prompt-size estimate in tokens (exact when token ids were given), for load accounting.
    prompt_tokens_estimate: int = 0
    # Envoy's subset hint: None = no restriction; else the allowed IPs (ports ignored, as GIE).
    subset_ips: frozenset[str] | None = None
