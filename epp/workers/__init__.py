"""`epp serve --workers N`: one pod, several worker processes sharing the ext-proc port.

- `cpus`: how many cores this process may use (cgroup v2 cpu.max / v1 CFS quota, affinity), the
  `--workers auto` default.
- `supervisor`: the parent process. It owns the pod-level ports and duties (the health port, the
  metrics port with one aggregated /metrics, the Lease, bind-mode KV events) and starts, restarts
  and drains the workers.
- `worker`: what `epp serve` does differently when a supervisor started it.
- `merge`: folding the workers' metric registries into one exposition.

docs/architecture.md#process-model says why it is built this way.
"""
