"""A small, honest Kubernetes API server for tests: pods and InferencePools in namespaces.

It speaks the parts of the real protocol that epp's reflector uses, with the real semantics:

- `GET /api/v1/namespaces/{ns}/pods`,
  `GET /apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools` and the
  InferenceObjectives and InferenceModelRewrites of both groups
  (`/apis/{llm-d.ai,inference.networking.x-k8s.io}/v1alpha2/namespaces/{ns}/<plural>`): a List
  whose `metadata.resourceVersion` is the store's current version. `limit` is ignored (all items,
  no `continue`), which the API allows a server to do. A kind whose CRD is not `installed` is a
  404, as on a real server.
- Discovery, `GET /apis/{group}/{version}`: an APIResourceList of the installed kinds of that
  group version; 404 when it has none.
- `?labelSelector=` (`k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`) and
  `?fieldSelector=` (`metadata.name`, `metadata.namespace`; any other field is a 400, as for
  custom resources).
- `?watch=true&resourceVersion=N`: JSON lines `{"type", "object"}` for every change after N
  (history replay, then live). No version (or "0"): synthetic ADDED for the current objects
  first. A version older than the compacted history: one ERROR event with a 410 Status, then the
  stream ends, as a real server does. An object that stops matching the label selector arrives as
  DELETED, one that starts matching as ADDED. `allowWatchBookmarks` enables `bookmark()`;
  `timeoutSeconds` ends the stream.
- `POST /api/v1/namespaces/{ns}/events`: a core/v1 Event is created (name from
  `metadata.generateName`, 201) and kept in `events`; a namespace in the body other than the
  path's is a 400, as for a real server.
- `GET`/`PUT /apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}` and `POST .../leases`:
  Leases for leader election, with optimistic concurrency as on a real server: a PUT whose
  `metadata.resourceVersion` is not the current one is a 409 Conflict, a POST of an existing name
  a 409 AlreadyExists, a GET or PUT of a missing one a 404.
- `POST /apis/authentication.k8s.io/v1/tokenreviews` and
  `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`: a token in `users` authenticates as
  that user; a (user, path, verb) in `grants` is allowed (non-resource URLs only).
- A bearer token, when configured: 401 without it (`token` may be changed, as a credential that
  expired or was rotated; `authorizations` keeps what each list/watch request presented).

Test controls: `create`/`update`/`delete`, `compact()` (history before now is gone -> 410),
`drop_watches()` (abort every watch connection), `bookmark()`, `fail_next(n, status)` (the next n
requests get an error Status), and `requests` (what was asked, to count lists and watches).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import re
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web

Object = dict[str, Any]

# Resource key (as tests name it) -> (apiVersion, kind). Keys without a group suffix are the
# core pods, GIE's InferencePool v1 and GIE's legacy inference.networking.x-k8s.io kinds.
KINDS = {
    "pods": ("v1", "Pod"),
    "inferencepools": ("inference.networking.k8s.io/v1", "InferencePool"),
    "inferenceobjectives": ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"),
    "inferencemodelrewrites": ("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite"),
    "inferenceobjectives.llm-d.ai": ("llm-d.ai/v1alpha2", "InferenceObjective"),
    "inferencemodelrewrites.llm-d.ai": ("llm-d.ai/v1alpha2", "InferenceModelRewrite"),
}
CUSTOM = {key for key in KINDS if key not in ("pods", "inferencepools")}


def plural(key: str) -> str:
    return key.split(".", 1)[0]


def _key_for(group_version: str, plural_name: str) -> str | None:
    for key, (api_version, _) in KINDS.items():
        if api_version == group_version and plural(key) == plural_name:
            return key
    return None


_REQUIREMENT = re.compile(
    r"\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*"
)


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def _label_holds(op: str, key: str, values: frozenset[str], labels: dict[str, str]) -> bool:
    if op == "exists":
        return key in labels
    if op == "!exists":
        return key not in labels
    if op in ("=", "in"):
        return labels.get(key) in values
    return labels.get(key) not in values  # != and notin


def label_matcher(text: str) -> Callable[[dict[str, str]], bool]:
    """A label selector string as a predicate; ValueError if it does not parse."""
    requirements: list[tuple[str, str, frozenset[str]]] = []
    for part in _split_top(text):
        m = _REQUIREMENT.fullmatch(part)
        if m is None or (m["neg"] and (m["op"] or m["setop"])):
            raise ValueError(f"unable to parse requirement: {part!r}")
        key = m["key"]
        if m["neg"]:
            requirements.append(("!exists", key, frozenset()))
        elif m["op"] in ("=", "=="):
            requirements.append(("=", key, frozenset([m["value"]])))
        elif m["op"] == "!=":
            requirements.append(("!=", key, frozenset([m["value"]])))
        elif m["setop"]:
            requirements.append((m["setop"], key, frozenset(v.strip() for v in m["values"].split(","))))
        else:
            requirements.append(("exists", key, frozenset()))
    return lambda labels: all(_label_holds(op, k, vs, labels) for op, k, vs in requirements)


def field_matcher(text: str) -> Callable[[Object], bool]:
    requirements: list[tuple[str, str, str]] = []  # (field, op, value)
    for part in _split_top(text):
        key, op, value = re.split(r"(==|!=|=)", part.strip(), maxsplit=1) if "=" in part else (part, "", "")
        if key not in ("metadata.name", "metadata.namespace") or not op:
            raise ValueError(f"field label not supported: {key}")
        requirements.append((key.split(".")[1], op, value))
    return lambda obj: all(
        (obj["metadata"].get(f) != v) if op == "!=" else (obj["metadata"].get(f) == v)
        for f, op, v in requirements
    )


@dataclasses.dataclass
class _Event:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    kind: str
    namespace: str
    old: Object | None  # the object before (None for ADDED)
    new: Object  # the object after (for DELETED: as it was deleted)


@dataclasses.dataclass(eq=False)
class _Watcher:
    kind: str
    namespace: str
    select: Callable[[Object], bool]
    queue: asyncio.Queue[_Event | str] = dataclasses.field(default_factory=asyncio.Queue)


def _status(code: int, reason: str, message: str) -> Object:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeApiServer:
    def __init__(self, *, token: str | None = None) -> None:
        self.token = token
        self.rv = 100
        self.oldest_rv = 100  # watches from a version older than this get 410
        self.objects: dict[tuple[str, str, str], Object] = {}
        self.history: list[_Event] = []
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.authorizations: list[str | None] = []  # the Authorization header of each list/watch
        self.events: list[Object] = []  # core/v1 Events posted, in order
        self.leases: dict[tuple[str, str], Object] = {}  # (namespace, name) -> Lease
        self.users: dict[str, Object] = {}  # bearer token -> TokenReview status.user
        self.grants: set[tuple[str, str, str]] = set()  # (username, non-resource path, verb)
        self.url = ""
        self._watchers: set[_Watcher] = set()
        self._failures: list[int] = []
        self._runner: web.AppRunner | None = None
        self._watch_tasks: set[asyncio.Task[Any]] = set()
        self.installed: set[str] = set(KINDS)  # keys whose CRDs exist (pods and pools: always)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> str:
        """Serve on a free 127.0.0.1 port; https with `ssl_context` (which may demand client certs)."""
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._handle_pods)
        app.router.add_get(
            "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools", self._handle_pools
        )
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/{plural}", self._handle_custom)
        app.router.add_get("/apis/{group}/{version}", self._handle_discovery)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._handle_event_post)
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._handle_review)
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", self._handle_review)
        leases = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        app.router.add_post(leases, self._handle_lease)
        app.router.add_get(leases + "/{name}", self._handle_lease)
        app.router.add_put(leases + "/{name}", self._handle_lease)
        self._runner = web.AppRunner(
            app, handle_signals=False, shutdown_timeout=0.1, handler_cancellation=True
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        for w in list(self._watchers):
            w.queue.put_nowait("close")
        if self._runner is not None:
            await self._runner.cleanup()

    # -- test controls ---------------------------------------------------------------------------

    def _commit(self, type_: str, kind: str, old: Object | None, new: Object) -> Object:
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        meta = new["metadata"]
        key = (kind, meta["namespace"], meta["name"])
        if type_ == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = new
        event = _Event(self.rv, type_, kind, meta["namespace"], old, copy.deepcopy(new))
        self.history.append(event)
        for w in self._watchers:
            if w.kind == kind and w.namespace == meta["namespace"]:
                w.queue.put_nowait(event)
        return new

    def create(self, kind: str, obj: Object) -> Object:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        key = (kind, meta["namespace"], meta["name"])
        assert key not in self.objects, f"{key} exists"
        api_version, kind_name = KINDS[kind]
        obj.setdefault("apiVersion", api_version)
        obj.setdefault("kind", kind_name)
        meta.setdefault("uid", f"uid-{meta['name']}-{self.rv + 1}")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        return self._commit("ADDED", kind, None, obj)

    def update(
        self, kind: str, name: str, change: Callable[[Object], None], namespace: str = "default"
    ) -> Object:
        old = self.objects[(kind, namespace, name)]
        new = copy.deepcopy(old)
        change(new)
        return self._commit("MODIFIED", kind, old, new)

    def delete(self, kind: str, name: str, namespace: str = "default") -> None:
        old = self.objects[(kind, namespace, name)]
        self._commit("DELETED", kind, old, copy.deepcopy(old))

    def compact(self) -> None:
        """Forget all history up to now: a watch from any earlier version gets 410 Gone."""
        self.oldest_rv = self.rv
        self.history.clear()

    def drop_watches(self) -> None:
        """Abort every open watch connection (as a restarting API server or a lost network)."""
        for w in list(self._watchers):
            w.queue.put_nowait("abort")

    def bookmark(self) -> None:
        for w in list(self._watchers):
            w.queue.put_nowait("bookmark")

    def fail_next(self, n: int, status: int = 500) -> None:
        self._failures.extend([status] * n)

    def count(self, kind: str, *, watch: bool) -> int:
        """Lists (or watches) of resource key `kind` asked for."""
        api_version = KINDS[kind][0]
        prefix = "/api/v1/" if api_version == "v1" else f"/apis/{api_version}/"
        return sum(
            1
            for path, q in self.requests
            if path.startswith(prefix)
            and path.endswith("/" + plural(kind))
            and (q.get("watch") == "true") == watch
        )

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    # -- handlers --------------------------------------------------------------------------------

    async def _handle_pods(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "pods")

    async def _handle_pools(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "inferencepools")

    async def _handle_custom(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        key = _key_for(f"{info['group']}/{info['version']}", info["plural"])
        if key not in CUSTOM or key not in self.installed:
            self.requests.append((request.path, dict(request.query)))
            return self._error(404, "NotFound", "the server could not find the requested resource")
        return await self._handle(request, key)

    async def _handle_discovery(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, {"method": "GET"}))
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._error(401, "Unauthorized", "Unauthorized")
        if self._failures:
            return self._error(self._failures.pop(0), "InternalError", "injected failure")
        group_version = f"{request.match_info['group']}/{request.match_info['version']}"
        resources = [
            {"name": plural(key), "namespaced": True, "kind": kind, "verbs": ["get", "list", "watch"]}
            for key, (api_version, kind) in KINDS.items()
            if api_version == group_version and key in self.installed
        ]
        if not resources:
            return self._error(404, "NotFound", "the server could not find the requested resource")
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": resources,
            }
        )

    async def _handle_event_post(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, {"method": "POST"}))
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._error(401, "Unauthorized", "Unauthorized")
        if self._failures:
            code = self._failures.pop(0)
            return self._error(code, "Forbidden" if code == 403 else "InternalError", "injected failure")
        ns = request.match_info["ns"]
        try:
            event = await request.json()
        except ValueError as e:
            return self._error(400, "BadRequest", str(e))
        meta = event.setdefault("metadata", {})
        if meta.setdefault("namespace", ns) != ns:
            return self._error(400, "BadRequest", "the namespace of the object does not match the request")
        if event.get("kind") != "Event" or not event.get("involvedObject") or not event.get("reason"):
            return self._error(422, "Invalid", "an Event needs kind, involvedObject and reason")
        meta.setdefault("name", f"{meta.get('generateName', 'event.')}{len(self.events):05x}")
        self.events.append(event)
        return web.json_response(event, status=201)

    async def _handle_review(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, {"method": "POST"}))
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._error(401, "Unauthorized", "Unauthorized")
        if self._failures:
            code = self._failures.pop(0)
            return self._error(code, "Forbidden" if code == 403 else "InternalError", "injected failure")
        review = await request.json()
        spec = review.get("spec") or {}
        if review.get("kind") == "TokenReview":
            user = self.users.get(spec.get("token", ""))
            review["status"] = {"authenticated": True, "user": user} if user else {"authenticated": False}
        elif review.get("kind") == "SubjectAccessReview":
            attrs = spec.get("nonResourceAttributes") or {}
            allowed = (spec.get("user"), attrs.get("path"), attrs.get("verb")) in self.grants
            review["status"] = {"allowed": allowed}
        else:
            return self._error(400, "BadRequest", f"not a review: {review.get('kind')}")
        return web.json_response(review, status=201)

    async def _handle_lease(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, {"method": request.method}))
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._error(401, "Unauthorized", "Unauthorized")
        if self._failures:
            code = self._failures.pop(0)
            return self._error(code, "InternalError", "injected failure")
        ns = request.match_info["ns"]
        if request.method == "GET":
            found = self.leases.get((ns, request.match_info["name"]))
            if found is None:
                return self._error(404, "NotFound", f"leases {request.match_info['name']!r} not found")
            return web.json_response(found)
        try:
            lease = await request.json()
        except ValueError as e:
            return self._error(400, "BadRequest", str(e))
        meta = lease.setdefault("metadata", {})
        if meta.setdefault("namespace", ns) != ns:
            return self._error(400, "BadRequest", "the namespace of the object does not match the request")
        key = (ns, meta.get("name", ""))
        current = self.leases.get(key)
        if request.method == "POST":
            if current is not None:
                return self._error(409, "AlreadyExists", f"leases {key[1]!r} already exists")
        else:
            if key[1] != request.match_info["name"]:
                return self._error(400, "BadRequest", "the name of the object does not match the request")
            if current is None:
                return self._error(404, "NotFound", f"leases {key[1]!r} not found")
            if meta.get("resourceVersion") not in (None, current["metadata"]["resourceVersion"]):
                return self._error(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version",
                )
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        lease.setdefault("apiVersion", "coordination.k8s.io/v1")
        lease.setdefault("kind", "Lease")
        self.leases[key] = lease
        return web.json_response(lease, status=201 if request.method == "POST" else 200)

    def _error(self, code: int, reason: str, message: str) -> web.Response:
        return web.json_response(_status(code, reason, message), status=code)

    async def _handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        q = dict(request.query)
        self.requests.append((request.path, q))
        self.authorizations.append(request.headers.get("Authorization"))
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._error(401, "Unauthorized", "Unauthorized")
        if self._failures:
            code = self._failures.pop(0)
            return self._error(code, "InternalError", "injected failure")
        ns = request.match_info["ns"]
        try:
            labels = label_matcher(q.get("labelSelector", ""))
            fields = field_matcher(q.get("fieldSelector", ""))
        except ValueError as e:
            return self._error(400, "BadRequest", str(e))

        def select(obj: Object) -> bool:
            return labels(obj["metadata"].get("labels") or {}) and fields(obj)

        if q.get("watch") in ("true", "1"):
            return await self._watch(request, kind, ns, select, q)
        api_version, kind_name = KINDS[kind]
        items = [
            copy.deepcopy(o)
            for (k, n, _), o in sorted(self.objects.items())
            if k == kind and n == ns and select(o)
        ]
        return web.json_response(
            {
                "kind": f"{kind_name}List",
                "apiVersion": api_version,
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    async def _watch(
        self, request: web.Request, kind: str, ns: str, select: Callable[[Object], bool], q: dict[str, str]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        since_text = q.get("resourceVersion", "")
        since = int(since_text) if since_text not in ("", "0") else None
        if since is not None and since < self.oldest_rv:
            status = _status(410, "Expired", f"too old resource version: {since} ({self.oldest_rv})")
            await resp.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
            return resp
        watcher = _Watcher(kind, ns, select)
        # Registering and reading history in one synchronous step: nothing is missed or doubled.
        self._watchers.add(watcher)
        if since is None:
            backlog = [
                _Event(self.rv, "ADDED", kind, ns, None, copy.deepcopy(o))
                for (k, n, _), o in sorted(self.objects.items())
                if k == kind and n == ns
            ]
        else:
            backlog = [e for e in self.history if e.rv > since and e.kind == kind and e.namespace == ns]
        for e in backlog:
            watcher.queue.put_nowait(e)
        timeout = float(q["timeoutSeconds"]) if "timeoutSeconds" in q else None
        bookmarks = q.get("allowWatchBookmarks") == "true"
        try:
            async with asyncio.timeout(timeout):
                while True:
                    item = await watcher.queue.get()
                    if item == "abort":
                        assert request.transport is not None
                        request.transport.abort()
                        return resp
                    if item == "close":
                        return resp
                    if item == "bookmark":
                        if bookmarks:
                            api_version, kind_name = KINDS[kind]
                            obj = {
                                "kind": kind_name,
                                "apiVersion": api_version,
                                "metadata": {"resourceVersion": str(self.rv)},
                            }
                            await resp.write(json.dumps({"type": "BOOKMARK", "object": obj}).encode() + b"\n")
                        continue
                    assert isinstance(item, _Event)
                    line = self._event_line(item, watcher)
                    if line is not None:
                        await resp.write(line)
        except TimeoutError:
            return resp
        finally:
            self._watchers.discard(watcher)

    @staticmethod
    def _event_line(event: _Event, watcher: _Watcher) -> bytes | None:
        was = event.old is not None and watcher.select(event.old)
        now = watcher.select(event.new)
        if event.type == "DELETED":
            type_ = "DELETED" if was else None
        elif now:
            type_ = "MODIFIED" if was else "ADDED"
        else:
            type_ = "DELETED" if was else None
        if type_ is None:
            return None
        return json.dumps({"type": type_, "object": event.new}).encode() + b"\n"


# -- object builders -------------------------------------------------------------------------------


def pod(
    name: str,
    ip: str | None = "10.0.0.1",
    *,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> Object:
    status: Object = {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
    }
    if ip is not None:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {"app": "vllm"}),
            "annotations": dict(annotations or {}),
        },
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": status,
    }


def pool(
    name: str = "pool",
    *,
    selector: dict[str, str] | None = None,
    ports: tuple[int, ...] = (8000,),
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> Object:
    return {
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {
            "selector": {"matchLabels": dict(selector or {"app": "vllm"})},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    }


def objective(
    name: str,
    priority: int | None = None,
    *,
    pool: str = "pool",
    group: str | None = None,
    kind: str | None = None,
    namespace: str = "default",
) -> Object:
    """An InferenceObjective for `pool` (priority None: unset; group/kind None: left to defaults)."""
    ref: Object = {"name": pool}
    if group is not None:
        ref["group"] = group
    if kind is not None:
        ref["kind"] = kind
    spec: Object = {"poolRef": ref}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def rewrite(
    name: str,
    rules: list[Object],
    *,
    pool: str = "pool",
    created: str = "2026-01-01T00:00:00Z",
    namespace: str = "default",
) -> Object:
    """An InferenceModelRewrite for `pool` with these `rules` (as the API would store them)."""
    return {
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
        "spec": {
            "poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool},
            "rules": rules,
        },
    }


def rule(*models: str, targets: dict[str, int | None]) -> Object:
    """A rewrite rule matching `models` exactly (none: every model), to `targets` (model -> weight)."""
    out: Object = {
        "targets": [
            {"modelRewrite": m} if w is None else {"modelRewrite": m, "weight": w} for m, w in targets.items()
        ]
    }
    if models:
        out["matches"] = [{"model": {"type": "Exact", "value": m}} for m in models]
    return out


def kubeconfig(url: str, token: str | None = None) -> str:
    """A kubeconfig document pointing at `url` (plain HTTP, optional bearer token)."""
    user = f"    token: {token}\n" if token else "    {}\n"
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters:\n- name: fake\n  cluster:\n    server: {url}\n"
        "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n"
        f"users:\n- name: fake\n  user:\n{user}"
    )
