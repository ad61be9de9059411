"""The Kubernetes endpoint source: an in-process InferencePool operator feeding the datastore.

Layers (imports run downward only): `operator` (PoolOperator: pool -> pods -> `Datastore.sync`)
-> `watching` (Reflector: list/watch of one resource, resourceVersion, 410 relist, backoff) and
`pools` (pure: InferencePool + pods -> EndpointSpecs; annotations documented there) and `events`
(best-effort core/v1 Events, e.g. `InvalidPoolSpec`) -> `connections` (kubeconfig / in-cluster
credentials). `epp.k8s` may import `epp.datastore` and
`epp.tasks`; nothing on the data path imports `epp.k8s` (only `epp.serve` does).

Why not kopf. The design named kopf; embedding it was tried (kopf 1.45, `kopf.operator(...,
standalone=True, namespaces=[ns], registry=..., stop_flag=...)` in the serving loop) and it does
not fit an embedded, routing-critical cache:

- `kopf.operator()` installs SIGINT/SIGTERM handlers on the running loop whenever it runs in the
  main thread, even with a `stop_flag` (`_core/reactor/running.py`). asyncio keeps one handler per
  signal, so this silently replaces `epp serve`'s handler, which drains ext-proc streams first.
- After a 410 Gone, kopf re-lists and replays the objects that exist as type=None events, but
  the end-of-list marker stays inside kopf (`queueing.py` drops `Bookmark.LISTED`): handlers are
  never told which objects vanished while the watch was down. A pod deleted in that gap would stay
  routable until epp restarts. A reflector that replaces its cache on each list has no such gap.
- Handler filters (`labels=`) and `settings.watching.label_selectors` are fixed at start-up,
  while the pool's selector is data that changes at run time.
- Shutdown: with the API server unreachable, `kopf.operator()` had not returned 5 s after its
  `stop_flag` was set (it keeps retrying), which would stall `epp serve`'s stop sequence.
- It brings `kubernetes`, `pydantic` and friends for two GET endpoints, and by default patches
  objects (progress annotations), which our RBAC does not grant.

What epp needs is two list/watch loops and a derivation, so `watching.Reflector` is a small
client-go-style reflector on aiohttp (already a dependency): no new packages.
"""
