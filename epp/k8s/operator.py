"""The InferencePool operator: keeps the datastore's endpoints equal to a pool's ready pods.

Two modes, as GIE's EPP:

- **pool** (`--pool-name`, `--pool-namespace`): a reflector on the InferencePool object (field
  selector `metadata.name=<pool>`) and, once its selector is known, a reflector on the pods
  matching it (server-side `labelSelector`). A selector edit restarts the pod reflector with the
  new selector (a fresh list); a targetPorts or annotation edit only re-derives the endpoints.
  A deleted pool clears its endpoints (logged); a re-created one brings them back. An invalid
  pool edit is logged, posted as a Warning Event `InvalidPoolSpec` on the pool (once per
  resourceVersion: `_on_pool_change` parses each version once) and the last good spec stays in
  force.
- **pool-less** (`--endpoint-selector`, `--endpoint-target-ports`): only the pod reflector, with
  a fixed `PoolSpec`.

Every change from either reflector re-derives the whole endpoint set (`pools.pool_endpoints`,
sorted) and, when it differs from the last one, replaces the source's endpoints with
`Datastore.sync("k8s:<namespace>/<pool>", ...)`. Events reach the datastore as soon as they
arrive on the watch (there is no batching window).

InferenceObjectives and InferenceModelRewrites (pool mode, when given an
`objectives.ObjectiveStore` / a `ModelRewriteStore`): one watch each on the namespace's objects,
in the API group llm-d's rule picks (`groups`: llm-d.ai, else the legacy
inference.networking.x-k8s.io); every change replaces the store's contents with those naming
our pool (`objectives.priorities`, `rewrites.rewrites`). They do not gate readiness: without the
CRDs (or RBAC for them) every request keeps priority 0 and its model name.

Readiness: `wait_synced()` returns once endpoints were derived from a listed pool and a listed
set of pods; while the pool does not exist, it does not return (GIE's EPP is not ready then).
`ready` is the live state: it turns False when the pool is deleted (or was never valid) and True
again once a valid pool's pods are listed; `reason` says why it is False, and `readiness()`
yields each transition (`epp serve` sets gRPC health from it). Each transition is logged once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import aiohttp

from epp import tasks
from epp.datastore import endpoints
from epp.datastore.model_rewrites import ModelRewriteStore
from epp.k8s import connections, events, groups, objectives, pools, rewrites, watching

log = logging.getLogger(__name__)


class PoolOperator:
    """Feeds one datastore source from the Kubernetes API. `start()`, then `stop()`."""

    def __init__(
        self,
        datastore: endpoints.Datastore,
        *,
        connection: connections.Connection,
        namespace: str,
        pool_name: str | None = None,
        pool: pools.PoolSpec | None = None,
        settings: watching.WatchSettings = watching.DEFAULT_SETTINGS,
        objective_store: objectives.ObjectiveStore | None = None,
        rewrite_store: ModelRewriteStore | None = None,
        recheck: float = groups.RECHECK_SECONDS,
    ) -> None:
        if (pool_name is None) == (pool is None):
            raise ValueError("give exactly one of pool_name (a pool object) or pool (pool-less mode)")
        self._datastore = datastore
        self._conn = connection
        self.namespace = namespace
        self.pool_name = pool_name
        self.source = f"k8s:{namespace}/{pool_name or 'selector:' + pool.label_selector}"  # type: ignore[union-attr]
        self._settings = settings
        self._pool: pools.PoolSpec | None = pool
        self._pool_rv: str | None = None  # of the pool object last parsed (good or bad)
        self._pool_reflector: watching.Reflector | None = None
        self._pods: watching.Reflector | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._last: list[endpoints.EndpointSpec] | None = None
        self._problems: set[str] = set()
        self._synced = asyncio.Event()
        self._objective_store = objective_store
        self._objectives: groups.GroupWatch | None = None
        self._objective_problems: set[str] = set()
        self._rewrite_store = rewrite_store
        self._rewrites: groups.GroupWatch | None = None
        self._rewrite_problems: set[str] = set()
        self._recheck = recheck
        self._ready = False
        self.reason = "not listed yet"
        """Why the source is not ready (meaningless while `ready`)."""
        self._ready_changed = asyncio.Event()  # replaced on each transition
        self._event_tasks: set[asyncio.Task[bool]] = set()

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._session is not None:
            return
        self._session = aiohttp.ClientSession()
        if self.pool_name is None:
            self._start_pods()
            return
        self._pool_reflector = watching.Reflector(
            session=self._session,
            connection=self._conn,
            path=pools.pools_path(self.namespace),
            field_selector=f"metadata.name={self.pool_name}",
            on_change=self._on_pool_change,
            settings=self._settings,
            name=f"inferencepool {self.namespace}/{self.pool_name}",
        )
        self._spawn("pool", self._pool_reflector.run(), self._pool_reflector.name)
        if self._objective_store is not None:
            self._objectives = self._group_watch(groups.OBJECTIVES, self._on_objectives_change)
            self._spawn("objectives", self._objectives.run(), "inferenceobjectives")
        if self._rewrite_store is not None:
            self._rewrites = self._group_watch(groups.MODEL_REWRITES, self._on_rewrites_change)
            self._spawn("rewrites", self._rewrites.run(), "inferencemodelrewrites")

    def _group_watch(self, kind: groups.Kind, on_change: Callable[[], None]) -> groups.GroupWatch:
        assert self._session is not None
        return groups.GroupWatch(
            session=self._session,
            connection=self._conn,
            kind=kind,
            namespace=self.namespace,
            on_change=on_change,
            settings=self._settings,
            recheck=self._recheck,
        )

    async def stop(self) -> None:
        running, self._tasks = [*self._tasks.values(), *self._event_tasks], {}
        self._event_tasks = set()
        await tasks.cancel_and_wait(running)
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    @property
    def synced(self) -> bool:
        """Endpoints were derived at least once (stays True; see `ready` for the live state)."""
        return self._synced.is_set()

    @property
    def ready(self) -> bool:
        """The pool exists, has a valid spec (now or before) and its pods are listed."""
        return self._ready

    async def readiness(self) -> AsyncIterator[bool]:
        """The current readiness, then each change of it (a state that flipped back while the
        consumer was busy is skipped: only the latest state matters)."""
        last: bool | None = None
        while True:
            changed = self._ready_changed  # taken before reading the state: no change is missed
            if self._ready != last:
                last = self._ready
                yield last
            else:
                await changed.wait()

    def _set_ready(self, ready: bool, reason: str = "") -> None:
        if not ready and (reason != self.reason or self._ready):
            log.warning("%s: not ready: %s (health NOT_SERVING, requests get 503)", self.source, reason)
        if not ready:
            self.reason = reason
        self._datastore.set_unavailable(self.source, None if ready else reason)
        if ready == self._ready:
            return
        self._ready = ready
        if ready:
            log.info("%s: ready with %d endpoints", self.source, len(self._last or []))
        changed, self._ready_changed = self._ready_changed, asyncio.Event()
        changed.set()

    def _spawn(self, key: str, loop: Coroutine[Any, Any, None], name: str) -> None:
        old = self._tasks.pop(key, None)
        if old is not None:
            old.cancel()  # the guard keeps it referenced until its cancellation completes
        self._tasks[key] = tasks.create_guarded_task(loop, name=f"watch {name}", logger=log)

    def _start_pods(self) -> None:
        assert self._session is not None and self._pool is not None
        selector = self._pool.label_selector
        self._pods = watching.Reflector(
            session=self._session,
            connection=self._conn,
            path=pools.pods_path(self.namespace),
            label_selector=selector,
            on_change=self._on_pods_change,
            settings=self._settings,
            name=f"pods {self.namespace} {selector}",
        )
        self._spawn("pods", self._pods.run(), self._pods.name)

    def _stop_pods(self) -> None:
        task = self._tasks.pop("pods", None)
        if task is not None:
            task.cancel()
        self._pods = None

    # -- reactions ------------------------------------------------------------------------------

    def _on_pool_change(self) -> None:
        reflector = self._pool_reflector
        if reflector is None:
            return
        obj = reflector.objects.get(self.pool_name or "")
        where = f"InferencePool {self.namespace}/{self.pool_name}"
        if obj is None:
            if self._pool is not None:
                self._set_ready(False, f"{where} is gone: removed its {len(self._last or [])} endpoints")
            elif self._pool_rv != "":  # not yet seen, or never valid: no endpoints to remove
                self._set_ready(False, f"{where} does not exist")
            self._pool = None
            self._pool_rv = ""
            self._stop_pods()
            if self._last:
                self._publish([])
            return
        rv = obj.get("metadata", {}).get("resourceVersion")
        if rv == self._pool_rv:
            return
        self._pool_rv = rv
        try:
            spec = pools.parse_pool(obj)
        except ValueError as e:
            if self._pool is None:
                self._set_ready(False, f"{where} is invalid: {e}")
            else:
                log.error("%s (resourceVersion %s) is invalid: %s; keeping the last good spec", where, rv, e)
            self._post_event(obj, "InvalidPoolSpec", f"epp ignores this version of the pool: {e}")
            return
        old, self._pool = self._pool, spec
        if old is None or old.selector != spec.selector:
            log.info(
                "InferencePool %s/%s: selector %s, target ports %s, appProtocol %s",
                self.namespace,
                self.pool_name,
                spec.label_selector,
                ",".join(map(str, spec.target_ports)),
                spec.app_protocol,
            )
            self._start_pods()  # a new selector needs a new list; the current endpoints stand till then
        else:
            if old.target_ports != spec.target_ports:
                log.info(
                    "InferencePool %s/%s: target ports %s",
                    self.namespace,
                    self.pool_name,
                    ",".join(map(str, spec.target_ports)),
                )
            self._derive()

    def _on_objectives_change(self) -> None:
        watch, store = self._objectives, self._objective_store
        if watch is None or store is None or self.pool_name is None:
            return
        found, problems = objectives.priorities(watch.objects.values(), self.pool_name)
        self._objective_problems = self._log_new(problems, self._objective_problems)
        if found != store.snapshot():
            store.replace(found)
            log.info(
                "%s: %d InferenceObjectives (%s)",
                self.source,
                len(found),
                ", ".join(f"{name}={priority}" for name, priority in sorted(found.items())),
            )

    def _on_rewrites_change(self) -> None:
        watch, store = self._rewrites, self._rewrite_store
        if watch is None or store is None or self.pool_name is None:
            return
        found, problems = rewrites.rewrites(watch.objects.values(), self.pool_name)
        self._rewrite_problems = self._log_new(problems, self._rewrite_problems)
        if tuple(sorted(found, key=lambda r: (r.created, r.name))) != store.rewrites:
            store.replace(found)
            log.info(
                "%s: %d InferenceModelRewrites (%s)",
                self.source,
                len(found),
                ", ".join(r.name for r in store.rewrites),
            )

    def _log_new(self, problems: list[str], logged: set[str]) -> set[str]:
        """Log the problems not logged at the previous change; the set to pass next time."""
        for problem in problems:
            if problem not in logged:
                log.warning("%s: %s", self.source, problem)
        return set(problems)

    def _on_pods_change(self) -> None:
        self._derive()

    def _derive(self) -> None:
        pods_reflector = self._pods
        if self._pool is None or pods_reflector is None or not pods_reflector.synced:
            return
        specs, problems = pools.pool_endpoints(pods_reflector.objects.values(), self._pool)
        for problem in problems:
            if problem not in self._problems:
                log.warning("%s: %s", self.source, problem)
        self._problems = set(problems)
        if specs != self._last:
            self._publish(specs)
        self._synced.set()
        self._set_ready(True)

    def _post_event(self, obj: watching.Object, reason: str, message: str) -> None:
        assert self._session is not None
        involved = events.reference(obj, api_version=f"{pools.GROUP}/{pools.VERSION}", kind="InferencePool")
        involved.setdefault("namespace", self.namespace)
        post = events.post(
            session=self._session, connection=self._conn, involved=involved, reason=reason, message=message
        )
        task = tasks.create_guarded_task(post, name=f"event {reason}", logger=log, eternal=False)
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)

    def _publish(self, specs: list[endpoints.EndpointSpec]) -> None:
        self._last = specs
        added, removed = self._datastore.sync(self.source, specs)
        if added or removed:
            log.info(
                "%s: %d endpoints (%d added, %d removed)", self.source, len(specs), len(added), len(removed)
            )
