"""The most of a run's prompt tokens any router could find cached: the workload's own ceiling.

A request can find cached only blocks that an earlier request computed: its prompt, and the reply
it generated (a chat turn's or an agent step's reply is the next prompt's middle). `ReuseBound`
follows the requests in arrival order over one cache with no size limit, as if every pod held
everything the fleet had computed, and counts for each request the tokens it would find there,
in full blocks and capped as vLLM caps a hit (a prompt's last token is always computed).

Summed over the served requests and divided by their prompt tokens this is `hit_rate_ceiling` in
results.json. It bounds the requests' own hit rate of every router, and the pods' own counters
of a router that sends nothing but the requests. A router that copies a prefix to one more pod
(a pre-warm, or a request sent where its prefix is not) pays that prefix once more as a miss in
the pods' counters, so where a router already reaches the ceiling, another reaches its pods' hit
rate only by making no copies.

Optimistic on purpose: it ignores timing (a request arriving while an earlier one still computes
the prefix counts as a hit), eviction and the pods' sizes.
"""

from __future__ import annotations

from epp.bench.workload import Prompt
from epp.sim import blocks


class ReuseBound:
    """Fed each request's prompt in arrival order; see the module docstring."""

    def __init__(self, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.block_size = block_size
        # The simulator's chained block hashes (`epp.sim.blocks`): a block's digest covers the whole
        # prefix up to its end, as vLLM's do, so equal digests mean equal prefixes. A prompt's
        # shared prefix is hashed once per group, as the fast run's routing hashes it.
        self._prefixes = blocks.PrefixDigests(block_size)
        self._seen: set[blocks.Digest] = set()

    def add(self, prompt: Prompt) -> int:
        """The tokens of `prompt` an earlier request left cached; then remember what this one
        computes (its prompt, and its reply when the workload names it)."""
        bs = self.block_size
        tokens = prompt.token_ids
        cap = (len(tokens) - 1) // bs if tokens else 0
        # The engine keeps KV for every token but the last it generated.
        reply = prompt.output_token_ids
        computed = [*tokens, *reply[:-1]] if reply else tokens
        digests = self._prefixes.prefix(prompt.group, computed, prompt.shared_tokens)
        blocks.extend_digests(digests, computed, bs)
        found = 0
        for digest in digests[:cap]:
            if digest not in self._seen:
                break
            found += 1
        self._seen.update(digests)
        return found * bs
