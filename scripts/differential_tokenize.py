"""Run the differential tokenization test once, at scale, and print its report:

    .venv/bin/python scripts/differential_tokenize.py [--cases 2000] [--seed 20261125] [--workers 2]

Starts one real CPU vLLM 0.32 (the vLLM venv, .venv-vllm or $VLLM_VENV; the e2e model, built if
missing) serving the e2e model under every chat-template style, and one `epp serve` pointed at it
with the styles' tokenizers; sends every case of `chat_requests.varied(seed, cases)` plus the
context-limit `boundary_cases` to both (e2e/vllm/differential.py) and prints: cases, styles,
seed, outcome counts (also per kind of case), and every disagreement in full. Exits 1 if any
request disagrees. Everything it starts is stopped at the end; the logs stay in its workdir.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from e2e.harness import EppProcess  # noqa: E402
from e2e.vllm import chat_requests, differential  # noqa: E402
from e2e.vllm.fleet import MAX_MODEL_LEN, VllmServer, start_all  # noqa: E402
from e2e.vllm.stack import epp_tokenizer_args, stable_ports  # noqa: E402
from epp.gateway.processes import HOST  # noqa: E402


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    venv = Path(os.environ.get("VLLM_VENV") or REPO / ".venv-vllm").resolve()
    root = model_root(venv)
    work = Path(tempfile.mkdtemp(prefix="epp-diff-"))
    styles = sorted(d.name for d in (root / "tokenizers").iterdir())
    server = VllmServer(
        name="vllm",
        python=venv / "bin" / "python",
        model_dir=root / "model",
        served_names=["tiny", *styles],
        port=stable_ports(1)[0],
        kv_events={"enable_kv_cache_events": False},
        workdir=work,
        num_blocks=128,
    )
    epp = EppProcess(work, endpoints=[server.address], extra_args=epp_tokenizer_args(root / "tokenizers"))
    started = time.monotonic()
    try:
        start_all([server])
        epp.start(timeout=60)
        epp_url = f"http://{HOST}:{epp.metrics_port}"
        print(f"vLLM and epp up in {time.monotonic() - started:.0f} s (workdir {work})", flush=True)
        epp_length = differential.epp_checks_length(epp_url, MAX_MODEL_LEN)
        cases = chat_requests.varied(args.seed, args.cases)

        def measure(case: chat_requests.Case) -> int | None:
            answer = differential.vllm_answer(server.url, case)
            return None if answer.ids is None else len(answer.ids)

        cases += chat_requests.boundary_cases(measure, args.seed)
        t0 = time.monotonic()

        def progress(i: int) -> None:
            if i % 250 == 0:
                print(f"  {i}/{len(cases)} in {time.monotonic() - t0:.0f} s", flush=True)

        results = differential.run(
            cases,
            vllm_url=server.url,
            epp_url=epp_url,
            epp_length=epp_length,
            workers=args.workers,
            progress=progress,
        )
        elapsed = time.monotonic() - t0
    finally:
        epp.stop()
        server.stop()
        for sub in ("cache", "inductor", "tmp"):  # vLLM's caches (~150 MB); the logs stay
            shutil.rmtree(work / sub, ignore_errors=True)

    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in results:
        kind = r.case.kind.split(" (")[0]
        kind = " ".join(kind.split()[:2]) if kind.startswith("boundary") else kind
        by_kind[kind][r.outcome] += 1
    counted = differential.counts(results)
    bad = differential.disagreements(results)
    print()
    print(f"cases: {len(results)} ({args.cases} varied + {len(results) - args.cases} at the context limit)")
    print(f"styles (chat templates): {', '.join(['tiny', *styles])}")
    print(
        f"seed: {args.seed}; vLLM max_model_len {MAX_MODEL_LEN}; epp refuses over-long prompts: {epp_length}"
    )
    print(f"time: {elapsed:.0f} s for the cases, {args.workers} at a time")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print("outcomes:", ", ".join(f"{k} {v}" for k, v in counted.items()))
    agree = len(results) - len(bad)
    print(
        f"agreement on ids and refusals: {agree}/{len(results)} ({100 * agree / max(1, len(results)):.2f}%)"
    )
    print("by kind:")
    for kind, c in sorted(by_kind.items()):
        print(f"  {kind}: " + ", ".join(f"{k} {v}" for k, v in c.most_common()))
    for r in bad:
        print()
        print(r.describe())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
