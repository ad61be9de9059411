"""Flow control: priorities, fairness and bounded queues in front of the scheduler (llm-d's).

When the pool is saturated, a request is held in epp (its ext-proc stream unanswered) instead of
being sent on to a model server whose queue is already long, and released by priority band,
fairness between flows and ordering within a flow as capacity frees; it is shed with a clear
answer when it waited too long or the queues are full. Off unless the EndpointPickerConfig has
`featureGates: [flowControl]` (then GIE's legacy admission applies: epp.requestcontrol.admission).

    config.py          the `flowControl` section and the flow-control plugin types
    controller.py      admit(): hold, dispatch cycles, budgets, limits, shutdown
    queues.py          per-flow queues, priority bands, totals
    fairness.py        global-strict, round-robin;  program_aware.py: program-aware (LAS)
    ordering.py        fcfs, edf, slo-deadline
    usage_limits.py    static, soft-reflective-ceiling, priority-holdback
    eviction.py        cutting in-flight sheddable requests for higher priorities (enableEviction)
    outcomes.py        outcomes -> 429/503 and x-llm-d-request-dropped-reason
    metrics.py         llm-d's, GIE's and epp's series

It sits between request control (which calls `admit`) and scheduling; it imports neither gRPC,
Envoy, the ext-proc layer nor Kubernetes (lint-imports). docs/flow-control.md explains each knob.
"""
