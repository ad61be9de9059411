"""`epp serve` takes every flag of GIE's EPP binary (v1.0-v1.5) and does what GIE's does with it,
or refuses to start with a clear message, or logs once that the flag has no effect in epp."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from epp import cli
from epp.flags import compat

ROOT = Path(__file__).resolve().parents[1]

# GIE v1.5.0, pkg/epp/server/options.go (AddFlags), its logging options (-v and controller-runtime's
# zap flags), plus nothing that v1.0-v1.4 had and v1.5 dropped (they are all still there).
GIE_FLAGS = {
    "grpc-port": "9002",
    "ha-enable-leader-election": "false",
    "pool-group": "inference.networking.k8s.io",
    "pool-namespace": "llm",
    "pool-name": "pool",
    "endpoint-selector": "app=vllm",
    "endpoint-target-ports": "8000,8001",
    "disable-endpoint-subset-filter": "true",
    "model-server-metrics-scheme": "http",
    "model-server-metrics-path": "/metrics",
    "model-server-metrics-port": "0",
    "model-server-metrics-https-insecure-skip-verify": "true",
    "refresh-metrics-interval": "50ms",
    "refresh-prometheus-metrics-interval": "5s",
    "metrics-staleness-threshold": "2s",
    "total-queued-requests-metric": "vllm:num_requests_waiting",
    "total-running-requests-metric": "vllm:num_requests_running",
    "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
    "lora-info-metric": "vllm:lora_requests_info",
    "cache-info-metric": "vllm:cache_config_info",
    "v": "2",
    "zap-devel": "false",
    "zap-encoder": "json",
    "zap-log-level": "info",
    "zap-stacktrace-level": "error",
    "zap-time-encoding": "rfc3339",
    "tracing": "false",
    "health-checking": "true",
    "metrics-port": "9090",
    "grpc-health-port": "9003",
    "enable-pprof": "true",
    "cert-path": "/certs",
    "enable-cert-reload": "false",
    "secure-serving": "true",
    "metrics-endpoint-auth": "false",
    "config-file": "/config/default-plugins.yaml",
    "config-text": "",
}
BOOLEANS = {
    "ha-enable-leader-election",
    "disable-endpoint-subset-filter",
    "model-server-metrics-https-insecure-skip-verify",
    "zap-devel",
    "tracing",
    "health-checking",
    "enable-pprof",
    "enable-cert-reload",
    "secure-serving",
    "metrics-endpoint-auth",
}


def parse(*argv: str) -> object:
    return cli.build_parser().parse_args(["serve", *compat.normalize_go_flags(list(argv), serve_parser())])


def serve_parser() -> object:
    return cli._subparser(cli.build_parser(), "serve")


@pytest.mark.parametrize("name", sorted(GIE_FLAGS))
def test_every_gie_flag_is_accepted(name: str) -> None:
    if name == "config-text":
        return  # mutually exclusive with --config-file; parsed on its own below
    args = parse(f"--{name}={GIE_FLAGS[name]}")
    assert getattr(args, name.replace("-", "_")) is not None
    if name in BOOLEANS:  # Go's bare form
        assert getattr(parse(f"--{name}"), name.replace("-", "_")) is True


def test_config_text_is_accepted() -> None:
    assert parse("--config-text", "kind: EndpointPickerConfig").config_text == "kind: EndpointPickerConfig"


def test_gies_chart_args_parse() -> None:
    # What GIE v1.5.0's chart (epplib _deployment.yaml) passes, with `flags: {v: 3}` and 2 replicas.
    args = parse(
        "--pool-name", "vllm-llama3-8b-instruct",
        "--pool-namespace", "default",
        "--pool-group", "inference.networking.k8s.io",
        "--zap-encoder", "json",
        "--config-file", "/config/default-plugins.yaml",
        "--ha-enable-leader-election",
        "--v", "3",
        "--tracing=false",
        "--metrics-endpoint-auth=false",
    )  # fmt: skip
    assert (args.zap_encoder, args.v, args.tracing, args.ha_enable_leader_election) == (
        "json",
        3,
        False,
        True,
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-grpc-port=9100", "-v=4", "-secure-serving=false"], (9100, 4, False)),
        (["-grpc-port", "9100", "-v", "4", "--secure-serving=false"], (9100, 4, False)),
        (["--grpc-port=9100", "-v4", "--secure-serving", "false"], (9100, 4, False)),
    ],
)
def test_go_flag_forms(argv: list[str], expected: tuple[int, int, bool]) -> None:
    args = parse(*argv)
    assert (args.grpc_port, args.v, args.secure_serving) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], ("info", "json")),
        (["--log-format=text", "--log-level=warning"], ("warning", "text")),
        (["--zap-encoder=console"], ("info", "text")),
        (["--log-format=text", "--zap-encoder=json"], ("info", "json")),
        (["-v", "1"], ("warning", "json")),
        (["-v", "2"], ("info", "json")),
        (["-v", "3"], ("info", "json")),
        (["-v", "4"], ("debug", "json")),
        (["--v=5", "--log-level=error"], ("debug", "json")),
        (["--zap-log-level=error", "-v", "5"], ("error", "json")),
        (["--zap-log-level=panic"], ("critical", "json")),
        (["--zap-log-level=4"], ("debug", "json")),
        (["--zap-devel"], ("debug", "text")),
        (["--zap-devel", "--zap-encoder=json", "--zap-log-level=info"], ("info", "json")),
    ],
)
def test_log_settings(argv: list[str], expected: tuple[str, str]) -> None:
    assert compat.log_settings(parse(*argv)) == expected


@pytest.mark.parametrize("bad", ["--zap-log-level=verbose", "--zap-log-level=0", "--zap-encoder=xml", "-v=x"])
def test_bad_logging_flags_are_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(bad)
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--ha-enable-leader-election", "--ha-renew-deadline=20s"],
            "--ha-lease-duration > --ha-renew-deadline",
        ),
        (["--enable-cert-reload=true"], "--enable-cert-reload needs --cert-path"),
        (["--model-server-metrics-port=70000"], "not a port"),
        (["--total-queued-requests-metric=sglang num"], "not a valid metric specification"),
    ],
)
def test_what_epp_cannot_do_is_a_startup_error(argv: list[str], message: str) -> None:
    errors, _ = compat.gie_flag_problems(parse(*argv))
    assert len(errors) == 1 and message in errors[0], errors


def test_gie_defaults_and_false_values_start() -> None:
    argv = [
        f"--{name}=false" for name in sorted(BOOLEANS - {"disable-endpoint-subset-filter", "secure-serving"})
    ]
    errors, notes = compat.gie_flag_problems(parse(*argv, "--model-server-metrics-scheme=http"))
    assert errors == []
    assert {n.split()[0] for n in notes} == {"--health-checking", "--enable-pprof"}


def test_the_docs_table_names_every_gie_flag() -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    table = text[text.index("### GIE flags") : text.index("## 3. Attach a gateway")]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    documented = {f.lstrip("-") for cell in first_cells for f in re.findall(r"`(-[-\w]+)`", cell)}
    assert documented >= set(GIE_FLAGS), set(GIE_FLAGS) - documented
    assert "--drain-timeout" in text


def run_serve(*argv: str) -> subprocess.CompletedProcess[str]:
    """`epp serve` with a GIE flag it refuses: it logs its notes and the error, then exits 2."""
    command = [sys.executable, "-m", "epp", "serve", "--endpoints=127.0.0.1:1", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_zap_encoder_and_verbosity_change_the_real_logs() -> None:
    refused = ["--model-server-metrics-port=70000", "--enable-pprof=false"]
    as_json = run_serve(*refused, "--zap-encoder", "json", "-v", "2")
    assert as_json.returncode == 2
    lines = [json.loads(line) for line in as_json.stderr.splitlines()]
    assert [(r["level"], r["msg"].split(":")[0]) for r in lines] == [
        ("info", "GIE flag"),
        ("error", "cannot start"),
    ]
    assert "--model-server-metrics-port=70000" in lines[1]["msg"] and "not a port" in lines[1]["msg"]

    console = run_serve(*refused, "--zap-encoder=console", "--v=1")  # warnings and errors only
    assert console.returncode == 2
    (line,) = console.stderr.splitlines()
    assert (
        not line.startswith("{")
        and " ERROR " in line
        and "--model-server-metrics-port=70000: not a port" in line
    )


def test_leader_election_needs_a_kubernetes_pool() -> None:
    done = run_serve("--ha-enable-leader-election")
    assert done.returncode == 2
    assert "--ha-enable-leader-election needs a Kubernetes pool" in done.stderr


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [
        (None, "2026-11-25T15:04:05.123+00:00"),
        ("epoch", 1795619045.123),
        ("millis", 1795619045123.0),
        ("nano", 1795619045123000064),
        ("iso8601", "2026-11-25T15:04:05.123Z"),
        ("rfc3339", "2026-11-25T15:04:05Z"),
        ("rfc3339nano", "2026-11-25T15:04:05.123000Z"),
    ],
)
def test_zap_time_encodings(encoding: str | None, expected: object) -> None:
    from epp.observability import logs

    got = logs.encode_time(1795619045.123, encoding)
    if isinstance(expected, float):
        assert got == pytest.approx(expected)
    elif isinstance(expected, int) and encoding == "nano":
        assert isinstance(got, int) and abs(got - expected) < 1000
    else:
        assert got == expected


def test_zap_time_encoding_reaches_the_real_logs() -> None:
    done = run_serve("--model-server-metrics-port=70000", "--zap-time-encoding=nano")
    (line,) = done.stderr.splitlines()
    assert isinstance(json.loads(line)["ts"], int)
    text = run_serve(
        "--model-server-metrics-port=70000", "--zap-time-encoding=rfc3339", "--zap-encoder=console"
    )
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ERROR ", text.stderr), text.stderr


# The epp container's args in GIE v1.5.0's chart (config/charts/epplib/templates/_deployment.yaml),
# per value set: the arguments exactly as rendered (the sglang and trtllm lines keep their quotes).
GIE_CHART_BASE = [
    "--pool-name", "vllm-llama3-8b-instruct", "--pool-namespace", "default",
    "--pool-group", "inference.networking.k8s.io",
]  # fmt: skip
GIE_CHART_TAIL = ["--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml"]


@pytest.mark.parametrize(
    ("name", "argv", "refused"),
    [
        (
            "defaults",
            [*GIE_CHART_BASE, *GIE_CHART_TAIL, "--tracing=false", "--metrics-endpoint-auth=false"],
            None,
        ),
        ("prometheus auth on", [*GIE_CHART_BASE, *GIE_CHART_TAIL, "--tracing=false"], None),
        (
            "tracing on",
            [*GIE_CHART_BASE, *GIE_CHART_TAIL, "--tracing=true", "--metrics-endpoint-auth=false"],
            None,
        ),
        (
            "replicas 2, flags {v: 4}",
            [*GIE_CHART_BASE, *GIE_CHART_TAIL, "--ha-enable-leader-election", "--v", "4", "--tracing=false"],
            None,
        ),
        (
            "standalone (endpoint selector)",
            [
                "--endpoint-selector",
                "app=vllm",
                "--endpoint-target-ports",
                "8000",
                *GIE_CHART_TAIL,
                "--tracing=false",
            ],
            None,
        ),
        (
            "sglang",
            [
                *GIE_CHART_BASE,
                '--total-queued-requests-metric="sglang:num_queue_reqs"',
                '--total-running-requests-metric="sglang:num_running_reqs"',
                '--kv-cache-usage-percentage-metric="sglang:token_usage"',
                '--cache-info-metric="sglang:cache_config_info"',
                *GIE_CHART_TAIL,
                "--tracing=false",
            ],
            None,  # SGLang's names are read for every endpoint, as GIE v1.4 did
        ),
        (
            "trtllm-serve",
            [
                *GIE_CHART_BASE,
                '--model-server-metrics-path="/prometheus/metrics"',
                *GIE_CHART_TAIL,
                "--tracing=false",
            ],
            None,  # the path is honoured (the scraper reads it, quotes as the chart writes them stripped)
        ),
    ],
)
def test_gies_chart_variants(name: str, argv: list[str], refused: str | None) -> None:
    errors, _ = compat.gie_flag_problems(parse(*argv))
    if refused is None:
        assert errors == [], name
    else:
        assert errors and all(refused in e for e in errors), errors


def test_zap_stacktrace_level_adds_the_callers_stack() -> None:
    done = run_serve("--model-server-metrics-port=70000", "--zap-stacktrace-level=error")
    (line,) = done.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "error"
    assert (
        "epp/serve/__init__.py" in record["stacktrace"] and "logging/__init__.py" not in record["stacktrace"]
    )
    plain = json.loads(run_serve("--model-server-metrics-port=70000").stderr.splitlines()[0])
    assert "stacktrace" not in plain
