from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from epp.bench import cli, inference_perf
from epp.bench.workload import Fleet
from epp.bench.workloads import SharedPrefix, Unique
from epp.sim.profiles import get_profile

A100 = get_profile("codellama-13b-a100")
FLEET = Fleet(8, A100.num_gpu_blocks * A100.block_size, A100.max_model_len)


def test_shared_prefix_has_its_inference_perf_form() -> None:
    wl = SharedPrefix(seed=1, scale=0.5, fleet=FLEET)
    form = wl.inference_perf_form()
    conf = inference_perf.config(form, "http://127.0.0.1:1", Path("/out"), time_scale=2.0)
    shared = conf["data"]["shared_prefix"]
    assert (shared["num_groups"], shared["num_prompts_per_group"], shared["question_len"]) == (30, 10, 128)
    assert shared["system_prompt_len"]["min"] == 2048 and shared["system_prompt_len"]["max"] == 4096
    # Wall time: half the rate for twice as long under --time-scale 2.
    assert conf["load"]["stages"] == [{"rate": 10.0, "duration": 120}]
    assert conf["server"]["base_url"] == "http://127.0.0.1:1" and conf["server"]["ignore_eos"] is True
    assert conf["tokenizer"]["pretrained_model_name_or_path"].endswith("tokenize/data")
    # Our own client sends the same shape: 30 prefixes of 2k-4k tokens + 128-token questions.
    assert len(wl.system_lengths) == 30 and all(2048 <= n <= 4096 for n in wl.system_lengths)


def test_a_workload_without_the_form_is_refused_for_inference_perf() -> None:
    with pytest.raises(NotImplementedError, match="no inference-perf form"):
        Unique(seed=1, scale=0.1, fleet=FLEET).inference_perf_form()
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    ns = parser.parse_args(["--workload", "unique", "--mode", "live", "--client", "inference-perf"])
    with pytest.raises(cli.BenchConfigError, match="no inference-perf form"):
        cli._plan(ns)


def test_per_request_reports_become_records(tmp_path: Path) -> None:
    def entry(start: float, end: float, ttft: float, cached: int, error: object = None) -> dict[str, object]:
        usage = {
            "prompt_tokens": 229,
            "completion_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        return {
            "start_time": start,
            "end_time": end,
            "info": {"response_metrics": {"output_tokens": 24, "server_usage": usage}},
            "computed_metrics": {"time_to_first_token": ttft, "input_tokens": 229},
            "error": error,
        }

    reports = [
        entry(100.0, 100.5, 0.1, 0),
        entry(101.0, 101.2, 0.05, 224),
        entry(102.0, 102.1, 0.0, 0, "boom"),
    ]
    reports[2]["info"] = None
    (tmp_path / "per_request_lifecycle_metrics.json").write_text(json.dumps(reports))
    one, two, failed = inference_perf.records(tmp_path, time_scale=0.5)
    assert (one.arrival, one.first_token, one.finish, one.status) == (0.0, 0.2, 1.0, 200)
    assert (two.arrival, two.cached_tokens, two.output_tokens, two.prompt_tokens) == (2.0, 224, 8, 229)
    assert failed.status == 0 and failed.finish is None
