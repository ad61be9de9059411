"""Cost per watch event: epp's reflector against kubernetes_asyncio's Watch (a script, not a test).

    .venv/bin/python tests/k8s/bench_watch.py [--events 2000]

Each arm parses the same JSON lines (MODIFIED events of a vLLM pod as a real API server sends
it, managedFields included) and applies them as its consumer would:
- reflector: `watching.Reflector._apply` (json.loads, a dict in the cache);
- library typed: `Watch.unmarshal_event(line, "V1Pod")`, what `Watch().stream(CoreV1Api.
  list_namespaced_pod, ...)` does per line (the object becomes a V1Pod model);
- library dict: `unmarshal_event(line, "object")`, as for custom objects (InferencePool).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any


def pod_event(i: int) -> bytes:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"vllm-{i % 50}",
            "namespace": "default",
            "uid": f"0b6c5f0e-{i:08d}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "vllm", "pod-template-hash": "5d8f7c9b4"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "vllm-5d8f7c9b4",
                    "uid": "u",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-01-01T00:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {f"f:k{j}": {} for j in range(30)}},
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "subresource": "status",
                    "time": "2026-01-01T00:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {f"f:s{j}": {} for j in range(30)}},
                },
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.32.0",
                    "args": ["--model", "Qwen/Qwen3-0.6B", "--port", "8000", "--kv-events-config", "{}"],
                    "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
                    "env": [{"name": f"E{j}", "value": str(j)} for j in range(8)],
                    "resources": {
                        "limits": {"cpu": "8", "memory": "32Gi"},
                        "requests": {"cpu": "8", "memory": "32Gi"},
                    },
                    "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5},
                    "volumeMounts": [{"name": "cache", "mountPath": "/root/.cache"}],
                }
            ],
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "nodeName": "node-1",
            "serviceAccountName": "default",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.0.{i % 250}.{i % 200}",
            "podIPs": [{"ip": f"10.0.{i % 250}.{i % 200}"}],
            "hostIP": "192.168.0.1",
            "startTime": "2026-01-01T00:00:00Z",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "ready": True,
                    "restartCount": 0,
                    "image": "vllm/vllm-openai:v0.32.0",
                    "imageID": "sha256:abc",
                    "containerID": "containerd://abc",
                    "started": True,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                }
            ],
        },
    }
    return json.dumps({"type": "MODIFIED", "object": pod}).encode()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    lines = [pod_event(i) for i in range(args.events)]

    import aiohttp
    from kubernetes_asyncio.watch import Watch

    from epp.k8s import connections, watching

    async with aiohttp.ClientSession() as session:
        reflector = watching.Reflector(
            session=session,
            connection=connections.Connection("http://127.0.0.1:1"),
            path="/api/v1/namespaces/default/pods",
            on_change=lambda: None,
        )

        def ours() -> None:
            for line in lines:
                reflector._apply(json.loads(line))

        watch = Watch()

        def typed() -> None:
            for line in lines:
                watch.unmarshal_event(line.decode(), "V1Pod")

        def plain() -> None:
            for line in lines:
                watch.unmarshal_event(line.decode(), "object")

        print(f"{args.events} MODIFIED pod events, {len(lines[0])} bytes each; best of 5 runs")
        for name, fn in (
            ("epp reflector", ours),
            ("kubernetes_asyncio V1Pod", typed),
            ("kubernetes_asyncio dict", plain),
        ):
            best = min(_timed(fn) for _ in range(5))
            print(f"  {name:26s} {best / args.events * 1e6:8.1f} us/event")
        await watch.close()


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    asyncio.run(main())
