"""`epp serve` exits non-zero, naming the model and the path, when a configured tokenizer is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    # Every port 0: the process must fail before binding anything.
    command = [sys.executable, "-m", "epp", "serve", "--secure-serving=false", "--log-format=text"]
    ports = ["--grpc-port=0", "--grpc-health-port=0", "--metrics-port=0"]
    return subprocess.run([*command, *ports, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("where", ["endpoints file", "config", "flag"])
def test_missing_tokenizer_is_fatal(tmp_path: Path, where: str) -> None:
    missing = tmp_path / "models" / "llama"
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("- {address: '127.0.0.1:8000', model: llama}\n")
    args = [f"--endpoints-file={endpoints}"]
    if where == "endpoints file":
        endpoints.write_text(f"- {{address: '127.0.0.1:8000', model: llama, tokenizer: {missing}}}\n")
        origin = f" (endpoints file {endpoints})"
    elif where == "config":
        plugins = f"plugins:\n- type: tokenizer\n  parameters: {{modelName: llama, path: {missing}}}\n"
        args.append("--config-text=" + HEAD + plugins + "- type: queue-scorer\n")
        origin = " (EndpointPickerConfig)"
    else:
        args.append(f"--tokenizer=llama={missing}")
        origin = ""
    done = serve(*args)
    assert done.returncode == 2, done.stderr
    assert (
        f"cannot start: tokenizer for model 'llama'{origin}: {missing}: no such file or directory"
        in done.stderr
    )
