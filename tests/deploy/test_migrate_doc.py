"""docs/migrate.md's claims that change as epp does, checked against the code: which of llm-d
v0.10's EPP flags epp does not know, what `epp serve` defaults metrics authentication to, which
request APIs it parses, and that every test file the page names exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

from epp import cli

from . import chart

DOC = (chart.ROOT / "docs" / "migrate.md").read_text(encoding="utf-8")
FLAT = " ".join(DOC.split())
FACTS = json.loads((Path(__file__).parent / "upstream" / "charts.json").read_text(encoding="utf-8"))


def serve_options() -> set[str]:
    serve = cli._subparser(cli.build_parser(), "serve")
    return {o.lstrip("-") for action in serve._actions for o in action.option_strings}


def test_the_llm_d_flags_epp_lacks_are_the_ones_named() -> None:
    flags = FACTS["llm_d_flags"]
    missing = sorted(f for f in flags if f not in serve_options())
    if not missing:
        assert "unknown to epp" not in FLAT
        return
    match = re.search(
        r"(\d+) of llm-d v0\.10's (\d+) EPP flags are unknown to epp and stop it at start: (.*?)\. ", FLAT
    )
    assert match, "docs/migrate.md: the sentence naming llm-d's flags epp lacks"
    assert (int(match[1]), int(match[2])) == (len(missing), len(flags))
    assert sorted(re.findall(r"`--([a-z0-9-]+)`", match[3])) == missing


def test_the_metrics_auth_default_is_the_one_stated() -> None:
    from epp.flags.metrics_port import metrics_auth

    def default(*argv: str) -> bool:
        return metrics_auth(cli.build_parser().parse_args(["serve", *argv]))

    assert default("--pool-name", "p") and default("--endpoint-selector", "app=vllm")
    assert not default("--endpoints", "127.0.0.1:8000")
    assert "on whenever epp watches Kubernetes (`--pool-name`, `--endpoint-selector`)" in FLAT
    assert "off only with `--endpoints` or `--endpoints-file`" in FLAT
    assert "and `epp serve`'s is off" not in FLAT


def test_the_request_apis_named_are_the_ones_parsed() -> None:
    from epp.api.routes import DEFAULT
    from epp.scheduling import request_handler

    stated = (
        "epp parses the routes llm-d v0.10's default parsers claim (`openai-parser`, "
        "`anthropic-parser`, `vllmhttp-parser`, with `passthrough-parser` forwarding any other path"
    ) in FLAT
    default = ["openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser"]
    assert stated == ([p.type for p in DEFAULT.active] == default)
    refused = "`vllmgrpc-parser`, `vertexai-parser` and `sglanghttp-parser` are refused at start" in FLAT
    grpc = {"vllmgrpc-parser", "vertexai-parser", "sglanghttp-parser"}
    assert refused == (set(request_handler.REFUSED) == grpc)


def test_every_file_the_page_names_exists() -> None:
    named = set(re.findall(r"`((?:tests|e2e|scripts|crds|deploy|epp)/[\w./-]+)`", DOC))
    assert named
    for path in named:
        assert (chart.ROOT / path).exists(), path
