"""Which API group serves InferenceObjective and InferenceModelRewrite, and a watch on that one.

Both kinds exist in two groups, with the same `v1alpha2` schema:

- `llm-d.ai/v1alpha2`: llm-d Router's (v0.10 and later), where the APIs moved when the Endpoint
  Picker left GIE;
- `inference.networking.x-k8s.io/v1alpha2`: GIE's (v1.5 and earlier), now the legacy group.

llm-d's rule (its `controller_config.go`, PR #1449), kept here per kind: ask the API server's
discovery (`GET /apis/<group>/<version>`, an APIResourceList) which group serves the kind; take
llm-d.ai when it does, else the legacy group; only that group's objects are read. When both
are installed the legacy objects are ignored, and a warning says so (as llm-d's does); reading
the legacy group logs a deprecation note naming the new one. Discovery is allowed to every
authenticated caller (the `system:discovery` ClusterRole), so it needs no RBAC of its own.

One difference, deliberate: llm-d decides once at start-up and never watches a kind whose CRD
was missing then; epp asks again every `recheck` seconds (60 by default) until one group serves
it, so installing the CRDs after epp takes effect without a restart. The group chosen is kept
for the life of the process (as llm-d's), so moving from the legacy group to llm-d.ai needs a
restart once the new CRDs are in (docs/migrate.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
from collections.abc import Callable

import aiohttp

from epp.k8s import connections, watching

log = logging.getLogger(__name__)

LLMD_GROUP = "llm-d.ai"
LEGACY_GROUP = "inference.networking.x-k8s.io"
VERSION = "v1alpha2"
GROUPS = (LLMD_GROUP, LEGACY_GROUP)  # in order of preference (llm-d's)

RECHECK_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class Kind:
    kind: str  # "InferenceObjective"
    plural: str  # "inferenceobjectives"

    def path(self, group: str, namespace: str) -> str:
        return f"/apis/{group}/{VERSION}/namespaces/{namespace}/{self.plural}"


OBJECTIVES = Kind("InferenceObjective", "inferenceobjectives")
MODEL_REWRITES = Kind("InferenceModelRewrite", "inferencemodelrewrites")


async def serves(
    session: aiohttp.ClientSession, connection: connections.Connection, group: str, kind: Kind
) -> bool:
    """Whether the API server serves `kind` in `group`/v1alpha2 (discovery). A 404 is "no";
    other failures raise (`watching.ApiError`, aiohttp errors) for the caller to retry."""
    options = await connection.request_options()
    timeout = aiohttp.ClientTimeout(total=30)
    url = f"{connection.server}/apis/{group}/{VERSION}"
    async with session.get(url, timeout=timeout, **options) as resp:
        body = await resp.read()
        if resp.status == 401:
            connection.unauthorized()
        if resp.status == 404:
            return False
        if resp.status != 200:
            raise watching.ApiError(resp.status, body[:200].decode("utf-8", "replace"))
    resources = json.loads(body).get("resources") or []
    return any(r.get("kind") == kind.kind and r.get("name") == kind.plural for r in resources)


async def choose(
    session: aiohttp.ClientSession, connection: connections.Connection, kind: Kind
) -> str | None:
    """The group to read `kind` from by llm-d's rule, or None when neither serves it."""
    found = [group for group in GROUPS if await serves(session, connection, group, kind)]
    if not found:
        return None
    if len(found) == 2:
        log.warning(
            "both %s.%s and %s.%s are installed: epp reads %s only and IGNORES the %s objects (llm-d's rule)",
            kind.plural,
            LLMD_GROUP,
            kind.plural,
            LEGACY_GROUP,
            LLMD_GROUP,
            LEGACY_GROUP,
        )
    elif found[0] == LEGACY_GROUP:
        log.info(
            "DEPRECATION: %s/%s %s is deprecated; replacement: %s/%s %s",
            LEGACY_GROUP,
            VERSION,
            kind.kind,
            LLMD_GROUP,
            VERSION,
            kind.kind,
        )
    return found[0]


class GroupWatch:
    """Finds the group serving `kind`, then keeps a reflector on it in `namespace` (the caller
    reads `objects` in `on_change`). `run()` until cancelled."""

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        connection: connections.Connection,
        kind: Kind,
        namespace: str,
        on_change: Callable[[], None],
        settings: watching.WatchSettings = watching.DEFAULT_SETTINGS,
        recheck: float = RECHECK_SECONDS,
    ) -> None:
        self.kind = kind
        self.group: str | None = None  # chosen once discovery found one
        self.reflector: watching.Reflector | None = None
        self._session = session
        self._conn = connection
        self._namespace = namespace
        self._on_change = on_change
        self._settings = settings
        self._recheck = recheck

    @property
    def objects(self) -> dict[str, watching.Object]:
        return self.reflector.objects if self.reflector is not None else {}

    async def run(self) -> None:
        delay = self._settings.backoff_initial
        said_missing = False
        while self.group is None:
            try:
                self.group = await choose(self._session, self._conn, self.kind)
            except (aiohttp.ClientError, watching.ApiError, ValueError, TimeoutError) as e:
                log.warning(
                    "discovery of %s: %s: %s; retrying in %.1fs", self.kind.kind, type(e).__name__, e, delay
                )
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self._settings.backoff_max)
                continue
            if self.group is None:
                if not said_missing:
                    said_missing = True
                    log.warning(
                        "%s is not installed (neither %s nor %s/%s): none is read; epp checks "
                        "again every %.0f s (crds/ has both)",
                        self.kind.kind,
                        LLMD_GROUP,
                        LEGACY_GROUP,
                        VERSION,
                        self._recheck,
                    )
                await asyncio.sleep(self._recheck)
        log.info("%s: reading %s/%s in namespace %s", self.kind.kind, self.group, VERSION, self._namespace)
        self.reflector = watching.Reflector(
            session=self._session,
            connection=self._conn,
            path=self.kind.path(self.group, self._namespace),
            on_change=self._on_change,
            settings=self._settings,
            name=f"{self.kind.plural}.{self.group} {self._namespace}",
        )
        await self.reflector.run()
