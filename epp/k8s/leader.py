"""Active-passive leader election through a coordination.k8s.io/v1 Lease, as GIE's EPP does it.

GIE's `--ha-enable-leader-election` runs controller-runtime's elector (client-go's leaderelection)
on the Lease `epp-<namespace>-<pool>.gateway-api-inference-extension.sigs.k8s.io` in the pool's
namespace, and only the leader reports SERVING on readiness. This is the same protocol on the same
Lease, so epp replicas (or an epp and a GIE EPP during a migration) agree on one leader:

- Every `retry_period` each candidate reads the Lease. One that does not exist is created with us
  as holder (201: we lead; 409: someone was faster). One held by another identity is taken over
  only when it has expired: `leaseDurationSeconds` after we last *saw it change* (our clock, not
  the holder's renewTime: clocks differ across nodes, as client-go reasons). Every write carries
  the resourceVersion read, so of two candidates only one wins (the other gets 409).
- The leader renews every `retry_period`. If it cannot renew for `renew_deadline` it stops
  leading at once (readiness NOT_SERVING), before its Lease can expire and a follower take over,
  so two leaders never serve together. (GIE's process exits there; epp stays up as a follower
  and keeps trying, which changes nothing for the pool.)
- On shutdown the leader releases the Lease (holder cleared, duration 1 s: client-go's
  ReleaseOnCancel, which GIE sets), so a follower takes over within one `retry_period` instead
  of a lease duration.

Defaults are controller-runtime's: lease 15 s, renew deadline 10 s, retry period 2 s.
RBAC: get, create, update on leases (coordination.k8s.io) in the pool's namespace.

Why not kubernetes_asyncio's `leaderelection` (36.x): it cannot release the Lease on shutdown
(there is no ReleaseOnCancel, so a follower would wait a whole lease duration after every
rollout), its `acquire` only returns once leading (no way to stop a follower but cancelling it
mid-request), and its LeaseLock writes local naive timestamps with a "Z" suffix, so on a node
whose clock is not in UTC its renewTime disagrees with the GIE EPP sharing the Lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp

from epp import tasks
from epp.k8s import connections

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0


def lease_name(namespace: str, name: str) -> str:
    """GIE's Lease name for the EPP of pool (or, pool-less, Deployment) `name` in `namespace`."""
    return f"epp-{namespace}-{name}.gateway-api-inference-extension.sigs.k8s.io"


def deployment_name(pod_name: str) -> str:
    """The Deployment of a pod named <deployment>-<replicaset hash>-<pod hash> (GIE's pool-less id)."""
    parts = pod_name.rsplit("-", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"cannot tell the Deployment from the pod name {pod_name!r} (POD_NAME)")
    return parts[0]


def default_identity() -> str:
    """client-go's: the host (the pod's name in a cluster) and a random suffix, unique per process."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4()}"


def _rbac_hint(status: int) -> str:
    return " (RBAC: epp needs get, create, update on leases)" if status == 403 else ""


def _micro_time(now: datetime.datetime | None = None) -> str:
    # metav1.MicroTime: RFC 3339 with microseconds.
    return (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class Timing:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                "leader election needs lease duration > renew deadline > retry period > 0, got "
                f"{self.lease_duration}s, {self.renew_deadline}s, {self.retry_period}s"
            )


class LeaderElector:
    """Campaign for one Lease until stopped; `leading` says whether we hold it right now."""

    def __init__(
        self,
        connection: connections.Connection,
        *,
        namespace: str,
        name: str,
        identity: str | None = None,
        timing: Timing | None = None,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.connection = connection
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.timing = timing or Timing()
        self.leading = False
        self._on_change = on_change
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        # What we last read, and when (monotonic) we saw its spec change: expiry is judged from
        # that, never from the holder's own timestamps.
        self._observed_spec: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0
        self._changed = asyncio.Event()

    @property
    def url(self) -> str:
        return (
            f"{self.connection.server}/apis/coordination.k8s.io/v1/namespaces/"
            f"{self.namespace}/leases/{self.name}"
        )

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()
        self._task = tasks.create_guarded_task(self._run(), name=f"leader election {self.name}", logger=log)

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning; a leader hands the Lease back (`release`) so a follower need not wait."""
        if self._task is not None:
            await tasks.cancel_and_wait([self._task])
            self._task = None
        try:
            if release and self.leading:
                await self._release()
        finally:
            self._set_leading(False)
            if self._session is not None:
                await self._session.close()
                self._session = None

    async def wait_changed(self) -> bool:
        """Wait for the next change of `leading` and return the new value."""
        changed = self._changed
        await changed.wait()
        return self.leading

    # -- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                won = await self._try_acquire_or_renew()
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.warning("leader election: lease %s: %s", self.name, exc)
                won = False
            now = loop.time()
            if won:
                self._last_renew = now
                self._set_leading(True)
            elif self.leading and now - self._last_renew >= self.timing.renew_deadline:
                log.error(
                    "leader election: could not renew lease %s for %.0fs; no longer leading",
                    self.name,
                    now - self._last_renew,
                )
                self._set_leading(False)
            elif self.leading:
                pass  # a failed renewal within the deadline: keep leading, retry
            await asyncio.sleep(self.timing.retry_period)

    def _set_leading(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        log.info(
            "leader election: %s lease %s as %s",
            "acquired" if leading else "gave up",
            self.name,
            self.identity,
            extra={"leader": leading},
        )
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if self._on_change is not None:
            self._on_change(leading)

    async def _try_acquire_or_renew(self) -> bool:
        """One round: True if we hold the Lease afterwards."""
        status, lease = await self._request("GET")
        now = datetime.datetime.now(datetime.UTC)
        if status == 404:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, transitions=0, acquired=now),
            }
            status, _ = await self._request("POST", body, url=self.url.rsplit("/", 1)[0])
            return self._written(status, "create")
        if status != 200 or lease is None:
            raise ValueError(f"get lease: HTTP {status}{_rbac_hint(status)}")
        spec = lease.get("spec") or {}
        monotonic = time.monotonic()
        if spec != self._observed_spec:
            self._observed_spec, self._observed_at = spec, monotonic
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration)
        expired = monotonic - self._observed_at >= duration
        if holder and holder != self.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquired_text = spec.get("acquireTime")
            new_spec = self._spec(now, transitions=transitions, acquired=None)
            if acquired_text:
                new_spec["acquireTime"] = acquired_text
        else:
            new_spec = self._spec(now, transitions=transitions + 1, acquired=now)
        lease["spec"] = new_spec  # metadata (with resourceVersion) as read: a stale write gets 409
        status, _ = await self._request("PUT", lease)
        won = self._written(status, "update")
        if won:
            self._observed_spec, self._observed_at = new_spec, time.monotonic()
        return won

    def _spec(
        self, now: datetime.datetime, *, transitions: int, acquired: datetime.datetime | None
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.timing.lease_duration),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }
        if acquired is not None:
            spec["acquireTime"] = _micro_time(acquired)
        return spec

    def _written(self, status: int, what: str) -> bool:
        if status in (200, 201):
            return True
        if status == 409:
            return False  # another candidate wrote first
        raise ValueError(f"{what} lease: HTTP {status}{_rbac_hint(status)}")

    async def _release(self) -> None:
        try:
            status, lease = await self._request("GET")
            if (
                status != 200
                or lease is None
                or (lease.get("spec") or {}).get("holderIdentity") != self.identity
            ):
                return
            now = datetime.datetime.now(datetime.UTC)
            spec = lease["spec"]
            lease["spec"] = {
                "leaseDurationSeconds": 1,
                "renewTime": _micro_time(now),
                "acquireTime": _micro_time(now),
                "leaseTransitions": int(spec.get("leaseTransitions") or 0),
            }
            status, _ = await self._request("PUT", lease)
            if status == 200:
                log.info("leader election: released lease %s", self.name)
            else:
                log.warning("leader election: releasing lease %s: HTTP %d", self.name, status)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("leader election: releasing lease %s: %s", self.name, exc)

    async def _request(
        self, method: str, body: dict[str, Any] | None = None, *, url: str | None = None
    ) -> tuple[int, dict[str, Any] | None]:
        if self._session is None:
            raise RuntimeError("LeaderElector not started")
        kwargs: dict[str, Any] = {"timeout": aiohttp.ClientTimeout(total=TIMEOUT_S)}
        if body is not None:
            kwargs["data"] = json.dumps(body)
        kwargs.update(
            await self.connection.request_options(content_type="application/json" if body else None)
        )
        async with self._session.request(method, url or self.url, **kwargs) as resp:
            if resp.status == 401:
                self.connection.unauthorized()
            if resp.status not in (200, 201):
                await resp.read()
                return resp.status, None
            loaded = await resp.json()
            return resp.status, loaded if isinstance(loaded, dict) else None
