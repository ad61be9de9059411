"""InferenceModelRewrite rules: which model a request for model M is sent to, as llm-d decides it.

Each InferenceModelRewrite (`epp.k8s.rewrites` parses them) holds ordered rules. A rule matches
a request when one of its `matches` names the request's model exactly (`model.type: Exact`, the
only type there is), or always when it has no `matches` (a generic rule). A matched rule sends
the request to one of its `targets` (`modelRewrite`), chosen by weight.

Precedence (llm-d v0.10, `InferenceModelRewriteSpec.rules`), for a request's model:

1. exact rules before generic rules, over every rewrite of the pool;
2. then the oldest rewrite (`metadata.creationTimestamp`);
3. then the first rule of that rewrite, in list order.

One rule wins; the others are not consulted (a winning rule is not "skipped" when its target is
the request's own model). epp breaks a remaining tie (two rewrites created in the same second)
by name, where llm-d's order is unspecified.

Weights: a target's share is weight / (sum of the weights), llm-d's rule. When some targets have a
weight and others none, the unweighted ones are never chosen (llm-d logs that once per request;
epp when the rewrite is read); with no weight on any target they share evenly. A rule without
targets answers the request 400, as llm-d does (it would send the request without a model).

How the share is drawn differs from llm-d, on purpose: llm-d draws a random number per request,
so a 1% canary gets 1 request in 100 only on average (0.6 to 1.4 in 100 over a few thousand).
epp walks a low-discrepancy sequence per rule (u_n = frac(u_0 + n / golden ratio), Weyl's
equidistribution): over any n requests each target's count is within about log(n) of
n * share, so 1 in 100 is about one in every 100, and any arithmetic subsequence (every other
request, every tenth) is spread the same way, so a client's own pattern cannot line up with it.
u_0 is random per rule, so replicas do not choose in lockstep. A rule keeps its position across
updates of other rewrites (only a change of its own targets starts it afresh).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable

# 1 / golden ratio: the most evenly spreading step of a Weyl sequence on [0, 1).
_STEP = (math.sqrt(5.0) - 1.0) / 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    model: str
    weight: int | None = None  # None: not given (llm-d: then all must be unset to be chosen)


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    models: frozenset[str]  # exact matches; empty: a generic rule (matches every model)
    targets: tuple[Target, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ModelRewrite:
    """One InferenceModelRewrite of our pool, parsed."""

    name: str
    created: str  # metadata.creationTimestamp, RFC 3339 in UTC ("Z"): sorts as text
    rules: tuple[Rule, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    rewrite: str  # the InferenceModelRewrite's name (for metrics and logs)
    model: str  # the target model; "" when the winning rule has no targets


class _Cursor:
    """A rule's position on its sequence and the cumulative weights it maps a draw through."""

    __slots__ = ("bounds", "models", "position", "rule")

    def __init__(self, rule: Rule, start: float) -> None:
        self.rule = rule
        self.position = start
        weighted = [t for t in rule.targets if t.weight is not None]
        chosen = weighted or list(rule.targets)  # mixed: only the weighted ones (llm-d)
        total = sum(t.weight or 1 for t in chosen)
        self.models = tuple(t.model for t in chosen)
        cumulative, bounds = 0, []
        for t in chosen:
            cumulative += t.weight or 1
            bounds.append(cumulative / total)
        self.bounds = tuple(bounds)

    def next(self) -> str:
        models = self.models
        if len(models) <= 1:
            return models[0] if models else ""
        u = self.position
        self.position = (u + _STEP) % 1.0
        for model, bound in zip(models, self.bounds, strict=True):
            if u < bound:
                return model
        return models[-1]  # u within rounding of 1.0


class ModelRewriteStore:
    """The pool's InferenceModelRewrites, replaced whole by their source; read on every request."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._rewrites: tuple[ModelRewrite, ...] = ()
        # model -> the winning (rewrite name, cursor); generic: the winner for every other model
        self._exact: dict[str, tuple[str, _Cursor]] = {}
        self._generic: tuple[str, _Cursor] | None = None
        self._cursors: dict[tuple[str, int], _Cursor] = {}

    def __bool__(self) -> bool:
        return bool(self._rewrites)

    @property
    def rewrites(self) -> tuple[ModelRewrite, ...]:
        return self._rewrites

    def replace(self, rewrites: Iterable[ModelRewrite]) -> None:
        """Install these rewrites (the pool's, all of them) in place of the previous ones."""
        ordered = tuple(sorted(rewrites, key=lambda r: (r.created, r.name)))
        cursors: dict[tuple[str, int], _Cursor] = {}
        exact: dict[str, tuple[str, _Cursor]] = {}
        generic: tuple[str, _Cursor] | None = None
        for rewrite in ordered:
            for index, rule in enumerate(rewrite.rules):
                key = (rewrite.name, index)
                cursor = self._cursors.get(key)
                if cursor is None or cursor.rule != rule:
                    cursor = _Cursor(rule, self._rng.random())
                cursors[key] = cursor
                if not rule.models:
                    if generic is None:
                        generic = (rewrite.name, cursor)
                    continue
                for model in rule.models:
                    exact.setdefault(model, (rewrite.name, cursor))  # oldest, then first rule
        self._rewrites = ordered
        self._cursors = cursors
        self._exact = exact
        self._generic = generic

    def names(self, model: str) -> bool:
        """Whether a rule names `model` (an exact match, not a rule for every model)."""
        return model in self._exact

    def decide(self, model: str) -> Decision | None:
        """The target for a request for `model`, or None when no rule matches it."""
        found = self._exact.get(model) or self._generic
        if found is None:
            return None
        name, cursor = found
        return Decision(rewrite=name, model=cursor.next())
