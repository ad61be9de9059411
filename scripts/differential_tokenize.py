"""Run the differential tokenization test once, at scale, and print its report:

    .venv/bin/python scripts/differential_tokenize.py [--cases 2000] [--route-cases 1000]
        [--routes all] [--seed 20261125] [--workers 2]

Chat and completions (`--cases`, e2e/vllm/chat_requests.py): one real CPU vLLM 0.32 (the vLLM
venv, .venv-vllm or $VLLM_VENV; the e2e model, built if missing) serves the model under every
chat-template style (a chat body carries its style's template), and one `epp serve` is pointed at
it with the styles' tokenizers; every case of `chat_requests.varied(seed, cases)` plus the
context-limit `boundary_cases` goes to both (e2e/vllm/differential.py).

The other routes (`--route-cases` per route, e2e/vllm/api_requests.py): Anthropic's Messages
and count_tokens, Responses and their /render routes render with the *server's* template, so each
style gets a server of its own (`--chat-template`, serving the style's name) and its share of
each route's cases: tiny, chatml-tools, llama3-tools, mistral-tools, parts (vLLM 0.32 does not
start with the `probe` template as its own: it crashes probing it for Anthropic's system-message
rule). /inference/v1/generate and the chat and completions /render routes run on the first server.
Servers run one at a time, each with its own epp.

Prints: per route and style, the cases and their outcomes; the machine; every disagreement in full.
Exits 1 if any request disagrees. Everything it starts is stopped at the end; the logs stay in its
workdir.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from e2e.harness import EppProcess  # noqa: E402
from e2e.vllm import api_requests, chat_requests, differential  # noqa: E402
from e2e.vllm.fleet import MAX_MODEL_LEN, VllmServer, start_all  # noqa: E402
from e2e.vllm.stack import epp_tokenizer_args  # noqa: E402
from epp.gateway.processes import HOST, stable_ports  # noqa: E402

SERVER_STYLES = ("tiny", "chatml-tools", "llama3-tools", "mistral-tools", "parts")
TEMPLATE_ROUTES = (
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/messages/render",
    "/v1/responses/render",
)


def model_root(venv: Path) -> Path:
    """The e2e model for the current builder and templates (as e2e/vllm/conftest.py keys it)."""
    here = REPO / "e2e" / "vllm"
    digest = hashlib.sha256()
    inputs = [here / "build_model.py", *sorted((here / "templates").iterdir())]
    inputs += sorted((REPO / "epp" / "tokenize" / "data").iterdir())
    for path in inputs:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    out = venv / f"e2e-model-{digest.hexdigest()[:16]}"
    if not (out / "model" / "model.safetensors").is_file():
        cmd = [str(venv / "bin" / "python"), str(here / "build_model.py"), str(out)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    return out


Phase = tuple[str, list[chat_requests.Case]]  # (label, cases) against one server


def run_phase(
    server: VllmServer, root: Path, work: Path, name: str, batches: Sequence[Phase], workers: int,
    *, boundary_seed: int | None = None,
) -> list[tuple[str, differential.Result]]:  # fmt: skip
    """Start `server` and an epp pointed at it, run every batch, stop both."""
    epp: EppProcess | None = None
    out: list[tuple[str, differential.Result]] = []
    started = time.monotonic()
    try:
        start_all([server])
        for attempt in range(3):
            # epp's ports are picked once vLLM is up: vLLM binds many ephemeral ports as it starts
            args = epp_tokenizer_args(root / "tokenizers")
            epp = EppProcess(work, endpoints=[server.address], extra_args=args, name=f"epp-{name}-{attempt}")
            try:
                epp.start(timeout=60)
                break
            except RuntimeError:  # a port picked free, then taken by someone else: pick again
                epp.stop()
                if attempt == 2:
                    raise
        assert epp is not None
        epp_url = f"http://{HOST}:{epp.metrics_port}"
        model = server.argv[server.argv.index("--served-model-name") + 1]
        epp_length = differential.epp_checks_length(epp_url, MAX_MODEL_LEN, model=model)
        print(
            f"[{name}] vLLM and epp up in {time.monotonic() - started:.0f} s; epp length checks: {epp_length}"
        )
        for label, cases in batches:
            if boundary_seed is not None and label == "chat and completions":

                def measure(case: chat_requests.Case) -> int | None:
                    answer = differential.vllm_answer(server.url, case)
                    return None if answer.ids is None else len(answer.ids)

                cases = cases + chat_requests.boundary_cases(measure, boundary_seed)
            t0 = time.monotonic()
            results = differential.run(
                cases, vllm_url=server.url, epp_url=epp_url, epp_length=epp_length, workers=workers
            )
            print(f"[{name}] {label}: {len(results)} cases in {time.monotonic() - t0:.0f} s")
            out += [(label, r) for r in results]
    finally:
        if epp is not None:
            epp.stop()
        server.stop()
        for sub in ("cache", "inductor", "tmp"):  # vLLM's caches (~150 MB); the logs stay
            shutil.rmtree(work / sub, ignore_errors=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2000, help="chat and completions cases (0: none)")
    parser.add_argument("--route-cases", type=int, default=1000, help="cases per other route (0: none)")
    parser.add_argument(
        "--routes", default="all", help="comma-separated routes of api_requests.ROUTES, or all"
    )
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    routes = list(api_requests.ROUTES) if args.routes == "all" else args.routes.split(",")
    unknown = set(routes) - set(api_requests.ROUTES)
    if unknown:
        parser.error(f"unknown routes {sorted(unknown)}; known: {', '.join(api_requests.ROUTES)}")

    venv = Path(os.environ.get("VLLM_VENV") or REPO / ".venv-vllm").resolve()
    root = model_root(venv)
    work = Path(tempfile.mkdtemp(prefix="epp-diff-"))
    styles = sorted(d.name for d in (root / "tokenizers").iterdir())
    port = stable_ports(1)[0]

    def server(name: str, served: list[str], template: Path | None = None) -> VllmServer:
        return VllmServer(
            name=name, python=venv / "bin" / "python", model_dir=root / "model", served_names=served,
            port=port, kv_events={"enable_kv_cache_events": False}, workdir=work, num_blocks=128,
            chat_template=template,
        )  # fmt: skip

    def share(route: str, style: str) -> int:
        """A template route's cases are split evenly over the server styles."""
        n: int = args.route_cases
        if route not in TEMPLATE_ROUTES:
            return n if style == "tiny" else 0
        k = len(SERVER_STYLES)
        return n // k + (1 if SERVER_STYLES.index(style) < n % k else 0)

    results: list[tuple[str, differential.Result]] = []
    started = time.monotonic()
    for style in SERVER_STYLES:
        batches: list[Phase] = []
        if style == "tiny" and args.cases:
            batches.append(("chat and completions", chat_requests.varied(args.seed, args.cases)))
        for route in routes:
            n = share(route, style)
            if n:
                batches.append((f"{route} ({style})", api_requests.route_cases(args.seed, route, n, [style])))
        if not batches:
            continue
        if style == "tiny":
            srv = server("vllm-tiny", ["tiny", *styles])  # the model's own template; every alias
        else:
            template = REPO / "e2e" / "vllm" / "templates" / (style.replace("-", "_") + ".jinja")
            srv = server(f"vllm-{style}", [style], template)
        results += run_phase(srv, root, work, style, batches, args.workers, boundary_seed=args.seed)
    elapsed = time.monotonic() - started

    by_route: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for label, r in results:
        route = label.split(" (")[0]
        by_route[route][r.outcome] += 1
        if route != label:
            by_route[label][r.outcome] += 1  # the route in one style
        kind = r.case.kind.split(" (")[0]
        kind = " ".join(kind.split()[:2]) if kind.startswith("boundary") else kind
        by_kind[f"{route}: {kind}"][r.outcome] += 1
    bad = [r for _, r in results if r.outcome not in differential.AGREE]
    print()
    print(f"seed: {args.seed}; vLLM max_model_len {MAX_MODEL_LEN}; server styles: {', '.join(SERVER_STYLES)}")
    print(f"time: {elapsed:.0f} s, {args.workers} at a time")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print("route | cases | equal | both refuse | disagree")
    for label, c in sorted(by_route.items()):
        total = sum(c.values())
        disagree = sum(v for k, v in c.items() if k not in differential.AGREE)
        agree = c["equal"] + c["both refuse"] + c["length, not yet checked by epp"]
        agreed = f"{100 * agree / total:.2f}% agree"
        print(f"{label} | {total} | {c['equal']} | {c['both refuse']} | {disagree} ({agreed})")
    print("by kind:")
    for kind, c in sorted(by_kind.items()):
        print(f"  {kind}: " + ", ".join(f"{k} {v}" for k, v in c.most_common()))
    for r in bad:
        print()
        print(r.describe())
    agree = len(results) - len(bad)
    print(
        f"\nagreement on ids and refusals: {agree}/{len(results)} ({100 * agree / max(1, len(results)):.2f}%)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
