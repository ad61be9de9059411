"""`--metrics-endpoint-auth`: Kubernetes authentication and authorization on the metrics port.

GIE's EPP wraps its metrics server in controller-runtime's `WithAuthenticationAndAuthorization`
filter; this is the same check, done the same way through the API server:

1. The request's bearer token goes to a TokenReview (authentication.k8s.io/v1). No token, or one
   the API server does not authenticate: 401.
2. The user it names goes to a SubjectAccessReview (authorization.k8s.io/v1) for the
   non-resource URL (the request's path) and verb (the lowercased method, `get` for a scrape):
   not allowed: 403. A Prometheus needs a ClusterRole with `nonResourceURLs: ["/metrics"]`,
   `verbs: ["get"]`, as for GIE.
3. An API server that cannot be asked: 500, and nothing is cached.

Answers are cached as by Kubernetes' delegating authenticator and authorizer (tokens 2 min,
allowed 5 min, denied 30 s), so a scrape every few seconds costs no API call. epp's own
ServiceAccount needs `create` on tokenreviews and subjectaccessreviews (GIE's chart grants it).
Every path on the port is protected (the /debug routes too), as in GIE, where the filter wraps
the whole metrics server.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from epp.k8s import connections

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
TIMEOUT_S = 10.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ReviewError(Exception):
    """The API server could not answer a review."""


class ApiServerAuth:
    def __init__(
        self,
        connection: connections.Connection,
        *,
        token_ttl: float = 120.0,
        allowed_ttl: float = 300.0,
        denied_ttl: float = 30.0,
    ) -> None:
        self.connection = connection
        self.token_ttl = token_ttl
        self.allowed_ttl = allowed_ttl
        self.denied_ttl = denied_ttl
        self.reviews = 0  # API calls made (TokenReviews + SubjectAccessReviews)
        self._session: aiohttp.ClientSession | None = None
        self._users: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._decisions: dict[tuple[str, str, str], tuple[float, bool]] = {}

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        try:
            status = await self.check(token, request.path, request.method.lower())
        except ReviewError as exc:
            log.warning("metrics auth: %s", exc)
            return web.Response(status=500, text="authentication or authorization failed\n")
        if status == 401:
            return web.Response(status=401, text="Unauthorized\n")
        if status == 403:
            return web.Response(status=403, text="Forbidden\n")
        return await handler(request)

    async def check(self, token: str, path: str, verb: str) -> int:
        """200, 401 or 403 for `token` asking `verb` on `path`; ReviewError if the server cannot say."""
        if not token:
            return 401
        user = await self._authenticate(token)
        if user is None:
            return 401
        return 200 if await self._authorize(user, path, verb) else 403

    async def _authenticate(self, token: str) -> dict[str, Any] | None:
        now = time.monotonic()
        cached = self._users.get(token)
        if cached is not None and cached[0] > now:
            return cached[1]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        status = (await self._post(TOKEN_REVIEWS, body)).get("status") or {}
        user = status.get("user") if status.get("authenticated") else None
        self._users[token] = (now + self.token_ttl, user)
        return user if isinstance(user, dict) else None

    async def _authorize(self, user: dict[str, Any], path: str, verb: str) -> bool:
        now = time.monotonic()
        key = (str(user.get("username", "")), path, verb)
        cached = self._decisions.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        spec: dict[str, Any] = {
            "user": user.get("username", ""),
            "groups": user.get("groups") or [],
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        allowed = bool(((await self._post(ACCESS_REVIEWS, body)).get("status") or {}).get("allowed"))
        self._decisions[key] = (now + (self.allowed_ttl if allowed else self.denied_ttl), allowed)
        return allowed

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None:
            raise RuntimeError("ApiServerAuth not started")
        self.reviews += 1
        try:
            options = await self.connection.request_options(content_type="application/json")
            async with self._session.post(
                self.connection.server + path,
                data=json.dumps(body),
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
                **options,
            ) as resp:
                if resp.status == 401:
                    self.connection.unauthorized()  # epp's own credentials: loaded afresh next time
                if resp.status not in (200, 201):
                    text = (await resp.read())[:200].decode("utf-8", "replace")
                    hint = (
                        " (RBAC: epp needs create on tokenreviews and subjectaccessreviews)"
                        if resp.status == 403
                        else ""
                    )
                    raise ReviewError(f"{body['kind']}: HTTP {resp.status}{hint}: {text}")
                loaded = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ReviewError(f"{body['kind']}: {exc}") from exc
        return loaded if isinstance(loaded, dict) else {}
