"""Admission: whether a request may be scheduled at all, decided before the scheduler runs.

This is GIE's legacy admission controller (the one GIE runs while flow control is off):

- a request's priority comes from its InferenceObjective (header `x-llm-d-inference-objective`,
  llm-d's, or `x-gateway-inference-objective`, GIE's; none named, or an unknown name, is
  priority 0);
- priority >= 0 is always admitted: saturation is the scheduler's problem then, not a refusal;
- priority < 0 ("sheddable") is refused with 429 "system saturated, sheddable request dropped"
  while the saturation detector reports the candidates as saturated (>= 1.0). No candidates
  counts as saturated.

Nothing is queued: a refused request is answered at once and the client may retry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from epp.api import errors
from epp.api.requests import InferenceRequest
from epp.datastore.endpoints import Endpoint
from epp.scheduling import interfaces

OBJECTIVE_HEADER = "x-gateway-inference-objective"  # GIE's name, which llm-d still reads
OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", OBJECTIVE_HEADER)  # the first present wins
SHED_REASON = "system saturated, sheddable request dropped"


class Objectives(Protocol):
    """What admission needs of the InferenceObjective store (`epp.k8s.objectives` in pool mode)."""

    def priority_of(self, name: str) -> int | None:
        """The priority of the objective called `name` in the pool; None when there is none."""
        ...


def objective(headers: Mapping[str, str]) -> str | None:
    """The InferenceObjective a request names, llm-d's header first."""
    for name in OBJECTIVE_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


def priority(objectives: Objectives | None, objective: str | None) -> int:
    """The request's priority: its objective's, or 0 when it names none or an unknown one (GIE)."""
    if not objective or objectives is None:
        return 0
    found = objectives.priority_of(objective)
    return 0 if found is None else found


class LegacyAdmissionController:
    """Sheds sheddable requests while the pool is saturated; admits everything else."""

    def __init__(self, detector: interfaces.SaturationDetector) -> None:
        self.detector = detector

    def admit(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        """Return if `request` may be scheduled on `candidates`; raise `errors.NoCapacity` if not."""
        if request.priority >= 0:
            return
        saturation = self.detector.saturation(candidates) if candidates else 1.0
        if saturation >= 1.0:
            raise errors.NoCapacity(SHED_REASON)
