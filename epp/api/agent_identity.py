"""Which agent session a request belongs to, from the headers coding agents send (llm-d's
`agent-identity` plugin), for flow control's fairness and session affinity.

The headers, in llm-d v0.10's order, the first non-empty one winning:

1. `x-claude-code-session-id` (Claude Code),
2. `x-session-affinity` (OpenCode),
3. `session-id` (Codex >= 0.131),
4. `session_id` (Codex 0.130, underscored).

A configuration may put its own headers before these (`additionalSessionHeaders`). The identity
is kept as the request attribute `agent-identity` (no producer in its key, as in llm-d); flow
control takes it as the request's fairness ID when no `x-llm-d-inference-fairness-id` (or GIE's)
header names one, as llm-d's director does, and `session-affinity-*` may read it as a session
source.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

ATTRIBUTE = ("agent-identity", "")  # llm-d's AgentIdentityKey: (data type, no producer)
SESSION_HEADERS: tuple[str, ...] = (
    "x-claude-code-session-id",
    "x-session-affinity",
    "session-id",
    "session_id",
)


def header_order(additional: Iterable[str] = ()) -> tuple[str, ...]:
    """The headers looked at, lower-cased: the additional ones first, then llm-d's."""
    return tuple(h.lower() for h in (*additional, *SESSION_HEADERS))


def identity(headers: Mapping[str, str], order: Sequence[str] = SESSION_HEADERS) -> str:
    """The first non-empty of `order` among `headers` (lower-case names), else ""."""
    for name in order:
        value = headers.get(name)
        if value:
            return value
    return ""
