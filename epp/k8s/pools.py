"""From an InferencePool and its pods to endpoint specs: pure functions, no I/O.

InferencePool `inference.networking.k8s.io/v1` (GIE's API, GA since v1.0):

- `spec.selector.matchLabels`: the model-server pods, in the pool's namespace (only matchLabels);
- `spec.targetPorts: [{number}]`, 1-8 unique ports: each is one endpoint `podIP:port` per pod, a
  data-parallel rank; the endpoint is named `<pod>-rank-<index>` and its rank is that index;
- `spec.appProtocol`: `http` (default) or `kubernetes.io/h2c`. epp routes both the same way
  (Envoy speaks to the pod); it is kept for logs.

A pod becomes endpoints only when it matches the selector, is Ready (condition `Ready=True`), has
a pod IP and no `deletionTimestamp` (terminating), as GIE does. GIE's pod annotation
`inference.networking.k8s.io/active-ports` (comma-separated port numbers) limits which of the
target ports a pod serves; ranks keep the index in `targetPorts`.

epp's own annotations, on the pod (wins) or on the InferencePool (default for all its pods):

- `epp.dev/model`: the base model served (seeds KV block keys, as `model:` in an endpoints file);
- `epp.dev/kv-events-port`: the port of vLLM's KV-event publisher for rank 0; rank i publishes on
  port + i (vLLM offsets data-parallel ranks so), giving `tcp://<podIP>:<port + rank>`. Absent:
  epp's `--kv-events-port` default applies;
- `epp.dev/kv-replay-port`: the same for the replay endpoint (absent: `--kv-replay-port`).

Pool-less mode (GIE's `--endpoint-selector k=v,k2=v2 --endpoint-target-ports 8000,8001`) builds
the same `PoolSpec` from flags instead of an object.

A bad annotation value is reported (returned as a problem for the caller to log) and ignored; a
bad pool (no selector, no or bad target ports) raises `ValueError`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from epp.datastore import endpoints

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
PLURAL = "inferencepools"

MODEL_ANNOTATION = "epp.dev/model"
KV_EVENTS_PORT_ANNOTATION = "epp.dev/kv-events-port"
KV_REPLAY_PORT_ANNOTATION = "epp.dev/kv-replay-port"
ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"

MAX_TARGET_PORTS = 8

_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def pools_path(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """What decides a pool's endpoints."""

    selector: Mapping[str, str]
    target_ports: tuple[int, ...]
    app_protocol: str = "http"
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.selector:
            raise ValueError("the selector is empty (it would select every pod)")
        for k, v in self.selector.items():
            if not _LABEL_KEY.fullmatch(k) or not _LABEL_VALUE.fullmatch(v):
                raise ValueError(f"bad selector label {k}={v}")
        if not 1 <= len(self.target_ports) <= MAX_TARGET_PORTS:
            raise ValueError(f"needs 1-{MAX_TARGET_PORTS} target ports, got {len(self.target_ports)}")
        if len(set(self.target_ports)) != len(self.target_ports):
            raise ValueError(f"target ports repeat: {list(self.target_ports)}")
        for port in self.target_ports:
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ValueError(f"target port {port!r} is not in 1-65535")

    @property
    def label_selector(self) -> str:
        """The selector as the API's `labelSelector` query parameter."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))


def parse_pool(obj: Mapping[str, Any]) -> PoolSpec:
    """The PoolSpec of an InferencePool object; ValueError says what is wrong."""
    spec = obj.get("spec") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    if not isinstance(selector, Mapping):
        raise ValueError("spec.selector.matchLabels is not a mapping")
    ports = []
    for item in spec.get("targetPorts") or []:
        number = item.get("number") if isinstance(item, Mapping) else None
        if not isinstance(number, int):
            raise ValueError(f"spec.targetPorts has an entry without a number: {item!r}")
        ports.append(number)
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return PoolSpec(
        selector={str(k): str(v) for k, v in selector.items()},
        target_ports=tuple(ports),
        app_protocol=str(spec.get("appProtocol") or "http"),
        annotations=dict(annotations),
    )


def parse_selector(text: str) -> dict[str, str]:
    """GIE's `--endpoint-selector`: `k=v,k2=v2` (equality only)."""
    selector: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key:
            raise ValueError(f"endpoint selector {text!r}: {item!r} is not key=value")
        selector[key.strip()] = value.strip()
    return selector


def parse_target_ports(text: str) -> tuple[int, ...]:
    """GIE's `--endpoint-target-ports`: `8000[,8001...]`."""
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise ValueError(f"target ports {text!r}: expected comma-separated port numbers") from None


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Ready=True, a pod IP, and not terminating."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _port_annotation(
    key: str, pod_ann: Mapping[str, str], pool: PoolSpec, where: str, problems: list[str]
) -> int | None:
    value = pod_ann.get(key, pool.annotations.get(key))
    if value is None:
        return None
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535 - MAX_TARGET_PORTS:
        problems.append(f"{where}: annotation {key}={value!r} is not a port; ignored")
        return None
    return port


def pod_endpoints(
    pod: Mapping[str, Any], pool: PoolSpec, problems: list[str]
) -> list[endpoints.EndpointSpec]:
    """The endpoints of one pod (none unless it is ready and selected); problems are appended."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if not matches(pool.selector, labels) or not is_ready(pod):
        return []
    name = meta["name"]
    ann = meta.get("annotations") or {}
    ip = pod["status"]["podIP"]
    host = f"[{ip}]" if ":" in ip else ip
    where = f"pod {name}"
    model = str(ann.get(MODEL_ANNOTATION, pool.annotations.get(MODEL_ANNOTATION, ""))).strip()
    events_port = _port_annotation(KV_EVENTS_PORT_ANNOTATION, ann, pool, where, problems)
    replay_port = _port_annotation(KV_REPLAY_PORT_ANNOTATION, ann, pool, where, problems)
    active: set[int] | None = None
    if ACTIVE_PORTS_ANNOTATION in ann:
        try:
            active = {int(p) for p in str(ann[ACTIVE_PORTS_ANNOTATION]).split(",") if p.strip()}
        except ValueError:
            problems.append(
                f"{where}: annotation {ACTIVE_PORTS_ANNOTATION}={ann[ACTIVE_PORTS_ANNOTATION]!r} "
                "is not a list of ports; all target ports are used"
            )
    specs = []
    for rank, port in enumerate(pool.target_ports):
        if active is not None and port not in active:
            continue
        specs.append(
            endpoints.EndpointSpec(
                name=f"{name}-rank-{rank}",
                address=ip,
                port=port,
                rank=rank,
                pod=name,
                labels=dict(labels),
                model=model,
                kv_events=None if events_port is None else f"tcp://{host}:{events_port + rank}",
                kv_replay=None if replay_port is None else f"tcp://{host}:{replay_port + rank}",
                namespace=str(meta.get("namespace") or ""),
                hostname=str((pod.get("spec") or {}).get("hostname") or ""),
                node_address=str(pod["status"].get("hostIP") or ""),
            )
        )
    return specs


def pool_endpoints(
    pods: Iterable[Mapping[str, Any]], pool: PoolSpec
) -> tuple[list[endpoints.EndpointSpec], list[str]]:
    """(endpoints sorted by name, problems found) for a pool's candidate pods."""
    problems: list[str] = []
    specs = [spec for pod in pods for spec in pod_endpoints(pod, pool, problems)]
    specs.sort(key=lambda s: s.name)
    return specs, problems
