"""GPU utilization from NVIDIA's DCGM exporter, per endpoint: llm-d's `dcgm-data-source` with its
`dcgm-extractor`.

Every endpoint's exporter is polled (`scheme://<pod IP or, with useNodeAddress, its node's
address>:<port><path>`, llm-d's defaults `http`, 9400, `/metrics`) every `interval`, and the
largest `DCGM_FI_DEV_GPU_UTIL` over the endpoint's GPUs, divided by 100, becomes its
`("GPUUtilization", "dcgm-extractor")` attribute (`Endpoint.attributes`), which
`endpoint-attribute-filter` and `-scorer` read. Samples carrying a `pod` label count only for
that pod (a DaemonSet exporter lists every pod of the node); samples without one count for every
endpoint polled there (a sidecar exporter).

As in llm-d, a failed poll keeps the last value and is logged (at debug, since an exporter that
is down fails every interval); an endpoint never polled successfully has no attribute, which the
filter's `onMissing` and the scorer (0) handle. Loops follow the datastore as the metrics
scraper's do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random

import aiohttp

from epp import tasks
from epp.datastore import promtext
from epp.datastore.endpoints import Datastore, Endpoint

log = logging.getLogger(__name__)

GPU_UTILIZATION = ("GPUUtilization", "dcgm-extractor")  # llm-d's GPUUtilizationDataKey
METRIC = b"DCGM_FI_DEV_GPU_UTIL"
MAX_BODY_BYTES = 8 * 1024 * 1024


class DcgmError(Exception):
    """A poll that gave no utilization; the message says why."""


@dataclasses.dataclass(frozen=True, slots=True)
class DcgmSource:
    """One `dcgm-data-source` plugin's settings."""

    name: str = "dcgm-data-source"
    scheme: str = "http"
    path: str = "/metrics"
    port: int = 9400
    insecure_skip_verify: bool = True
    use_node_address: bool = False
    interval: float = 0.05  # seconds; llm-d rounds it to --refresh-metrics-interval's multiple


def utilization(page: bytes, pod: str) -> float:
    """The largest GPU utilization of `pod` on a DCGM exporter page, as a fraction (0..1)."""
    samples = promtext.samples(page, METRIC)
    if not samples:
        raise DcgmError(f"metric {METRIC.decode()} not found in DCGM response")
    best: float | None = None
    for block, value in samples:
        if pod and block:
            owner = promtext.parse_labels(block).get("pod")
            if owner is not None and owner != pod:
                continue
        if math.isfinite(value) and (best is None or value > best):
            best = value
    if best is None:
        raise DcgmError(f"metric {METRIC.decode()} present but has no samples for pod {pod!r}")
    return best / 100.0


class DcgmPoller:
    """Polls one DCGM source for every datastore endpoint; see the module docstring."""

    def __init__(self, datastore: Datastore, source: DcgmSource, *, timeout: float | None = None) -> None:
        self._datastore = datastore
        self.source = source
        self.timeout = timeout if timeout is not None else max(source.interval * 20, 1.0)
        self._ssl = not (source.scheme == "https" and source.insecure_skip_verify)
        self._session: aiohttp.ClientSession | None = None
        self._loops: dict[Endpoint, asyncio.Task[None]] = {}
        self._subscribed = False

    async def start(self) -> None:
        if self._session is not None:
            return
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout), connector=aiohttp.TCPConnector(limit=0)
        )
        if not self._subscribed:
            self._datastore.subscribe(self._on_change)
            self._subscribed = True
        self._on_change(self._datastore.endpoints(), [])
        log.info(
            "polling DCGM exporters (%s, port %d%s) of %d endpoints every %gs",
            self.source.name,
            self.source.port,
            ", node addresses" if self.source.use_node_address else "",
            len(self._loops),
            self.source.interval,
        )

    async def stop(self) -> None:
        session, self._session = self._session, None
        loops = list(self._loops.values())
        self._loops.clear()
        await tasks.cancel_and_wait(loops)
        if session is not None:
            await session.close()

    def _on_change(self, added: list[Endpoint], removed: list[Endpoint]) -> None:
        for ep in removed:
            task = self._loops.pop(ep, None)
            if task is not None:
                task.cancel()
        if self._session is None:
            return
        for ep in added:
            if ep not in self._loops:
                self._loops[ep] = tasks.create_guarded_task(
                    self._loop(ep), name=f"dcgm {ep.name}", logger=log
                )

    async def _loop(self, ep: Endpoint) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(random.uniform(0, self.source.interval))
        next_at = loop.time()
        while True:
            try:
                ep.attributes[GPU_UTILIZATION] = utilization(await self._fetch(ep), ep.spec.pod)
            except Exception as e:  # any failure: keep the last value (llm-d does)
                log.debug("DCGM poll of %s failed: %s", ep.name, e or type(e).__name__)
            next_at = max(next_at + self.source.interval, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _fetch(self, ep: Endpoint) -> bytes:
        spec = ep.spec
        address = spec.node_address if self.source.use_node_address else spec.address
        if not address:
            raise DcgmError("no node address known for the endpoint")
        host = f"[{address}]" if ":" in address else address
        url = f"{self.source.scheme}://{host}:{self.source.port}{self.source.path}"
        assert self._session is not None
        async with self._session.get(url, ssl=self._ssl) as resp:
            if resp.status != 200:
                raise DcgmError(f"HTTP {resp.status}")
            body = await resp.content.read(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                raise DcgmError(f"body exceeds {MAX_BODY_BYTES} bytes")
            return body
