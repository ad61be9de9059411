"""Regenerates `data/upstream_configs.json`: the facts of every EndpointPickerConfig that GIE and llm-d
publish (plugin types, names and parameter values, scheduling profiles, inline sections), read from
local copies of those repositories. The upstream files themselves are not kept in this repository;
`test_upstream_configs.py` renders each record back into a configuration of its own.

    python -m tests.scheduling.upstream_refs GIE_CLONE ROUTER_CLONE GUIDES_DIR

GIE_CLONE is a git clone of kubernetes-sigs/gateway-api-inference-extension holding the v1.0.0 and
v1.5.0 tags; ROUTER_CLONE one of llm-d/llm-d-router (formerly llm-d-inference-scheduler) holding
ROUTER_COMMIT and ROUTER_V010_COMMIT;
both as the workplace `fetch` tool brings them (bare git directories). llm-d/llm-d's stored snapshot
predates its guides, so GUIDES_DIR holds each guide's Helm values file as the search index returns it
for the commit named below, laid out as GUIDES_DIR/<commit>/<path>; only the YAML mapping is read, so
a file trimmed to the `pluginsCustomConfig` it needs gives the same facts.

SOURCES below names each configuration by where it sits (file, first line of its document), which
is all this module knows about it; the document itself is read from the clone at run time.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

OUT = pathlib.Path(__file__).parent / "data" / "upstream_configs.json"

GIE_REPO = "kubernetes-sigs/gateway-api-inference-extension"
ROUTER_REPO = "llm-d/llm-d-inference-scheduler"
GUIDES_REPO = "llm-d/llm-d"
GIE_TAGS = {
    "v1.0.0": "ffea26329a16922bb3b2cf37a383417c511227d5",
    "v1.5.0": "df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849",
}
ROUTER_COMMIT = "520af47896e5f06e43d09aca281a1149187b0ffd"
# llm-d-router v0.10 (released 2026-08-17): its main five days later, whose deploy/config/ holds the
# 19 configurations of the release with two since fixed; the same clone as ROUTER_COMMIT's.
ROUTER_V010_REPO = "llm-d/llm-d-router"
ROUTER_V010_COMMIT = "ebab687927f5331c1b39defcb579a07951bce56c"

# Top-level keys rendered from their own fields; every other key is kept as an inline section.
_OWN_KEYS = ("apiVersion", "kind", "plugins", "schedulingProfiles")


@dataclass(frozen=True)
class Where:
    """One document: `origin` is "gie", "router", "router-v0.10" or "guides"; `ref` a GIE tag, or
    a commit."""

    origin: str
    ref: str
    path: str
    line: int | None = None  # first line of the document (None: a Helm values entry)


@dataclass(frozen=True)
class Source:
    id: str
    where: Where
    extraction: str  # "document", "helm-template-defaults" or "helm-values-entry"
    copies: tuple[Where, ...] = field(default_factory=tuple)


def _gie(tag: str, path: str, line: int) -> Where:
    return Where("gie", tag, path, line)


def _router(path: str, line: int) -> Where:
    return Where("router", ROUTER_COMMIT, path, line)


def _router_v010(path: str, line: int) -> Where:
    return Where("router-v0.10", ROUTER_V010_COMMIT, path, line)


def _guide(commit: str, path: str) -> Where:
    return Where("guides", commit, path)


def _id(w: Where, n: int | None = None) -> str:
    prefix = {"gie": f"gie-{w.ref}", "router": "llm-d-router-HEAD", "router-v0.10": "llm-d-router-v0.10"}[
        w.origin
    ]
    name = w.path.rsplit(".", 1)[0].replace("/", "__")
    return f"{prefix}-{name}" + (f"-{n}" if n is not None else "")


def _doc(w: Where, n: int | None = None, copies: tuple[Where, ...] = ()) -> Source:
    return Source(_id(w, n), w, "document", copies)


_E2E = (
    _gie("v1.0.0", "config/manifests/inferencepool-resources.yaml", 114),
    _gie("v1.0.0", "site-src/guides/inferencepool-rollout.md", 304),
    _gie("v1.0.0", "test/testdata/inferencepool-e2e.yaml", 111),
    _gie("v1.0.0", "test/testdata/inferencepool-leader-election-e2e.yaml", 110),
    _gie("v1.5.0", "test/testdata/inferencepool-e2e.yaml", 108),
    _gie("v1.5.0", "test/testdata/inferencepool-leader-election-e2e.yaml", 133),
    _router("test/testdata/inferencepool-e2e.yaml", 108),
    _router("test/testdata/inferencepool-leader-election-e2e.yaml", 134),
)
_TEXT = "site-src/guides/epp-configuration/config-text.md"
_TROUBLE = "site-src/guides/troubleshooting.md"
_SERVERS = "site-src/implementations/model-servers.md"
_PARSERS = "pkg/epp/framework/plugins/requesthandling/parsers/README.md"
_IT = "test/integration/epp/testdata/"
_LOADER = "test/testdata/configloader_1_test.yaml"
_CHART_README = "config/charts/inferencepool/README.md"
_PPC = "guides/precise-prefix-cache-aware/"

SOURCES: tuple[Source, ...] = (
    _doc(_gie("v1.0.0", "config/charts/inferencepool/templates/epp-config.yaml", 8), copies=_E2E),
    _doc(_gie("v1.0.0", "conformance/resources/base.yaml", 350)),
    _doc(_gie("v1.0.0", _TEXT, 89), 2, (_gie("v1.0.0", _TEXT, 156),)),
    _doc(_gie("v1.0.0", _TEXT, 175), 3),
    _doc(_gie("v1.0.0", _LOADER, 1)),
    Source(
        "gie-v1.5.0-chart-default-rendered",
        _gie("v1.5.0", "config/charts/epplib/templates/_config.yaml", 24),
        "helm-template-defaults",
    ),
    _doc(_gie("v1.5.0", _CHART_README, 78), 1, (_router(_CHART_README, 78),)),
    _doc(_gie("v1.5.0", "conformance/resources/base.yaml", 804)),
    _doc(_gie("v1.5.0", _PARSERS, 21), 1),
    _doc(_gie("v1.5.0", _TEXT, 68), 2, (_gie("v1.5.0", _TEXT, 135),)),
    _doc(_gie("v1.5.0", _TEXT, 154), 3),
    _doc(_gie("v1.5.0", _TROUBLE, 117), 1),
    _doc(_gie("v1.5.0", _TROUBLE, 146), 2),
    _doc(_gie("v1.5.0", _SERVERS, 78), 1),
    _doc(_gie("v1.5.0", _SERVERS, 94), 2),
    _doc(
        _gie("v1.5.0", _IT + "datalayer-config.yaml", 1), copies=(_router(_IT + "datalayer-config.yaml", 1),)
    ),
    _doc(_gie("v1.5.0", _IT + "default-config.yaml", 1), copies=(_router(_IT + "default-config.yaml", 1),)),
    _doc(
        _gie("v1.5.0", _IT + "request-attribute-reporter-config.yaml", 1),
        copies=(_router(_IT + "request-attribute-reporter-config.yaml", 1),),
    ),
    _doc(_gie("v1.5.0", _LOADER, 1), copies=(_router(_LOADER, 1),)),
    Source(
        "llm-d-guides-gaie-kv-events",
        _guide("126f65d65f425be25f9f23a8e495cc0070f24421", _PPC + "gaie-kv-events/values.yaml"),
        "helm-values-entry",
    ),
    Source(
        "llm-d-guides-inference-scheduling",
        _guide(
            "086f217d643a6932b261a60f8f337b2ca2629d80",
            "guides/inference-scheduling/scheduler/inference-scheduling.values.yaml",
        ),
        "helm-values-entry",
    ),
    Source(
        "llm-d-guides-pd-disaggregation",
        _guide(
            "238a4c009ef621e252e63cf7f55a834dbf47fbd2",
            "guides/pd-disaggregation/scheduler/pd-disaggregation.values.yaml",
        ),
        "helm-values-entry",
    ),
    Source(
        "llm-d-guides-precise-prefix-cache-aware-pod-discovery",
        _guide(
            "019a3f3fb1c1ef672194408d3427e7ecd770b8bb", _PPC + "scheduler/features/pod-discovery.values.yaml"
        ),
        "helm-values-entry",
    ),
    Source(
        "llm-d-guides-precise-prefix-cache-aware",
        _guide(
            "019a3f3fb1c1ef672194408d3427e7ecd770b8bb",
            _PPC + "scheduler/precise-prefix-cache-aware.values.yaml",
        ),
        "helm-values-entry",
    ),
    *(
        _doc(_router(f"deploy/config/{name}.yaml", line))
        for name, line in (
            ("dp-epp-config", 3),
            ("epp-config", 3),
            ("epp-estimate-prefix-cache-config", 3),
            ("epp-precise-prefix-cache-config", 2),
            ("pd-epp-config", 2),
            ("probabilistic-admitter-epp-config", 7),
            ("sim-e-p-d-epp-config", 2),
            ("sim-e-pd-epp-config", 3),
            ("sim-epp-config", 3),
            ("sim-epp-kvcache-config", 3),
            ("sim-epp-no-hit-lru", 3),
            ("sim-epp-tokenizer-vllm-http-config", 5),
            ("sim-pd-epp-config", 3),
        )
    ),
    *(
        _doc(_router_v010(f"deploy/config/{name}.yaml", line))
        for name, line in (
            ("dp-epp-config", 3),
            ("epp-burst-prefix-cache-config", 7),
            ("epp-config", 3),
            ("epp-estimate-prefix-cache-config", 3),
            ("epp-mm-embeddings-cache-config", 2),
            ("epp-precise-prefix-cache-config", 3),
            ("pd-epp-config", 2),
            ("pd-topology-epp-config", 5),
            ("probabilistic-admitter-epp-config", 12),
            ("sim-e-p-d-epp-config", 2),
            ("sim-e-pd-epp-config", 3),
            ("sim-epp-config", 3),
            ("sim-epp-gpu-config", 3),
            ("sim-epp-kvcache-config", 3),
            ("sim-epp-no-hit-lru", 3),
            ("sim-epp-tokenizer-vllm-http-config", 5),
            ("sim-pd-epp-config", 3),
            ("sim-program-aware-config", 1),
            ("soft-reflective-ceiling-epp-config", 7),
        )
    ),
    _doc(_router("docs/architecture.md", 148), 2),
    _doc(_router("docs/disaggregation.md", 259), 1),
    _doc(_router("docs/disaggregation.md", 313), 2),
    _doc(_router("pkg/epp/framework/plugins/datalayer/source/models/README.md", 48), 1),
    _doc(_router("pkg/epp/framework/plugins/requestcontrol/requestattributereporter/README.md", 27), 1),
    _doc(_router(_PARSERS, 22), 1),
)


class Reader:
    def __init__(self, gie: str, router: str, guides: str) -> None:
        self.gie, self.router, self.guides = gie, router, pathlib.Path(guides)

    def text(self, w: Where) -> str:
        if w.origin == "guides":
            return (self.guides / w.ref / w.path).read_text("utf-8")
        clone, commit = (
            (self.gie, GIE_TAGS[w.ref]) if w.origin == "gie" else (self.router, w.ref)
        )  # both routers
        out = subprocess.run(
            ["git", "-C", clone, "show", f"{commit}:{w.path}"], check=True, capture_output=True, text=True
        )
        return out.stdout


def _block(text: str, line: int) -> list[str]:
    """The document starting at 1-based `line`: up to a Markdown fence, a `---` separator, or the
    first line indented less than the first (the end of a ConfigMap's or a list item's block)."""
    lines = text.splitlines()[line - 1 :]
    base = len(lines[0]) - len(lines[0].lstrip())
    out: list[str] = []
    for raw in lines:
        stripped = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        if out and stripped and (indent < base or stripped.startswith("```") or stripped == "---"):
            break
        out.append(raw[base:] if raw[:base].strip() == "" else raw)
    return out


def _document(reader: Reader, w: Where) -> dict[str, Any]:
    assert w.line is not None
    doc = yaml.safe_load("\n".join(_block(reader.text(w), w.line)))
    if not isinstance(doc, dict) or doc.get("kind") != "EndpointPickerConfig":
        raise SystemExit(f"{w}: no EndpointPickerConfig document starts there")
    return doc


def _lookup(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


_EXPR = re.compile(r"\{\{-?\s*\.Values\.([\w.]+)((?:\s*\|\s*[^|}]+?)*)\s*-?\}\}")


def _helm_defaults(reader: Reader, w: Where) -> dict[str, Any]:
    """GIE's chart builds its default configuration in a template. Rendered here with the chart's
    default values, under which every condition guarding output lines is false (checked below:
    vLLM over HTTP, no parser, no endpointsServer, latency predictor off), so each `if` yields its
    `else` branch; `{{ .Values.x | default d | quote }}` takes x from values.yaml, else d."""
    values = yaml.safe_load(reader.text(Where("gie", w.ref, "config/charts/inferencepool/values.yaml")))
    facts = {
        "inferencePool.modelServerType": "vllm",
        "inferencePool.modelServerProtocol": "http",
        "inferencePool.parser": "",
        "inferenceExtension.endpointsServer": None,
        "inferenceExtension.latencyPredictor.enabled": False,
    }
    for key, want in facts.items():
        if _lookup(values, key) != want:
            raise SystemExit(f"{w}: the chart's default {key} is no longer {want!r}; re-derive the rendering")

    def substitute(m: re.Match[str]) -> str:
        value = _lookup(values, m.group(1))
        for pipe in (p.strip() for p in m.group(2).split("|") if p.strip()):
            if pipe.startswith("default ") and value in (None, ""):
                value = yaml.safe_load(pipe.removeprefix("default "))
            elif pipe == "quote":
                value = json.dumps(str(value))
        return value if isinstance(value, str) else json.dumps(value)

    assert w.line is not None
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (branch active, some branch of this `if` already taken)
    for raw in _block(reader.text(w), w.line):
        stripped = raw.strip()
        if stripped.startswith("{{") and stripped.endswith("}}"):
            words = stripped.strip("{}-").split()
            if words[:1] == ["if"]:
                stack.append((False, False))
            elif words[:2] == ["else", "if"]:
                stack[-1] = (False, stack[-1][1])
            elif words[:1] == ["else"]:
                stack[-1] = (not stack[-1][1], True)
            elif words[:1] == ["end"]:
                stack.pop()
            continue
        if all(active for active, _ in stack):
            out.append(_EXPR.sub(substitute, raw))
    doc = yaml.safe_load("\n".join(out))
    assert isinstance(doc, dict) and doc.get("kind") == "EndpointPickerConfig", w
    return doc


def _values_entry(reader: Reader, w: Where) -> tuple[dict[str, Any], str]:
    values = yaml.safe_load(reader.text(w))
    found = [
        (f"{top}.pluginsCustomConfig.{name}", text)
        for top in ("inferenceExtension", "inferencePool")
        for name, text in ((values.get(top) or {}).get("pluginsCustomConfig") or {}).items()
    ]
    if len(found) != 1:
        raise SystemExit(f"{w}: expected one pluginsCustomConfig entry, found {len(found)}")
    key, text = found[0]
    return yaml.safe_load(text), key


def facts(doc: dict[str, Any]) -> dict[str, Any]:
    """A configuration's content, regrouped: plugins, profiles, then every other top-level key as a
    section. Keys a record does not know are kept under `other` so a typo stays a fact."""
    out: dict[str, Any] = {"apiVersion": doc.get("apiVersion"), "kind": doc.get("kind")}
    plugins = []
    for p in doc.get("plugins") or []:
        entry = {k: p[k] for k in ("type", "name", "parameters") if k in p}
        other = {k: v for k, v in p.items() if k not in entry}
        plugins.append(entry | ({"other": other} if other else {}))
    out["plugins"] = plugins
    if "schedulingProfiles" in doc:
        profiles = []
        for prof in doc["schedulingProfiles"]:
            entry = {
                "name": prof.get("name"),
                "plugins": [
                    {k: ref[k] for k in ("pluginRef", "weight") if k in ref}
                    for ref in prof.get("plugins") or []
                ],
            }
            assert all(set(ref) <= {"pluginRef", "weight"} for ref in prof.get("plugins") or []), prof
            other = {k: v for k, v in prof.items() if k not in ("name", "plugins")}
            profiles.append(entry | ({"other": other} if other else {}))
        out["schedulingProfiles"] = profiles
    out["sections"] = {k: v for k, v in doc.items() if k not in _OWN_KEYS}
    return out


def _where(w: Where) -> dict[str, Any]:
    repo = {"gie": GIE_REPO, "router": ROUTER_REPO, "router-v0.10": ROUTER_V010_REPO, "guides": GUIDES_REPO}[
        w.origin
    ]
    commit = GIE_TAGS.get(w.ref, w.ref) if w.origin == "gie" else w.ref
    out: dict[str, Any] = {"repo": repo, "commit": commit, "path": w.path, "line": w.line}
    if w.origin == "gie":
        out["tag"] = w.ref
    return out


def extract(reader: Reader) -> dict[str, Any]:
    records = []
    for src in SOURCES:
        where = _where(src.where)
        if src.extraction == "document":
            doc = _document(reader, src.where)
        elif src.extraction == "helm-template-defaults":
            doc = _helm_defaults(reader, src.where)
            where["rendered_with"] = "config/charts/inferencepool/values.yaml defaults"
        else:
            doc, where["entry"] = _values_entry(reader, src.where)
        record = facts(doc)
        for copy in src.copies:
            if facts(_document(reader, copy)) != record:
                raise SystemExit(f"{src.id}: {copy} is no longer the same configuration")
        records.append(
            {
                "id": src.id,
                "source": where,
                "extraction": src.extraction,
                "same_config_at": [_where(c) for c in src.copies],
                "config": record,
            }
        )
    return {
        "about": "Facts of GIE's and llm-d's published EndpointPickerConfigs; no upstream text.",
        "extracted_by": "tests/scheduling/upstream_refs.py",
        "configs": records,
    }


def dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        raise SystemExit(__doc__)
    OUT.write_text(dump(extract(Reader(*argv))), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
