"""Measurement pieces of `epp bench overhead`: wrk's output, process CPU from /proc, the machine.

Kept apart from the runner (overhead.py, overhead_stream.py) so they are unit-tested alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epp.gateway.envoy import envoy_version

_WRK_JSON = "WRK_JSON "


@dataclasses.dataclass(slots=True)
class WrkResult:
    requests: int
    duration_s: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    socket_errors: dict[str, int]
    non_2xx: int

    @property
    def errors(self) -> int:
        return self.non_2xx + sum(self.socket_errors.values())


_TIME_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_TIME = re.compile(r"^\s*([\d.]+)\s*(us|ms|s|m|h)\s*$")
_PCT_LINE = re.compile(r"^\s*(50|75|90|99)(?:\.0+)?%\s+(\S+)\s*$")
_REQS_LINE = re.compile(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m|h),")
_SOCKET_LINE = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_NON2XX_LINE = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_RPS_LINE = re.compile(r"^Requests/sec:\s+([\d.]+)")


def parse_wrk_time(text: str) -> float:
    """wrk's formatted time ('450.00us', '1.78ms', '1.20s', '2.00m') in milliseconds."""
    match = _TIME.match(text)
    if not match:
        raise ValueError(f"not a wrk time: {text!r}")
    return float(match.group(1)) * _TIME_UNITS_MS[match.group(2)]


def parse_wrk(output: str) -> WrkResult:
    """Parse `wrk --latency` output; exact figures from our Lua done() line win when present."""
    pcts: dict[str, float] = {}
    requests, duration_s, rps, non_2xx = -1, 0.0, 0.0, 0
    socket = {"connect": 0, "read": 0, "write": 0, "timeout": 0}
    exact: dict[str, Any] | None = None
    for line in output.splitlines():
        if line.startswith(_WRK_JSON):
            exact = json.loads(line[len(_WRK_JSON) :])
            continue
        if m := _PCT_LINE.match(line):
            pcts[m.group(1)] = parse_wrk_time(m.group(2))
        elif m := _REQS_LINE.match(line):
            requests = int(m.group(1))
            duration_s = parse_wrk_time(m.group(2) + m.group(3)) / 1e3
        elif m := _SOCKET_LINE.search(line):
            socket = dict(zip(("connect", "read", "write", "timeout"), map(int, m.groups()), strict=True))
        elif m := _NON2XX_LINE.search(line):
            non_2xx = int(m.group(1))
        elif m := _RPS_LINE.match(line):
            rps = float(m.group(1))
    if exact is not None:
        requests = int(exact["requests"])
        duration_s = exact["duration_us"] / 1e6
        rps = requests / duration_s if duration_s else 0.0
        pcts = {"50": exact["p50_us"] / 1e3, "90": exact["p90_us"] / 1e3, "99": exact["p99_us"] / 1e3}
        socket = {k: int(exact[f"{k}_errors"]) for k in ("connect", "read", "write", "timeout")}
        non_2xx = int(exact["status_errors"])
    if requests < 0 or not {"50", "99"} <= pcts.keys():
        raise ValueError("unrecognised wrk output (was --latency given?):\n" + output[-2000:])
    return WrkResult(
        requests=requests,
        duration_s=duration_s,
        rps=rps,
        p50_ms=pcts["50"],
        p90_ms=pcts.get("90", float("nan")),
        p99_ms=pcts["99"],
        socket_errors=socket,
        non_2xx=non_2xx,
    )


def lua_script(body_path: Path) -> str:
    """wrk script: POST the body file; on exit print exact HdrHistogram figures as one JSON line."""
    return f"""\
local f = assert(io.open({json.dumps(str(body_path))}, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{_WRK_JSON}{{"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeout_errors":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d}}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
"""


def chat_body(size: int) -> bytes:
    """An OpenAI chat-completion body of about `size` bytes (at least the fixed fields)."""
    base: dict[str, Any] = {
        "model": "bench-model",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly and precisely."},
            {"role": "user", "content": ""},
        ],
        "max_tokens": 128,
        "temperature": 0.7,
        "top_p": 0.95,
        "stream": False,
        "user": "bench",
    }
    filler = "Summarise the following notes about load balancing for inference servers. "
    overhead = len(json.dumps(base, separators=(",", ":")))
    need = max(0, size - overhead)
    base["messages"][1]["content"] = (filler * (need // len(filler) + 1))[:need]
    return json.dumps(base, separators=(",", ":")).encode()


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        text = f.read()
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    return text[text.rindex(")") + 2 :].split()


def own_cpu_seconds(pid: int) -> float:
    """utime+stime of `pid` alone, in seconds."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime+stime of `pid`, its reaped children and its live descendants, in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(_stat_fields(int(entry))[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total = 0
    stack, first = [pid], True
    while stack:
        p = stack.pop()
        try:
            fields = _stat_fields(p)
        except OSError:
            continue
        # fields[11:13] = utime, stime; [13:15] = cutime, cstime (children already waited for)
        total += int(fields[11]) + int(fields[12])
        if first:
            total += int(fields[13]) + int(fields[14])
            first = False
        stack.extend(children.get(p, []))
    return total / tick


def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        envoy = envoy_version()
    except (OSError, subprocess.SubprocessError):
        envoy = "unknown"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu or platform.processor() or "unknown",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "envoy": envoy,
    }


def wrk_version(wrk: str) -> str:
    try:
        out = subprocess.run([wrk, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    first = (out.stdout or out.stderr).splitlines()
    return first[0].split(" Copyright")[0].strip() if first else "unknown"


def med(values: Sequence[float]) -> float:
    clean = [v for v in values if v == v]  # drop NaN
    return statistics.median(clean) if clean else float("nan")


def fmt(value: float, digits: int = 2) -> str:
    return "n/a" if value != value else f"{value:.{digits}f}"


def value_range(values: Sequence[float], digits: int = 2) -> str:
    clean = [v for v in values if v == v]
    if not clean:
        return "n/a"
    if len(clean) == 1:
        return fmt(clean[0], digits)
    return f"{fmt(med(clean), digits)} ({fmt(min(clean), digits)}-{fmt(max(clean), digits)})"


_BUCKET = re.compile(r'^(\w+)_bucket\{(?:[^}]*,)?le="([^"]+)"[^}]*\} ([0-9.e+-]+)$')


def histogram_buckets(text: str, name: str) -> dict[float, float]:
    """A Prometheus histogram's cumulative bucket counts by upper bound, from /metrics text (the
    series of the one unlabelled histogram `name`)."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        m = _BUCKET.match(line)
        if m and m.group(1) == name:
            out[float(m.group(2))] = float(m.group(3))
    return out


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> tuple[float, int]:
    """The upper bound of the bucket holding quantile `q` of what was observed between two reads
    of a histogram (`histogram_buckets`), and how many observations that was. The bound is all a
    histogram can tell: "p99 <= 2 ms" reads as a bound of 0.002."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return float("nan"), 0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= q * total:
            return bound, int(total)
    return float("inf"), int(total)
