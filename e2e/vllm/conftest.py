"""Fixtures for the suite against real vLLM (e2e/vllm): one stack for the whole session.

Needs the vLLM venv that `bash scripts/vllm-env` builds (.venv-vllm, or $VLLM_VENV). Without it
the suite is skipped with that instruction, except under CI (CI=true), where scripts/test builds
the venv first and a missing one is an error, never a silent skip.

The stack (e2e/vllm/stack.py: three vLLMs, epp, Envoy) starts once, at the first test that asks
for it; its model is built once per change of the builder, its templates or epp-tiny and kept in
the venv's directory. Tests run in the order of `_MODULE_ORDER`: the fault tests restart and kill
pods, so they come last. When a test fails, the logs of epp, Envoy and every vLLM are attached.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness import Cleanup
from e2e.vllm.stack import VllmStack, start_stack

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STAMP = ".epp-vllm-ready"  # written by scripts/vllm-env once the venv is complete
_MODULE_ORDER = (
    "test_tokenization",
    "test_max_model_len",
    "test_prefix_cache",
    "test_peer_fidelity",
    "test_metrics_page",
    "test_faults",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs real vLLM servers (the venv of scripts/vllm-env)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mine = [i for i, item in enumerate(items) if HERE in Path(str(item.path)).parents]

    def rank(item: pytest.Item) -> int:
        stem = Path(str(item.path)).stem
        return _MODULE_ORDER.index(stem) if stem in _MODULE_ORDER else len(_MODULE_ORDER)

    ordered = sorted((items[i] for i in mine), key=rank)  # stable: file order within a module
    for i, item in zip(mine, ordered, strict=True):
        items[i] = item


def _venv() -> Path:
    return Path(os.environ.get("VLLM_VENV") or REPO / ".venv-vllm").resolve()


@pytest.fixture(scope="session")
def vllm_python(e2e_prerequisites: None) -> Path:
    venv = _venv()
    if not (venv / STAMP).is_file():
        message = f"no vLLM venv at {venv}: run `bash scripts/vllm-env` first"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def model_root(vllm_python: Path) -> Path:
    """The built model and tokenizer dirs (build_model.py), reused while their inputs are unchanged."""
    digest = hashlib.sha256()
    inputs = [HERE / "build_model.py", *sorted((HERE / "templates").iterdir())]
    inputs += sorted((REPO / "epp" / "tokenize" / "data").iterdir())
    for path in inputs:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    out = _venv() / f"e2e-model-{digest.hexdigest()[:16]}"
    if not (out / "model" / "model.safetensors").is_file():
        subprocess.run(
            [str(vllm_python), str(HERE / "build_model.py"), str(out)],
            check=True,
            capture_output=True,
            timeout=600,
        )
    return out


@pytest.fixture(scope="session")
def vllm_stack(
    tmp_path_factory: pytest.TempPathFactory, vllm_python: Path, model_root: Path
) -> Iterator[VllmStack]:
    registry = Cleanup()
    workdir = tmp_path_factory.mktemp("vllm")
    try:
        yield start_stack(workdir, vllm_python, model_root, registry.push)
    finally:
        errors = registry.close()
        if errors:
            print("vLLM stack cleanup errors:", *errors, sep="\n  ")


@pytest.fixture
def stack(vllm_stack: VllmStack, cleanup: Cleanup) -> Iterator[VllmStack]:
    """The session's stack, with its logs attached to this test's report if it fails; the OpenAI
    clients a test opened are closed after it."""
    for title, path in vllm_stack.logs():
        cleanup.add_log(title, path)
    try:
        yield vllm_stack
    finally:
        vllm_stack.close_clients()
