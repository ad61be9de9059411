"""Prefill/decode (and encode) disaggregation: llm-d's `disagg-profile-handler` and its deciders,
and epp's own decider, run by `runner.DisaggScheduler` (several profiles per request).

- `handler`: the profile handlers (`disagg-profile-handler`, llm-d's deprecated
  `pd-profile-handler`) and the deprecated header handlers; the handler's pre-request hook names
  the chosen prefill and encode pods in `x-prefiller-host-port` / `x-encoder-hosts-ports`.
- `deciders`: llm-d's `prefix-based-pd-decider`, `always-disagg-pd-decider`,
  `always-disagg-multimodal-decider`.
- `latency_decider`: `pd-latency-decider`, epp's: split only where the request's time to first
  token, as request-latency-scorer prices it, is lower with a remote prefill plus the KV transfer
  than with the decode pod's own prefill, onto the cheapest prefill pod for that decode pod.
- `runner`: the multi-profile scheduling run, built by `epp.scheduling.config` when a
  configuration has a disaggregation handler.

docs/disaggregation.md tells how a request flows, the sidecar included (`epp.sidecar`).
"""

from epp.scheduling.disagg import deciders, handler, latency_decider

__all__ = ["deciders", "handler", "latency_decider"]
