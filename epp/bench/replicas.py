"""Active-active epp replicas in fast mode: `epp bench --replicas N`.

Several epp pods behind one gateway each run their own scheduler: Envoy opens one ext-proc stream
per HTTP request and spreads the streams over the epp endpoints of its cluster (round robin by
default). `ReplicatedRun` is `FastRun` (`epp.bench.fast`) with N such schedulers instead of one:

- private to each replica, as in separate processes: the `Datastore` endpoints and their in-flight
  bookings, the scheduler's plugin instances (speculative index entries of
  `precise-prefix-cache-scorer`, the learned per-pod rates of `predicted-ttft-scorer`, the
  approximate prefix table of `prefix-cache-scorer`, every picker's own state) and the `Director`;
- shared, because every replica reads them from the same sources: the KV-event `BlockIndex`
  (each replica subscribes to every pod's ZMQ publisher and applies the same events) and the
  scraped `/metrics` of every pod (each replica scrapes the same pods; here on the same tick).

Requests go to the replicas in turn, as Envoy's round robin spreads streams, so each replica sees
1/N of the traffic and learns only from the responses it routed. A replica's booking is visible
to the others only through what the pods then report: the scraped queue and running counts, and
the KV events of the prefill it started. N = 1 is exactly `FastRun`.
"""

from __future__ import annotations

from typing import Any

from epp.bench.fast import FastRun
from epp.datastore.endpoints import Datastore, Endpoint
from epp.requestcontrol import admission
from epp.requestcontrol.director import Director, plugin_hooks
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle

MAX_REPLICAS = 64


class ReplicatedRun(FastRun):
    """`FastRun` over `replicas` independent schedulers sharing the KV index and the scrapes."""

    def __init__(self, *args: Any, replicas: int, **kwargs: Any) -> None:
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be in [1, {MAX_REPLICAS}], got {replicas}")
        super().__init__(*args, **kwargs)
        if self.flow is not None and replicas > 1:
            raise ValueError(
                f"policy {self.policy.name!r} has flow control, which --replicas does not model "
                "(each replica would hold its own queue); run it with one replica"
            )
        if self.workload.pods_ready_at:
            raise ValueError(
                f"workload {self.workload.name!r} starts from zero pods, which --replicas does not model"
            )
        self.replicas = replicas
        self.directors: list[Director] = [self.director]
        self.replica_endpoints: list[list[Endpoint]] = [self.endpoints]
        specs = [ep.spec for ep in self.endpoints]
        for _ in range(replicas - 1):
            store = Datastore()
            store.sync("bench", specs)
            # The same configuration text builds new plugin instances: nothing learned is shared.
            cfg = sched_config.load_config(
                self.policy.config_text(),
                Handle(datastore=store, kv_index=self.index),
                allow_experimental=True,
            )
            self.directors.append(
                Director(
                    datastore=store,
                    scheduler=cfg.scheduler,
                    **plugin_hooks(cfg),
                    settings=self.settings,
                    admission_controller=admission.LegacyAdmissionController(cfg.saturation_detector),
                    # One for all: its request ids must be unique in the engines. Its bounds then
                    # hold for the replicas together, where each live replica bounds its own.
                    prewarmer=self.prewarms,
                )
            )
            self.replica_endpoints.append(list(store.endpoints()))
        self.routed = [0] * replicas  # requests each replica routed (or refused)
        self._turn = 0

    def director_for_next(self) -> Director:
        turn = self._turn
        self._turn = (turn + 1) % self.replicas
        self.routed[turn] += 1
        return self.directors[turn]

    def _scrape(self) -> None:
        super()._scrape()
        # Every replica scrapes the same pods: each tick's metrics objects are new, so share them.
        first = self.replica_endpoints[0]
        for eps in self.replica_endpoints[1:]:
            for ep, src in zip(eps, first, strict=True):
                ep.metrics = src.metrics
