"""kubernetes-sigs' `inference-perf` as live mode's load generator (`--client inference-perf`).

A client nobody here wrote: for a workload that has an inference-perf form (`InferencePerfForm`:
its dataset generator and Poisson stages, e.g. `shared-prefix`, the peers' shared-prefix
comparison), each arm's run writes an inference-perf configuration against the arm's router and
runs the pinned binary from its own environment (`scripts/peers-env`: it needs Python >= 3.12).
inference-perf generates its own prompts (text of the tokenizer given, the pods' own, epp-tiny),
so arms compare on its traffic, not the workload's seeded prompts; its seed is fixed, so every arm
gets the same prompts in the same order. Its per-request report (start, end, time to first token,
the server's usage with cached tokens) becomes the run's records, so the report and results.json
are the same as with epp's own client.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from epp.bench.fast import MODEL
from epp.bench.records import RequestRecord
from epp.tokenize.tokenizer import load_shipped

VENV = "inference-perf"
PACKAGE = "inference-perf==0.7.0"


@dataclasses.dataclass(frozen=True, slots=True)
class InferencePerfForm:
    """A workload as inference-perf runs it: its `data:` section and its Poisson stages."""

    data: Mapping[str, Any]
    stages: tuple[tuple[float, float], ...]  # (rate in req/s, seconds)


def installed(peers_dir: Path) -> bool:
    return (peers_dir / VENV / ".epp-peer-ready").is_file()


def config(form: InferencePerfForm, base_url: str, out: Path, *, time_scale: float = 1.0) -> dict[str, Any]:
    """The inference-perf configuration for one arm (rates and durations in wall time)."""
    tokenizer = load_shipped().path
    if tokenizer is None:
        raise RuntimeError("the shipped tokenizer has no tokenizer.json")
    return {
        "api": {"type": "completion", "streaming": True},
        "data": dict(form.data),
        "load": {
            "type": "poisson",
            "stages": [
                {"rate": rate / time_scale, "duration": max(1, round(seconds * time_scale))}
                for rate, seconds in form.stages
            ],
            "num_workers": 1,  # one process: this machine's cores belong to the pods and the router
            "worker_max_concurrency": 1000,
        },
        "server": {"type": "vllm", "model_name": MODEL, "base_url": base_url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(Path(tokenizer).parent)},
        "storage": {"local_storage": {"path": str(out)}},
        "report": {
            "request_lifecycle": {
                "summary": True,
                "per_stage": False,
                "per_request": True,
                "per_request_fields": {
                    "request": False,
                    "response": False,
                    "info": True,
                    "response_chunks": False,
                    "computed_metrics": True,
                },
            }
        },
    }


def run(
    peers_dir: Path, form: InferencePerfForm, base_url: str, workdir: Path, label: str, *, time_scale: float
) -> Path:
    """Run inference-perf against `base_url`; returns the directory holding its reports.

    Raises:
        RuntimeError: it is not installed, or it failed (the end of its log in the message).
    """
    if not installed(peers_dir):
        raise RuntimeError(
            f"{PACKAGE} is not installed under {peers_dir}: "
            "run `bash scripts/peers-env` (or give --peers-dir)"
        )
    out = workdir / f"inference-perf-{label}"
    out.mkdir(parents=True, exist_ok=True)
    conf = workdir / f"inference-perf-{label}.yaml"
    conf.write_text(yaml.safe_dump(config(form, base_url, out, time_scale=time_scale)))
    log = workdir / f"inference-perf-{label}.log"
    binary = peers_dir / VENV / "bin" / "inference-perf"
    with log.open("wb") as f:
        done = subprocess.run([str(binary), "--config_file", str(conf)], stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"inference-perf exited with {done.returncode}; the end of {log}:\n{tail}")
    return out


def records(out: Path, *, time_scale: float = 1.0) -> list[RequestRecord]:
    """The run's requests from inference-perf's per-request report, times in simulated seconds
    from its first request's start."""
    entries = json.loads((out / "per_request_lifecycle_metrics.json").read_text())
    if not entries:
        return []
    t0 = min(float(e["start_time"]) for e in entries)
    out_records: list[RequestRecord] = []
    for e in entries:
        usage = ((e.get("info") or {}).get("response_metrics") or {}).get("server_usage") or {}
        computed = e.get("computed_metrics") or {}
        prompt = int(usage.get("prompt_tokens") or computed.get("input_tokens") or 0)
        record = RequestRecord(
            arrival=(float(e["start_time"]) - t0) / time_scale,
            stage=0,
            group="",
            prompt_tokens=prompt,
            shared_tokens=0,
            max_tokens=int(usage.get("completion_tokens") or 0),
        )
        if e.get("error") is None and usage:
            record.status = 200
            record.first_token = record.arrival + float(computed["time_to_first_token"]) / time_scale
            record.finish = (float(e["end_time"]) - t0) / time_scale
            record.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            record.output_tokens = int(usage.get("completion_tokens") or 0)
        out_records.append(record)
    return out_records
