"""The metric names and label names a PromQL expression reads: enough PromQL to check that a
dashboard or an alert rule queries series that exist, not a full parser.

A name is a metric when it is not a keyword, an aggregation or a function (a name followed by
"("). Label names are read from selectors (`{name="x"}`) and from grouping and matching clauses
(`by (a, b)`, `without`, `on`, `ignoring`, `group_left`, `group_right`). Range and offset
durations (`[5m]`, `[$__rate_interval]`) and string literals are skipped whole.
"""

from __future__ import annotations

import dataclasses
import re

_TOKENS = re.compile(
    r"""
      "(?:[^"\\]|\\.)*" | '(?:[^'\\]|\\.)*' | `[^`]*`   # strings
    | \{[^}]*\}                                         # a label selector
    | \[[^\]]*\]                                        # a range or subquery
    | \$\{?[A-Za-z_][A-Za-z0-9_]*\}?                    # a Grafana variable
    | [0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?[smhdwy]*      # a number or a duration
    | [A-Za-z_:][A-Za-z0-9_:]*                          # a name
    | \S                                                # an operator or a parenthesis
    """,
    re.VERBOSE,
)
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
_AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
    "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip


@dataclasses.dataclass
class Refs:
    """What one expression reads."""

    metrics: set[str] = dataclasses.field(default_factory=set)
    labels: set[str] = dataclasses.field(default_factory=set)  # from selectors and clauses


class PromQLError(ValueError):
    pass


def refs(expr: str) -> Refs:
    """The metrics and labels `expr` reads. Raises PromQLError on unbalanced parentheses, the one
    mistake that would make the rest of the scan meaningless."""
    tokens = _TOKENS.findall(expr)
    out = Refs()
    depth = 0
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
            if depth < 0:
                raise PromQLError(f"unbalanced ')' in {expr!r}")
        elif tok.startswith("{"):
            out.labels.update(_MATCHER.findall(tok))
        elif tok in _GROUPING:
            if nxt == "(":  # group_left / group_right may stand alone
                close = tokens.index(")", i + 2)
                out.labels.update(t for t in tokens[i + 2 : close] if t != ",")
                i = close
        elif re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok):
            is_call = nxt == "(" or tok in _AGGREGATIONS
            if not is_call and tok not in _KEYWORDS:
                out.metrics.add(tok)
        i += 1
    if depth:
        raise PromQLError(f"unbalanced '(' in {expr!r}")
    return out


def series_name(metric: str, histograms: set[str]) -> str:
    """The family a sample name belongs to: a histogram's _bucket, _sum and _count are its own."""
    for suffix in ("_bucket", "_sum", "_count"):
        if metric.endswith(suffix) and metric[: -len(suffix)] in histograms:
            return metric[: -len(suffix)]
    return metric
