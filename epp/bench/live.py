"""Live mode: one workload, one arm (epp with a policy, or a real peer router), in real time.

Where fast mode (`epp.bench.fast`) runs the scheduler in-process in virtual time, live mode runs
what a user deploys, on 127.0.0.1:

- a fleet of simulated vLLM pods (`epp.sim.fleet.SimFleet`, one HTTP server per pod on this
  process's background thread) running the workload's engine profile in real time, multiplied by
  `time_scale`; they publish vLLM KV events when the policy reads them;
- the arm's router in front (`epp.bench.gateways`): `epp serve` as a subprocess with the policy's
  EndpointPickerConfig behind a real Envoy (ext-proc FULL_DUPLEX_STREAMED, ORIGINAL_DST to the pod
  epp picks), as users run it; or a peer's own binary (`epp.bench.peers`) with the pods as its
  workers;
- the workload's requests, the same seeded prompts as in fast mode, as text that the pods
  tokenize back to the workload's token ids (`epp.bench.words`: routers that match text need
  text), sent at their arrival times (open loop) or by their users (closed loop) as streaming
  `/v1/completions` with usage, by an aiohttp client. A request's TTFT is the time to its first SSE
  data line; its cached tokens are what the pod reported in
  `usage.prompt_tokens_details.cached_tokens`.

Besides the requests, a run records the router's CPU seconds over the measured stretch (from the
fleet's reset to the drain's end) and the fleet's own prefix-cache counters (hits and queries, in
tokens, summed over the pods), so that every arm's hit rate comes from the same place.

Priorities and tenants (`Prompt.priority`, `fairness_id`) travel as in fast mode: an objective
named `priority-<n>` (the endpoints file lists them, `objectives:`) and the fairness-ID header.
Each sample also reads how many requests epp's flow control holds per band, from its /metrics.

Every time is reported in simulated seconds: a wall duration divided by `time_scale`, so the
table compares with fast mode's. That also divides what is not simulated: epp's decision, Envoy's
hops and the client's own latency (~1-3 ms of wall time a request here) are inflated by
1/time_scale in the report; keep time_scale near 1 where TTFTs are a few milliseconds.

A run takes the workload's duration x time_scale of wall time, plus the drain. Unlike fast mode it
is not deterministic: the processes' timing decides the interleaving (and epp's random tie-breaks
are not seeded). Per-request preemptions are not visible over HTTP, so the records carry 0 and
the fleet's total is logged. Everything started is stopped on the way out, errors included.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from epp.bench import inference_perf, records
from epp.bench.fast import (
    FAIRNESS_HEADER,
    MODEL,
    OBJECTIVE_PREFIX,
    pod_profiles_of,
)
from epp.bench.gateways import HOST, REQUEST_TIMEOUT_S, EppGateway, Gateway
from epp.bench.records import RunResult, Sample
from epp.bench.reuse import ReuseBound
from epp.bench.words import WordCodec
from epp.bench.workload import ClosedLoop, OpenLoop, Prompt, Workload
from epp.requestcontrol.admission import OBJECTIVE_HEADER
from epp.sim.profiles import Profile

if TYPE_CHECKING:
    import aiohttp

    from epp.sim.fleet import SimFleet

SAMPLE_EVERY_S = 0.1
"""Wall seconds between two samples of the fleet's queues and KV usage (for the report's mean queue
depth and load spread; epp scrapes on its own, every 50 ms)."""


class LiveRun:
    """One arm over one workload through its router; `run()` once."""

    def __init__(
        self,
        workload: Workload,
        gateway: Gateway,
        *,
        profile: Profile,
        pods: int,
        seed: int,
        time_scale: float,
        workdir: Path,
        progress: Callable[[float], None] | None = None,
        pod_profiles: Sequence[Profile] | None = None,
        client: str = "epp",
        peers_dir: Path | None = None,
        request_headers: Mapping[str, str] | None = None,
    ) -> None:
        """`client`: "epp" (this module's aiohttp client, the workload's own prompts) or
        "inference-perf" (`epp.bench.inference_perf`: the workload's inference-perf form, run by
        the binary under `peers_dir`). `request_headers` go with every request the epp client
        sends (`epp bench --slo-headers`: the latency targets as x-slo-*)."""
        if pods <= 0:
            raise ValueError(f"pods must be > 0, got {pods}")
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if workload.pods_ready_at:
            raise ValueError(
                f"workload {workload.name!r} starts from zero pods, which live mode does not model"
            )
        self.workload = workload
        self.gateway = gateway
        self.profile = profile
        self.profiles = pod_profiles_of(profile, pods, pod_profiles)
        if client not in ("epp", "inference-perf"):
            raise ValueError(f"unknown client {client!r}; allowed: epp, inference-perf")
        self.client = client
        if request_headers and client != "epp":
            raise ValueError("request_headers need the epp client; inference-perf sends its own")
        self.request_headers = dict(request_headers or {})
        self.peers_dir = peers_dir or Path(".venv-peers")
        self.pods = pods
        self.time_scale = time_scale
        self.workdir = workdir
        self.progress = progress
        self.logs = gateway.logs  # (what, log file) of every process started
        self.result = RunResult(workload.name, gateway.name, seed, pods, profile.name, [], [])
        self._reuse = ReuseBound(profile.block_size)
        self.errors: list[str] = []  # the first few failed requests' errors, for the log
        self.preemptions = 0  # the fleet's total (per-request counts are not visible over HTTP)
        # How far this machine fell behind the workload's clock (wall seconds): the pods' step
        # loops (the most any pod gave up catching up) and the client's sends (the latest send).
        self.pods_behind_s = 0.0
        self.client_behind_s = 0.0
        self._t0 = 0.0
        self._codec = WordCodec()
        # (id of token ids, max_tokens, id of output ids) -> (token ids, output ids, body): the
        # lists are kept with the body, so their ids cannot be reused while the entry lives.
        self._bodies: dict[tuple[int, int, int], tuple[Sequence[int], object, bytes]] = {}

    # --- the stack --------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Start the stack, run the workload to its drain, stop everything; returns the result."""
        from epp.sim.engine import SimConfig
        from epp.sim.fleet import SimFleet

        kv = f"tcp://{HOST}:0" if self.gateway.kv_events else None
        configs = [
            SimConfig.from_profile(
                prof,
                name=f"pod-{i}",
                served_model=MODEL,
                time_scale=self.time_scale,
                kv_events=kv,
                max_output_tokens=1 << 20,  # the workload says how many; never cut
            )
            for i, prof in enumerate(self.profiles)
        ]
        started = time.perf_counter()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with SimFleet(configs, host=HOST) as fleet:
            self._run_on(fleet)
            stats = fleet.stats()
        self.preemptions = sum(int(s["preemptions"]) for s in stats)
        self.pods_behind_s = max(float(s["lag_dropped_s"]) for s in stats)
        self.result.wall_s = time.perf_counter() - started
        return self.result

    def _run_on(self, fleet: SimFleet) -> None:
        # File names for the configs and logs (a trace's workload name holds its path).
        label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.workload.name}-{self.gateway.name}").strip("_")
        try:
            base_url = self.gateway.start(fleet, self.workdir, label)
            # Start measuring from cold caches and zeroed counters (the probe touched no engine).
            fleet.reset()
            cpu_before = self.gateway.cpu_seconds()
            if self.client == "inference-perf":
                asyncio.run(self._drive_inference_perf(base_url, fleet, label))
            else:
                asyncio.run(self._drive(base_url, fleet))
            self.result.router_cpu_s = self.gateway.cpu_seconds() - cpu_before
            stats = fleet.stats()
            self.result.fleet_prefix_hits = sum(int(s["prefix_cache_hits"]) for s in stats)
            self.result.fleet_prefix_queries = sum(int(s["prefix_cache_queries"]) for s in stats)
            self.result.fleet_requests_per_pod = [int(s["completed"]) for s in stats]
            self.result.pod_restarts = sum(fleet.restarts)
            self.gateway.save(self.workdir, label)
        finally:
            self.gateway.stop()

    # --- the load ---------------------------------------------------------------------------------

    def _virtual(self, wall: float) -> float:
        """Simulated seconds since the start of the run at perf_counter() == `wall`."""
        return (wall - self._t0) / self.time_scale

    async def _sleep_until(self, t: float) -> None:
        delay = self._t0 + t * self.time_scale - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            self.client_behind_s = max(self.client_behind_s, -delay)

    async def _drive(self, base_url: str, fleet: SimFleet) -> None:
        import aiohttp

        url = base_url + "/v1/completions"
        wl = self.workload
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        # No connection limit: an open-loop client must not queue requests the fleet should see.
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self._t0 = time.perf_counter()
            sampler = asyncio.create_task(self._sample(fleet, session))
            restarts = asyncio.create_task(self._restart_pods(fleet))
            try:
                async with asyncio.TaskGroup() as group:
                    if isinstance(wl, ClosedLoop):
                        for user in range(wl.users):
                            group.create_task(self._user(session, url, user))
                    elif isinstance(wl, OpenLoop):
                        for t, prompt in wl.arrivals():
                            await self._sleep_until(t)
                            group.create_task(self._send(session, url, prompt))
                            self._report(t)
                await restarts
            finally:
                sampler.cancel()
                restarts.cancel()
                await asyncio.gather(sampler, restarts, return_exceptions=True)
        self.result.end = self._virtual(time.perf_counter())

    async def _restart_pods(self, fleet: SimFleet) -> None:
        """The workload's pod restarts (`Workload.pod_restarts`), each at its time; returns once
        every restarted pod serves again."""
        pending = []
        for t, pod, down in sorted(self.workload.pod_restarts):
            if not 0 <= pod < self.pods:
                raise ValueError(f"workload {self.workload.name!r} restarts pod {pod} of {self.pods}")
            await self._sleep_until(t)
            pending.append(asyncio.wrap_future(fleet.restart(pod, down * self.time_scale)))
        await asyncio.gather(*pending)

    async def _drive_inference_perf(self, base_url: str, fleet: SimFleet, label: str) -> None:
        """inference-perf sends the load (its own prompts); its per-request report is the record."""
        import aiohttp

        form = self.workload.inference_perf_form()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            self._t0 = time.perf_counter()
            sampler = asyncio.create_task(self._sample(fleet, session))
            restarts = asyncio.create_task(self._restart_pods(fleet))
            try:
                out = await asyncio.to_thread(
                    inference_perf.run,
                    self.peers_dir,
                    form,
                    base_url,
                    self.workdir,
                    label,
                    time_scale=self.time_scale,
                )
                await restarts
            finally:
                sampler.cancel()
                restarts.cancel()
                await asyncio.gather(sampler, restarts, return_exceptions=True)
        self.result.records = inference_perf.records(out, time_scale=self.time_scale)
        self.result.end = self._virtual(time.perf_counter())

    async def _user(self, session: aiohttp.ClientSession, url: str, user: int) -> None:
        wl = self.workload
        assert isinstance(wl, ClosedLoop)
        now = 0.0
        while (nxt := wl.next_request(user, now)) is not None:
            t, prompt = nxt
            await self._sleep_until(t)
            self._report(t)
            await self._send(session, url, prompt)
            now = max(t, self._virtual(time.perf_counter()))

    async def _send(self, session: aiohttp.ClientSession, url: str, prompt: Prompt) -> None:
        from epp.demo.workload import RequestResult, post_streaming

        sent = time.perf_counter()
        record = records.arrived(prompt, self._virtual(sent), self._reuse.add(prompt))
        self.result.records.append(record)
        res = RequestResult(index=len(self.result.records), group=0)
        headers = dict(self.request_headers)
        if prompt.priority:
            headers[OBJECTIVE_HEADER] = f"{OBJECTIVE_PREFIX}{prompt.priority}"
        if prompt.fairness_id:
            headers[FAIRNESS_HEADER] = prompt.fairness_id
        await post_streaming(session, url, self._body(prompt), res, headers)
        record.dropped = res.dropped
        if res.pod.startswith("pod-"):
            record.pod = int(res.pod[4:])
        if not math.isnan(res.ttft_s):
            record.first_token = record.arrival + res.ttft_s / self.time_scale
        if res.status == 200 and not res.error:
            record.status = 200
            record.finish = record.arrival + res.latency_s / self.time_scale
        elif res.status not in (0, 200):
            # Refused (epp's 429/503, vLLM's 400): when the answer came (flow control may have
            # held the request first).
            record.status = res.status
            record.finish = self._virtual(time.perf_counter())
        # else: no answer or a broken stream; status 0 counts it as unfinished
        if res.error and len(self.errors) < 5:
            self.errors.append(res.error)
        record.cached_tokens = res.cached_tokens
        record.output_tokens = res.completion_tokens

    def _body(self, prompt: Prompt) -> bytes:
        """The request for `prompt`, encoded once per token list and length (workloads resend prompts)."""
        key = (id(prompt.token_ids), prompt.max_tokens, id(prompt.output_token_ids))
        known = self._bodies.get(key)
        if known is not None and known[0] is prompt.token_ids and known[1] is prompt.output_token_ids:
            return known[2]
        body: dict[str, Any] = {
            "model": MODEL,
            "prompt": self._codec.text(prompt.token_ids),
            "max_tokens": prompt.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if prompt.output_token_ids is not None:
            body["sim_output_token_ids"] = self._codec.pod_ids(prompt.output_token_ids)
        encoded = msgspec.json.encode(body)
        if len(self._bodies) > 4096:  # bounded: the oldest first
            del self._bodies[next(iter(self._bodies))]
        self._bodies[key] = (prompt.token_ids, prompt.output_token_ids, encoded)
        return encoded

    async def _sample(self, fleet: SimFleet, session: aiohttp.ClientSession) -> None:
        """The fleet's queues and KV usage every SAMPLE_EVERY_S, read from the pods' state, and
        the requests epp's flow control holds per band, from its /metrics."""
        loop = asyncio.get_running_loop()
        while True:
            stats = await loop.run_in_executor(None, fleet.stats)
            self.result.samples.append(
                Sample(
                    self._virtual(time.perf_counter()),
                    [int(s["waiting"]) for s in stats],
                    [int(s["running"]) for s in stats],
                    [float(s["kv_cache_usage_perc"]) for s in stats],
                    await self._queued(session),
                )
            )
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def _queued(self, session: aiohttp.ClientSession) -> dict[int, int]:
        if not isinstance(self.gateway, EppGateway) or not self.gateway.flow_control:
            # Only epp's flow control holds requests; a page read 10 times a second would cost
            # the router CPU (16% of epp's in a profiled shared-prefix run), so none is read.
            return {}
        try:
            async with session.get(self.gateway.metrics_url) as resp:
                text = await resp.text()
        except (OSError, TimeoutError) as exc:  # aiohttp.ClientError is an OSError
            if len(self.errors) < 5:
                self.errors.append(f"reading epp's /metrics: {exc}")
            return {}
        return {
            int(m[1]): int(float(m[2]))
            for m in re.finditer(
                r'^epp_flow_control_queued_requests\{priority="(-?\d+)"\} (\S+)$', text, re.M
            )
        }

    @property
    def behind_s(self) -> float:
        """Wall seconds the stack fell behind the workload's clock (0.0 when it kept up)."""
        return max(self.pods_behind_s, self.client_behind_s)

    def _report(self, t: float) -> None:
        duration = self.workload.duration
        if self.progress is not None:
            self.progress(min(1.0, t / duration) if duration else 1.0)
