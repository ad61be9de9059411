"""The Kubernetes endpoint source: an in-process InferencePool operator feeding the datastore.

Layers (imports run downward only): `operator` (PoolOperator: pool -> pods -> `Datastore.sync`)
-> `watching` (Reflector: list/watch of one resource, resourceVersion, 410 relist, backoff) and
`pools` (pure: InferencePool + pods -> EndpointSpecs; annotations documented there) and `events`
(best-effort core/v1 Events, e.g. `InvalidPoolSpec`) -> `connections` (kubeconfig / in-cluster
configuration and credentials, through kubernetes_asyncio's loader). `epp.k8s` may import `epp.datastore` and
`epp.tasks`; nothing on the data path imports `epp.k8s` (only `epp.serve` and the worker
supervisor do). `from_flags` builds the source and the Lease campaign from `epp serve`'s flags.

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
client-go-style reflector on aiohttp.

Config and auth: kubernetes_asyncio; list/watch: epp's reflector. Reading kubeconfigs and
obtaining credentials is where a maintained library earns its keep (merging, exec plugins with
expiry, OIDC, projected-token rotation), so `connections` uses kubernetes_asyncio's loader (asyncio
subprocesses for exec plugins: a 1 s `aws eks get-token` does not stall routing, as the `kubernetes`
package's synchronous loader would). Its list/watch (`watch.Watch` over the generated API classes)
was measured and read, and does not replace the reflector:

- Cost per event (`tests/k8s/bench_watch.py`, 2000 MODIFIED events of a 3.3 kB vLLM pod, best of
  5): the reflector 18 us/event; `Watch` with the typed `V1Pod` models that `CoreV1Api` returns
  457 us/event (25x: each event is json-loaded, dumped and loaded again into model classes);
  `Watch` with plain dicts 59 us/event. A rollout of a few hundred pods is thousands of events on
  the loop that also routes.
- Relist: `Watch` has no cache. On a 410 it reconnects once with the same (expired)
  resourceVersion, then raises; the caller must list, replace its copy and watch again — the
  reflector's job, which would remain ours anyway.
- Import: kubernetes_asyncio costs ~0.3 s and ~850 modules, so `connections` imports it on first
  use; the reflector needs none of it.
"""
