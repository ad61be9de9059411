"""Post core/v1 Events about an object, so that `kubectl describe` shows what epp objects to.

`POST /api/v1/namespaces/<ns>/events` with `metadata.generateName` (the server picks the name),
`involvedObject` naming the object (with its uid and resourceVersion), a CamelCase `reason`, a
`message` of at most 1024 characters and `type` Normal or Warning, as kubectl and client-go's
event recorder write them. RBAC: `create` on `events` (core group) in that namespace.

Posting is best effort: a failure (no RBAC, API server away) is logged and never raised, because
an event only reports a problem that is already logged. Callers dedupe (the operator posts once
per resourceVersion of an invalid pool), so there is no aggregation (`count`) here.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

import aiohttp

from epp.k8s import connections

log = logging.getLogger(__name__)

COMPONENT = "epp"
MAX_MESSAGE = 1024  # the API server rejects longer event messages
TIMEOUT_S = 10.0


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/events"


def reference(obj: Mapping[str, Any], *, api_version: str, kind: str) -> dict[str, str]:
    """The `involvedObject` of an event about `obj` (apiVersion and kind given: list items lack them)."""
    meta = obj.get("metadata") or {}
    ref = {"apiVersion": api_version, "kind": kind}
    for key in ("name", "namespace", "uid", "resourceVersion"):
        if meta.get(key):
            ref[key] = str(meta[key])
    return ref


def event_body(involved: Mapping[str, str], *, reason: str, message: str, type_: str) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    instance = os.environ.get("HOSTNAME") or socket.gethostname()  # the pod's name in a cluster
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved.get('name', 'epp')}.", "namespace": involved["namespace"]},
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": COMPONENT, "host": instance},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def post(
    *,
    session: aiohttp.ClientSession,
    connection: connections.Connection,
    involved: Mapping[str, str],
    reason: str,
    message: str,
    type_: str = "Warning",
) -> bool:
    """Post one event in the involved object's namespace; True if the server created it."""
    body = event_body(involved, reason=reason, message=message, type_=type_)
    url = connection.server + events_path(involved["namespace"])
    try:
        options = await connection.request_options(content_type="application/json")
        async with session.post(
            url,
            data=json.dumps(body),
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
            **options,
        ) as resp:
            if resp.status in (200, 201):
                return True
            text = (await resp.read())[:300].decode("utf-8", "replace")
    except (aiohttp.ClientError, TimeoutError, connections.ConfigError) as e:
        log.warning("cannot post the %s event about %s: %s", reason, involved.get("name"), e)
        return False
    hint = " (RBAC: epp needs `create` on `events`)" if resp.status == 403 else ""
    log.warning(
        "cannot post the %s event about %s: HTTP %d%s: %s",
        reason,
        involved.get("name"),
        resp.status,
        hint,
        text,
    )
    return False
