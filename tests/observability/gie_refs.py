"""Regenerates `gie_queries.json`: the metric and label names each of GIE's stock alert rules and
each query of GIE's Grafana dashboard reads, from a local clone of GIE at a given commit.

    python -m tests.observability.gie_refs /path/to/gateway-api-inference-extension [commit]

Only those names (and each rule's alert name, each panel's title) are kept, with the files' source
recorded; the upstream files themselves are not copied into this repository.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import yaml

from tests.observability import gie_metrics
from tests.observability.promql import refs

OUT = pathlib.Path(__file__).with_name("gie_queries.json")
ALERTS = "tools/alerts/alert.yaml"
DASHBOARD = "tools/dashboards/inference_gateway.json"


def _git(clone: str, *args: str) -> str:
    return subprocess.run(["git", "-C", clone, *args], check=True, capture_output=True, text=True).stdout


def _query(where: str, expr: str) -> dict[str, Any]:
    r = refs(expr)
    return {"where": where, "metrics": sorted(r.metrics), "labels": sorted(r.labels)}


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in panels:
        out.append(p)
        out.extend(_panels(p.get("panels", [])))
    return out


def extract(clone: str, commit: str) -> dict[str, Any]:
    alerts = yaml.safe_load(_git(clone, "show", f"{commit}:{ALERTS}"))
    rules = [r for g in alerts["groups"] for r in g["rules"]]
    dashboard = json.loads(_git(clone, "show", f"{commit}:{DASHBOARD}"))
    panel_queries = [
        _query(p.get("title", ""), t["expr"])
        for p in _panels(dashboard["panels"])
        for t in p.get("targets", [])
        if t.get("expr")
    ]
    return {
        "source": {
            "repo": gie_metrics.GIE_REPO,
            "commit": commit,
            "tag": next(
                (t for t in _git(clone, "tag", "--points-at", commit).split() if t.startswith("v")), None
            ),
            "extracted_by": "tests/observability/gie_refs.py (tests/observability/promql.py)",
        },
        "files": [
            {
                "path": ALERTS,
                "blob": _git(clone, "rev-parse", f"{commit}:{ALERTS}").strip(),
                "kind": "Prometheus alert rules",
                "queries": [_query(r["alert"], r["expr"]) for r in rules],
            },
            {
                "path": DASHBOARD,
                "blob": _git(clone, "rev-parse", f"{commit}:{DASHBOARD}").strip(),
                "kind": "Grafana dashboard",
                "queries": panel_queries,
            },
        ],
    }


def main(argv: list[str]) -> None:
    clone = argv[0]
    commit = argv[1] if len(argv) > 1 else gie_metrics.GIE_COMMIT
    OUT.write_text(json.dumps(extract(clone, commit), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
