"""A soak: hours of steady load through real Envoy, two epp replicas and `epp sim` pods, with faults.

    python -m epp.bench.soak --duration 3600 --rate 20 --out /tmp/soak   (under `nice -n 10`)

Topology (every process on 127.0.0.1, every port free at start):

    client (this process) ──► Envoy ──ext_proc──► epp A, epp B (same endpoints file, KV events on)
                                 └──► `epp sim` pod processes (one each, so a pod can be killed)

Between epp and each pod this process puts two things it can break on schedule, so that faults
are what the issue names and nothing else:

* a /metrics proxy per pod (the endpoints file's `metricsPort`): `scrape_hang` makes every pod's
  /metrics hang (no answer) for the fault's duration: the "all metrics hung" blackout;
* a ZMQ forwarder per pod (its `kvEvents`): `publisher_drop` closes one pod's forwarder (epp's
  subscription loses its peer and the events sent meanwhile), then binds it again.

The other two faults act on processes: `pod_kill` SIGKILLs one pod and restarts it on the same
ports (cold cache) after the fault's duration; `epp_sigterm` SIGTERMs epp B and restarts it.
Envoy health-checks both replicas, so it stops sending to the one that is gone.

Faults rotate in that order every `--fault-every` seconds after the warm-up. A fault's window runs
from its start until what it broke is back (the restarted process answers, or the fault is
lifted), plus `--grace` seconds; a request that overlapped a window counts against that fault
(one in flight at a pod's kill fails too), every other failed request is *lost*. The report
(`report.json`, `report.md` in `--out`) has: requests and errors, in and out of fault windows;
p50/p99 per interval and the p99 drift (last interval over the first after warm-up); each epp's
RSS slope after warm-up (MB/min, least squares; epp A is never restarted); and per fault the
recovery time (see `report.Observations.recovery`).

`--tracemalloc SECONDS` runs epp A under tracemalloc and has it dump a snapshot that often
into `--out` (`tracemalloc-<pid>-<n>.bin`), to diff with `python -m epp.bench.soak --diff A B`.

Modules: `config` (SoakConfig, Record, Fault, the fault schedule), `pods`, `faults` (the
breakable pieces and the injector), `run` (Soak), `report` (report.json and report.md),
`memtrace` (--tracemalloc, --diff) and `cli` (`python -m epp.bench.soak`).
"""

from epp.bench.soak.config import FAULTS, MODEL, Fault, Record, SoakConfig, fault_schedule
from epp.bench.soak.report import parse_series, render
from epp.bench.soak.run import Soak

__all__ = [
    "FAULTS",
    "MODEL",
    "Fault",
    "Record",
    "Soak",
    "SoakConfig",
    "fault_schedule",
    "parse_series",
    "render",
]
