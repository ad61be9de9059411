"""Fast mode: one workload, one policy, a simulated fleet, all in virtual time in one process.

What runs is what `epp serve` runs, minus the network: a `Datastore` of endpoints, the scheduler
built from the policy's EndpointPickerConfig by `epp.scheduling.config`, the `Director` from
`epp.requestcontrol` with the configuration's pre-request and response-complete hooks and GIE's
legacy admission, and a KV-event `BlockIndex` for the plugins that read one (`Handle.kv_index`).
Every request is a `/v1/completions` body with token-id prompts (nothing to tokenize) routed by
`Director.route`, booked on its endpoint, and finished through its `RequestContext`, so in-flight
counts and every hook behave as when serving. The fleet is `epp.sim.core.Engine`s, one per pod.

A discrete-event loop in virtual time (`epp.clock.use`), in order of time:

- arrival: the request is routed at once (decisions take no virtual time) and added to its pod's
  engine; the response headers (200, SSE) are recorded on its context, as vLLM sends them at once.
- engine step end: each engine runs step after step while it has work; outputs of a step count at
  its end. A first token sets the tracker's `first_chunk_at`; a finished request gets its usage
  (prompt, completion and cached tokens, as vLLM reports them) and `finish(complete=True)`.
  Behind epp's own gateway config (`epp bench --gateway-config override`: the Director's
  `response_sample_ratio` below 1) an off-sample request's body skips epp: it gets neither, only
  the end of its stream (`response_skipped`), and its prefill booking lasts until then. The
  step's KV events then reach the index (after `kv_delay_s`, 0 by default: ZMQ on a LAN delivers
  in well under a step).
- scrape: every `scrape_interval_s` (GIE's 50 ms) every pod's `ModelServerMetrics` is refreshed
  from its engine as the scraper would parse vLLM's /metrics, all pods on the same tick, and
  booked load paced as `epp serve --booked-metrics-interval` paces it (`epp.bench.fast_scrapes`).

Closed-loop users send their next request when the previous one finished. Determinism: the
pickers' global `random` is seeded with the run's seed, workloads carry their own seeded streams,
and ties in time are taken in the order events were scheduled.

Flow control (a policy whose config has `featureGates: [flowControl]`): a request may wait before
it is routed, so each arrival is a task; flow control's timers (its dispatch ticks, each request's
queue-wait budget) are events of the same virtual clock, and after every event the loop lets the
woken tasks run until each is done or held again. A prompt's `priority` is sent as an objective
(`priority-<n>`, known to the Director's objectives) and its `fairness_id` as
`x-llm-d-inference-fairness-id`. A workload with `pods_ready_at` starts with an empty pool and
adds the pods then (a cold start); one with `pod_restarts` restarts those pods at their times
(their requests fail, they leave routing, and come back with an empty cache). Each scrape tick
records the requests queued per band.

What is not modelled: network and decision latency (zero virtual time), per-pod scrape phases,
and HTTP errors other than vLLM's 400s. A chat workload tells the engine which tokens to generate
(`Prompt.output_token_ids`), so a reply's blocks can hit when the next turn carries it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import msgspec

from epp import clock
from epp.api import errors
from epp.api.responses import Usage
from epp.bench import records
from epp.bench.fast_prewarm import EnginePrewarmer, is_prewarm
from epp.bench.fast_scrapes import Scrapes
from epp.bench.policies import Policy
from epp.bench.records import RequestRecord, RunResult, Sample
from epp.bench.reuse import ReuseBound
from epp.bench.workload import ClosedLoop, OpenLoop, Prompt, Workload
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.flags.serve import BOOKED_METRICS_INTERVAL_S
from epp.flowcontrol import controller as flowcontrol
from epp.kvcache.events import EventBatch
from epp.kvcache.index import BlockIndex
from epp.requestcontrol import admission
from epp.requestcontrol.context import RequestContext
from epp.requestcontrol.director import Director, DirectorSettings, plugin_hooks
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.sim import blocks, core
from epp.sim.profiles import Profile

MODEL = "bench-model"
START = 1.0
"""Virtual time of the run's start. Not 0: `ModelServerMetrics.updated_at == 0` means never scraped."""

_ARRIVE, _STEP_END, _KV, _SCRAPE, _TIMER, _PODS, _DOWN, _UP = 0, 1, 2, 3, 4, 5, 6, 7
OBJECTIVE_PREFIX = "priority-"  # a prompt of priority n names objective "priority-n"
FAIRNESS_HEADER = flowcontrol.FAIRNESS_HEADERS[0]
_HEADERS = {":status": "200", "content-type": "text/event-stream"}
_MAX_BODY_BYTES = 64 << 20  # encoded bodies kept for prompts sent again (llm-d's 750: ~30 MB)


@dataclasses.dataclass(slots=True)
class _InFlight:
    ctx: RequestContext
    record: RequestRecord
    user: int


class FastRun:
    """One policy over one workload; `run()` once."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        *,
        profile: Profile,
        pods: int,
        seed: int,
        kv_delay_s: float = 0.0,
        scrape_interval_s: float = 0.05,
        booked_interval_s: float = BOOKED_METRICS_INTERVAL_S,
        progress: Callable[[float], None] | None = None,
        request_headers: Mapping[str, str] | None = None,
        pod_profiles: Sequence[Profile] | None = None,
        settings: DirectorSettings | None = None,
    ) -> None:
        """`pod_profiles`: each pod's profile, for a mixed fleet (the same block size in all; a
        workload's `pod_profiles`); None = `profile` for every pod. `settings`: the Director's
        (`epp serve`'s defaults when None); with `response_sample_ratio` below 1 the responses
        are sampled as behind epp's own gateway config (module docstring)."""
        if pods <= 0:
            raise ValueError(f"pods must be > 0, got {pods}")
        self.workload = workload
        self.policy = policy
        self.profile = profile
        self.profiles = pod_profiles_of(profile, pods, pod_profiles)
        self.seed = seed
        self.kv_delay_s = kv_delay_s
        self.scrape_interval_s = scrape_interval_s
        self.progress = progress
        # Sent with every request (`epp bench --slo-headers`: the latency target as x-slo-*).
        self.request_headers = dict(request_headers or {})
        self.now = START
        self.datastore = Datastore()
        specs = self.specs(pods)
        self._specs = specs
        cold = workload.pods_ready_at is not None and workload.pods_ready_at > 0
        self.datastore.sync("bench", [] if cold else specs)
        self.endpoints = list(self.datastore.endpoints())  # in spec order
        self.index = BlockIndex() if policy.kv_events else None
        handle = Handle(datastore=self.datastore, kv_index=self.index)
        # epp's own policies: llm-d's Alpha plugin types are meant (as with --allow-experimental-plugins).
        cfg = sched_config.load_config(policy.config_text(), handle, allow_experimental=True)
        detector, self.flow, _ = flowcontrol.from_scheduler_config(
            cfg, self.datastore.candidates, timer=self, pool_name="bench"
        )
        # Booked pods refreshed less often, as epp serve paces them: for epp's own policies (a
        # peer's router scrapes at its fixed interval), and not where flow control dispatches on
        # the scrapes.
        paced = policy.paced and not flowcontrol.dispatch_reads_scrapes(self.flow)
        self.scrapes = Scrapes(scrape_interval_s, booked_interval_s, paced=paced, now=lambda: self.now)
        self.endpoints = self.scrapes.hooked(self.endpoints)
        self.settings = settings or DirectorSettings()
        self.director = Director(
            datastore=self.datastore,
            scheduler=cfg.scheduler,
            settings=self.settings,
            **plugin_hooks(cfg),
            admission_controller=admission.LegacyAdmissionController(detector),
            objectives=_Objectives(),
            flow_control=self.flow,
        )
        self.engines = [
            core.Engine(prof, name=s.name, record_events=self.index is not None)
            for prof, s in zip(self.profiles, specs, strict=True)
        ]
        self._pod_of = {s.name: i for i, s in enumerate(specs)}
        self._routing_groups: dict[str, str] = {}  # request id -> its prompt's group, while routed
        self.prewarms = EnginePrewarmer(
            self.engines, self._pod_of, self.wake, group_of=self._routing_groups.get, start=START
        )
        self.director.prewarmer = self.prewarms
        self._prefix_digests = blocks.PrefixDigests(profile.block_size)
        self._reuse = ReuseBound(profile.block_size)
        self._bodies: dict[tuple[int, int], tuple[Sequence[int], bytes]] = {}
        self._body_bytes = 0
        self._stale_steps = [0] * pods  # step ends still due from an engine a restart replaced
        # Each pod's step under way (None: not stepping). The requests it finishes have left the
        # engine's queues already.
        self._steps: list[core.StepResult | None] = [None] * pods
        self._finished = [0] * pods  # vllm:request_success_total per pod
        self._heap: list[tuple[float, int, int, Any]] = []  # (time, order, kind, payload)
        self._seq = 0
        self._inflight: dict[str, _InFlight] = {}
        self._arrivals: Iterator[tuple[float, Prompt]] | None = None
        self._pending_arrivals = 0  # arrival events in the heap
        self._tasks = 0  # arrivals routing as tasks (flow control), not yet routed or refused
        self._next_id = 0
        self.result = RunResult(workload.name, policy.name, seed, pods, profile.name, [], [])

    def specs(self, pods: int) -> list[EndpointSpec]:
        """The fleet's endpoints (`epp.bench.pd` labels their roles)."""
        return [
            EndpointSpec(
                name=f"pod-{i}", address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", port=8000, model=MODEL
            )
            for i in range(pods)
        ]

    def on_event(self, kind: int, payload: Any) -> None:
        """An event of a kind a subclass pushed (`kind` > the base kinds)."""
        raise RuntimeError(f"unknown event kind {kind}")

    # --- event queue ------------------------------------------------------------------------------

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    def _busy(self) -> bool:
        return bool(self._inflight) or self._pending_arrivals > 0 or self._tasks > 0

    def call_at(self, when: float, callback: Callable[[], None]) -> _TimerHandle:
        """Flow control's timers, on the virtual clock (`flowcontrol.Timer`)."""
        handle = _TimerHandle()
        self._push(max(when, self.now), _TIMER, (handle, callback))
        return handle

    async def _settle(self) -> None:
        """Let the arrivals flow control released run until each is routed, refused or held
        again (virtual time stands still meanwhile)."""
        flow = self.flow
        assert flow is not None
        spins = 0
        while self._tasks > flow.registry.len:
            await asyncio.sleep(0 if spins < 1000 else 0.001)  # a long prompt's prepare: a thread
            spins += 1

    # --- the run ----------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Run to the end of the workload and the drain of every request; returns the result."""
        started = time.perf_counter()
        state = random.getstate()
        random.seed(self.seed)  # the pickers' tie-breaks and random choices
        try:
            with clock.use(lambda: self.now):
                asyncio.run(self._loop())
        finally:
            random.setstate(state)
        self.result.wall_s = time.perf_counter() - started
        self.result.prewarms = self.prewarms.sent
        self.result.prewarm_log = list(self.prewarms.sent_log)
        self.result.fleet_prefix_hits = sum(e.prefix_cache_hits for e in self.engines)
        self.result.fleet_prefix_queries = sum(e.prefix_cache_queries for e in self.engines)
        return self.result

    async def _loop(self) -> None:
        wl = self.workload
        if isinstance(wl, ClosedLoop):
            for u in range(wl.users):
                self._schedule_user(u, 0.0)
        elif isinstance(wl, OpenLoop):
            self._arrivals = wl.arrivals()
            self._pull_arrival()
        self._push(START, _SCRAPE, None)
        if self.workload.pods_ready_at:
            self._push(START + self.workload.pods_ready_at, _PODS, None)
        for t, pod, down in self.workload.pod_restarts:
            if not 0 <= pod < len(self.engines):
                raise ValueError(f"workload {wl.name!r} restarts pod {pod} of {len(self.engines)}")
            self._push(START + t, _DOWN, pod)
            self._push(START + t + down, _UP, pod)
        # A safety net against a run that never drains (an engine bug): stop well past any
        # plausible drain and report what was unfinished.
        limit = START + wl.duration * 20 + 3600.0
        heap = self._heap
        report_every = max(wl.duration / 200, 1e-9)
        next_report = START
        while heap:
            t, _, kind, payload = heapq.heappop(heap)
            if t > limit:
                self.result.stopped_early = True
                break
            self.now = t
            if kind == _ARRIVE:
                self._pending_arrivals -= 1
                user: int = payload[0]
                if user < 0:
                    self._pull_arrival()
                await self._arrive(user, payload[1])
            elif kind == _STEP_END:
                if self._stale_steps[payload[0]]:
                    self._stale_steps[payload[0]] -= 1  # the engine it stepped is gone
                else:
                    self._step_end(payload)
            elif kind == _KV:
                assert self.index is not None
                self.index.apply(payload[0], payload[1], model=MODEL)
            elif kind == _TIMER:
                handle, callback = payload
                if not handle.cancelled:
                    callback()
            elif kind == _PODS:
                self.datastore.sync("bench", self._specs)
                self.endpoints = self.scrapes.hooked(self.datastore.endpoints())
            elif kind == _DOWN:
                self._pod_down(payload)
            elif kind == _UP:
                self._pod_up(payload)
            elif kind != _SCRAPE:
                self.on_event(kind, payload)
            elif self._busy():  # a scrape, while anything is left to measure
                self._scrape()
                self._push(t + self.scrape_interval_s, _SCRAPE, None)
            if self.flow is not None:
                await self._settle()
            if self.progress is not None and t >= next_report:
                next_report = t + report_every
                self.progress((t - START) / wl.duration if wl.duration else 1.0)
        self.result.end = self.now - START
        for flight in self._inflight.values():
            flight.ctx.finish(complete=False)  # stopped early: release, as a client reset would
        if self.flow is not None:
            self.flow.close()  # stopped early with requests held: answer them
            await self._settle()

    def _pull_arrival(self) -> None:
        assert self._arrivals is not None
        nxt = next(self._arrivals, None)
        if nxt is not None:
            t, prompt = nxt
            self._pending_arrivals += 1
            self._push(START + t, _ARRIVE, (-1, prompt))

    def _schedule_user(self, user: int, now: float) -> None:
        wl = self.workload
        assert isinstance(wl, ClosedLoop)
        nxt = wl.next_request(user, now)
        if nxt is not None:
            t, prompt = nxt
            self._pending_arrivals += 1
            self._push(START + t, _ARRIVE, (user, prompt))

    # --- requests ---------------------------------------------------------------------------------

    async def _arrive(self, user: int, prompt: Prompt) -> None:
        now = self.now
        record = records.arrived(prompt, now - START, self._reuse.add(prompt))
        self.result.records.append(record)
        if self.flow is None:
            await self._route(user, prompt, record)
            return
        self._tasks += 1
        task = asyncio.ensure_future(self._route(user, prompt, record))
        task.add_done_callback(self._routed)

    def _routed(self, task: asyncio.Future[None]) -> None:
        self._tasks -= 1
        task.result()  # a bug in routing surfaces here rather than as a stalled run

    async def _route(self, user: int, prompt: Prompt, record: RequestRecord) -> None:
        self._next_id += 1
        rid = f"r{self._next_id}"
        self._routing_groups[rid] = prompt.group  # a pre-warm planned for it copies the group's prefix
        body = self._body(prompt)
        headers = {**self.request_headers, "x-request-id": rid}
        if prompt.priority:
            headers[admission.OBJECTIVE_HEADER] = f"{OBJECTIVE_PREFIX}{prompt.priority}"
        if prompt.fairness_id:
            headers[FAIRNESS_HEADER] = prompt.fairness_id
        # The prompt's shared prefix is hashed once per group, not once per request.
        prefix = self._prefix_digests.prefix(prompt.group, prompt.token_ids, prompt.shared_tokens)
        bs = self.profile.block_size
        need = min(len(prefix), (record.prompt_tokens - 1) // bs)
        record.prefix_need = need * bs
        held = [e.cached_digest_blocks(prefix[:need]) * bs for e in self.engines] if need else []
        record.held_best = max(held, default=0)
        try:
            ctx = await self.director_for_next().route(
                path="/v1/completions", headers=headers, body=body, subset=None
            )
        except errors.RequestError as exc:
            record.status = exc.status
            record.finish = self.now - START
            record.dropped = exc.headers.get("x-llm-d-request-dropped-reason", "")
            self._user_done(user, self.now)
            return
        finally:
            del self._routing_groups[rid]
        now = self.now  # later than the arrival when flow control held it
        record.routed = now - START
        pod = self._pod_of[ctx.booked.name]
        record.pod = pod
        record.held_chosen = held[pod] if held else 0
        self._inflight[rid] = _InFlight(ctx, record, user)
        self.dispatch(rid, prompt, prefix, pod)

    def dispatch(
        self, rid: str, prompt: Prompt, prefix: Sequence[Any], pod: int, *, remote_tokens: int = 0
    ) -> None:
        """Hand routed request `rid` to `pod`'s engine (`epp.bench.pd` first sends a split
        request's prefill elsewhere, then calls this with the tokens whose KV was received)."""
        flight = self._inflight[rid]
        ctx, record, now = flight.ctx, flight.record, self.now
        try:
            self.engines[pod].add_request(
                core.EngineRequest(
                    rid,
                    prompt.token_ids,
                    prompt.max_tokens,
                    output_token_ids=prompt.output_token_ids,
                    prefix_digests=prefix,
                    remote_tokens=remote_tokens,
                ),
                now,
            )
        except core.RequestRejected:
            del self._inflight[rid]
            ctx.on_response_headers({":status": "400"}, ctx.booked.hostport)
            ctx.finish(complete=True)
            record.status = 400
            record.finish = now - START
            self._user_done(flight.user, now)
            return
        ctx.on_response_headers(_HEADERS, ctx.booked.hostport)
        self.wake(pod)

    def wake(self, pod: int) -> None:
        """Start `pod`'s next step unless it is stepping."""
        if self._steps[pod] is None:
            self._start_step(pod)

    def director_for_next(self) -> Director:
        """The Director that routes the next request: the one. `epp.bench.replicas` spreads
        requests over several, as Envoy spreads ext-proc streams over epp replicas."""
        return self.director

    def _body(self, prompt: Prompt) -> bytes:
        """The request body for `prompt`, encoded once per prompt object: workloads that resend
        the same prompts (llm-d's 750) would otherwise re-encode thousands of token ids each time."""
        key = (id(prompt.token_ids), prompt.max_tokens)
        known = self._bodies.get(key)
        if known is not None and known[0] is prompt.token_ids:
            return known[1]
        body = msgspec.json.encode(
            {"model": MODEL, "prompt": prompt.token_ids, "max_tokens": prompt.max_tokens, "stream": True}
        )
        # The token list is kept with its body, so its id cannot be reused while the entry lives.
        self._bodies[key] = (prompt.token_ids, body)
        self._body_bytes += len(body)
        while self._body_bytes > _MAX_BODY_BYTES:  # drop the oldest
            _, old = self._bodies.pop(next(iter(self._bodies)))
            self._body_bytes -= len(old)
        return body

    def _start_step(self, pod: int) -> None:
        engine = self.engines[pod]
        res = engine.step(self.now)
        if res.duration <= 0:
            raise RuntimeError(f"engine {engine.name!r} took a step of {res.duration} s with work to do")
        self.result.steps += 1
        self._steps[pod] = res
        self._push(self.now + res.duration, _STEP_END, (pod, res))

    def _step_end(self, payload: tuple[int, core.StepResult]) -> None:
        pod, res = payload
        now = self.now
        if self.prewarms.sent:  # a pre-warm's token and end are nobody's (epp.bench.fast_prewarm)
            res.first_tokens = [r for r in res.first_tokens if not is_prewarm(r.request_id)]
            for r in [r for r in res.finished if is_prewarm(r.request_id)]:
                res.finished.remove(r)
                self.prewarms.finished(r.request_id)
        for req in res.first_tokens:
            flight = self._inflight[req.request_id]
            flight.record.first_token = now - START
            if flight.ctx.sampled:  # an off-sample body never reaches epp
                flight.ctx.tracker.first_chunk_at = now
                flight.ctx.prefill_done()
        for req in res.finished:
            flight = self._inflight.pop(req.request_id)
            record = flight.record
            sampled = flight.ctx.sampled
            if record.first_token is None:  # one step did both (a one-token request)
                record.first_token = now - START
                if sampled:
                    flight.ctx.tracker.first_chunk_at = now
            record.finish = now - START
            record.status = 200
            record.cached_tokens = req.num_cached_tokens
            record.output_tokens = req.num_output_tokens
            record.preemptions = req.num_preemptions
            record.isolated_prefill_s = self.profiles[pod].isolated_prefill_s(
                record.prompt_tokens, req.num_cached_tokens
            )
            if sampled:
                flight.ctx.tracker.usage = Usage(
                    record.prompt_tokens, req.num_output_tokens, req.num_cached_tokens
                )
            else:  # epp sees the stream end, as Envoy ends it, and nothing of the body
                flight.ctx.response_skipped = True
            flight.ctx.finish(complete=True)
            self._user_done(flight.user, now)
        self._finished[pod] += len(res.finished)
        engine = self.engines[pod]
        if self.index is not None:
            events = engine.take_events()
            if events:
                batch = EventBatch(now, events)
                if self.kv_delay_s > 0:
                    self._push(now + self.kv_delay_s, _KV, (engine.name, batch))
                else:
                    self.index.apply(engine.name, batch, model=MODEL)
        self._steps[pod] = None
        if engine.has_unfinished():
            self._start_step(pod)

    def _pod_down(self, pod: int) -> None:
        """A pod's restart begins (`Workload.pod_restarts`): what it was serving fails, as streams
        cut by a crash, and it leaves routing as `epp serve` excludes a pod whose scrapes fail.
        A peer policy's own memory of the pod's cache stays, as a real router's does while its
        health checks mark a worker down."""
        now = self.now
        old = self.engines[pod]
        step = self._steps[pod]
        # A request its step under way would finish is in neither queue, and that step's end is
        # dropped below: it is cut too (a request lost there kept the run from ever draining).
        ending = step.finished if step is not None else []
        for req in (*old.running_requests(), *old.waiting_requests(), *ending):
            rid = req.request_id
            if is_prewarm(rid):
                self.prewarms.finished(rid)
                continue
            flight = self._inflight.pop(rid, None)
            if flight is not None:  # status 0: unfinished, as the live client records a cut stream
                flight.ctx.finish(complete=False)
                self._user_done(flight.user, now)
        if step is not None:
            self._stale_steps[pod] += 1
            self._steps[pod] = None
        self.engines[pod] = core.Engine(old.profile, name=old.name, record_events=self.index is not None)
        self._set_excluded(old.name, True)

    def _pod_up(self, pod: int) -> None:
        """The restarted pod serves again, its cache empty. Its KV-index entries go now, as in
        `epp serve`, where the scraper's readmission purges a pod whose KV-event feed was lost
        (`epp.kvcache.ingest.KVEventIngester.pod_back`)."""
        name = self.engines[pod].name
        if self.index is not None:
            self.index.remove_pod(name)
        self._set_excluded(name, False)
        self.result.pod_restarts += 1

    def _set_excluded(self, name: str, excluded: bool) -> None:
        for ep in self.datastore.endpoints():
            if ep.name == name:
                ep.excluded = excluded
                ep.scrape_failures = 0
        self.datastore.refresh_candidates()

    def _user_done(self, user: int, now: float) -> None:
        if user >= 0:
            self._schedule_user(user, now - START)

    def _scrape(self) -> None:
        pods = self.endpoints  # none before a cold start's pods are up
        waiting, running, usage = self.scrapes.refresh(
            self.now, pods, self.engines[: len(pods)], self._finished
        )
        queued = {b.priority: b.len for b in self.flow.registry.ordered} if self.flow is not None else {}
        self.result.samples.append(Sample(self.now - START, waiting, running, usage, queued))


class _TimerHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Objectives:
    """The benchmark's InferenceObjectives: `priority-<n>` has priority n."""

    def priority_of(self, name: str) -> int | None:
        if name.startswith(OBJECTIVE_PREFIX):
            try:
                return int(name[len(OBJECTIVE_PREFIX) :])
            except ValueError:
                return None
        return None


def pod_profiles_of(profile: Profile, pods: int, pod_profiles: Sequence[Profile] | None) -> list[Profile]:
    """Each pod's profile: `pod_profiles` (one per pod, one block size) or `profile` for all."""
    if pod_profiles is None:
        return [profile] * pods
    if len(pod_profiles) != pods:
        raise ValueError(f"{len(pod_profiles)} pod profiles for {pods} pods")
    if len({p.block_size for p in pod_profiles}) > 1:
        raise ValueError("a mixed fleet needs one block size (the prefix digests are shared)")
    return list(pod_profiles)
