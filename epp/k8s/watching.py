"""List-then-watch one kind of object in one namespace, keeping a local copy (a reflector).

Protocol (the Kubernetes API's, as client-go's reflector speaks it):

1. **List** `GET <path>?labelSelector=..&fieldSelector=..&limit=N` (following `continue` tokens).
   The list's `metadata.resourceVersion` is the point the cache is consistent at. The local
   copy is *replaced* by the list, so objects deleted while we were not watching disappear.
2. **Watch** `GET <path>?watch=true&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=T`:
   a stream of JSON lines `{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}`. Every
   event (bookmarks too) advances RV. When the server ends the stream (timeoutSeconds, an API
   server restart, a dropped connection) the watch resumes from the last RV, without a list.
3. **410 Gone** (an ERROR event with code 410, or an HTTP 410): the server no longer has history
   back to RV. Nothing can be resumed: list again (step 1).

Errors (connection refused, 5xx, 401/403, unparseable lines) are logged and retried after an
exponential, jittered backoff (0.2 s doubling to 30 s), which resets once a watch makes progress.
A watch that makes none (ends at once without an event) also backs off, so a misbehaving server
cannot make the loop spin. A connection that goes silent for `read_timeout` is treated as dead;
the server sends bookmarks about once a minute, so a healthy idle watch is never silent that long.

After the first list and after every change, the reflector calls `on_change()`; the owner reads
`objects` (name -> object as last seen) and `synced` (a list has completed). The callback runs on
the event loop, between events, so the owner never sees a half-applied list.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from epp.k8s import connections

log = logging.getLogger(__name__)

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class WatchSettings:
    """Timing of list/watch requests and of retries."""

    server_timeout: int = 300
    """`timeoutSeconds` asked of each watch request (jittered by up to 10%); the watch then resumes."""

    read_timeout: float = 120.0
    """Seconds without a byte after which a watch connection is considered dead."""

    connect_timeout: float = 10.0
    """Seconds to connect and to complete a list request."""

    backoff_initial: float = 0.2
    """First retry delay after an error; doubled on each further error."""

    backoff_max: float = 30.0
    """Retry delays never exceed this."""

    page_size: int = 500
    """Objects per list page (`limit`)."""


DEFAULT_SETTINGS = WatchSettings()


class ApiError(Exception):
    """The API server answered a request with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Gone(Exception):
    """410: the resource version asked for is too old; a fresh list is needed."""


def _status_message(body: bytes) -> str:
    try:
        doc = json.loads(body)
        return str(doc.get("message") or doc)
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace")


class Reflector:
    """Keeps `objects` equal to the server's objects at `path` matching the selectors."""

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        connection: connections.Connection,
        path: str,
        on_change: Callable[[], None],
        label_selector: str = "",
        field_selector: str = "",
        settings: WatchSettings = DEFAULT_SETTINGS,
        name: str = "",
    ) -> None:
        self.name = name or path
        self.objects: dict[str, Object] = {}
        self.synced = False  # a list has completed: `objects` is a consistent snapshot
        self.resource_version: str | None = None
        self.lists = 0  # completed lists (the first, and one per 410 or unresumable error)
        self._session = session
        self._conn = connection
        self._url = connection.server + path
        self._selectors: dict[str, str] = {}
        if label_selector:
            self._selectors["labelSelector"] = label_selector
        if field_selector:
            self._selectors["fieldSelector"] = field_selector
        self._on_change = on_change
        self._settings = settings

    # -- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled. Never returns; never raises except CancelledError."""
        s = self._settings
        delay = s.backoff_initial
        need_list = True
        last_gone = float("-inf")
        while True:
            started = time.monotonic()
            progressed = False
            try:
                if need_list:
                    await self._list()
                    need_list = False
                    progressed = True
                progressed = await self._watch() or progressed
                if progressed or time.monotonic() - started >= 1.0:
                    delay = s.backoff_initial
                    continue
                log.debug("%s: watch ended without events; retrying in %.1fs", self.name, delay)
            except Gone:
                log.info(
                    "%s: resource version %s is too old (410 Gone); listing again",
                    self.name,
                    self.resource_version,
                )
                need_list = True
                now = time.monotonic()
                if now - last_gone >= 1.0:
                    last_gone = now
                    continue  # relist at once; a second 410 within a second backs off
            except (aiohttp.ClientError, ApiError, ValueError, TimeoutError) as e:
                level = logging.WARNING if delay >= 1.0 or isinstance(e, ApiError) else logging.INFO
                log.log(level, "%s: %s: %s; retrying in %.1fs", self.name, type(e).__name__, e, delay)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, s.backoff_max)

    def _changed(self) -> None:
        try:
            self._on_change()
        except Exception:
            log.exception("%s: change handler failed", self.name)

    # -- list -----------------------------------------------------------------------------------

    async def _get(
        self, params: dict[str, str], client_timeout: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        options = await self._conn.request_options()  # refreshes expired credentials first
        resp = await self._session.get(self._url, params=params, timeout=client_timeout, **options)
        if resp.status == 401:
            self._conn.unauthorized()  # credentials are loaded afresh for the retry
        return resp

    async def _list(self) -> None:
        s = self._settings
        timeout = aiohttp.ClientTimeout(total=s.connect_timeout * 3, sock_connect=s.connect_timeout)
        objects: dict[str, Object] = {}
        token = ""
        while True:
            params = dict(self._selectors, limit=str(s.page_size))
            if token:
                params["continue"] = token
            async with await self._get(params, timeout) as resp:
                body = await resp.read()
                if resp.status == 410:
                    raise Gone()  # an expired continue token: start the list again
                if resp.status != 200:
                    raise ApiError(resp.status, _status_message(body))
            doc = json.loads(body)
            for obj in doc.get("items") or []:
                name = (obj.get("metadata") or {}).get("name")
                if name:
                    objects[name] = obj
            meta = doc.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                break
        self.objects = objects
        self.resource_version = meta.get("resourceVersion") or self.resource_version
        self.synced = True
        self.lists += 1
        log.debug(
            "%s: listed %d objects at resourceVersion %s", self.name, len(objects), self.resource_version
        )
        self._changed()

    # -- watch ----------------------------------------------------------------------------------

    async def _watch(self) -> bool:
        """One watch request, until the server ends it. True if any event arrived."""
        s = self._settings
        server_timeout = max(1, int(s.server_timeout * random.uniform(0.9, 1.0)))
        params = dict(
            self._selectors, watch="true", allowWatchBookmarks="true", timeoutSeconds=str(server_timeout)
        )
        if self.resource_version:
            params["resourceVersion"] = self.resource_version
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=s.connect_timeout, sock_read=s.read_timeout)
        progressed = False
        async with await self._get(params, timeout) as resp:
            if resp.status == 410:
                raise Gone()
            if resp.status != 200:
                raise ApiError(resp.status, _status_message(await resp.read()))
            buffer = b""
            # Lines are split by hand: aiohttp's readline() caps a line's length, a pod's JSON has none.
            async for chunk in resp.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._apply(json.loads(line))
                        progressed = True
        return progressed

    def _apply(self, event: Object) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise ApiError(int(obj.get("code") or 500), str(obj.get("message") or obj))
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if kind == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            return
        name = meta.get("name")
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not name:
            log.warning("%s: ignoring a watch event of type %r", self.name, kind)
            return
        if kind == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj
        self.resource_version = rv or self.resource_version
        self._changed()
