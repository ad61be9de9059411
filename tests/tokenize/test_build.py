"""scripts/build_tokenizer.py reproduces the shipped epp-tiny files byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tokenizers

from epp.tokenize import tokenizer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_tokenizer.py"
# The shipped files were trained with this tokenizers series; another may merge ties differently.
BUILT_WITH = "0.23."


@pytest.mark.skipif(
    not tokenizers.__version__.startswith(BUILT_WITH),
    reason=f"epp-tiny was built with tokenizers {BUILT_WITH}x, this is {tokenizers.__version__}",
)
def test_build_reproduces_shipped_files(tmp_path: Path) -> None:
    # Another hash seed: nothing in the build may depend on str hashing.
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], check=True, env=env, timeout=60)
    shipped = sorted(p.name for p in tokenizer.SHIPPED_DIR.iterdir() if p.is_file())
    assert sorted(p.name for p in tmp_path.iterdir()) == shipped
    for name in shipped:
        assert (tmp_path / name).read_bytes() == (tokenizer.SHIPPED_DIR / name).read_bytes(), name
