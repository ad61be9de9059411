"""Legacy admission: sheddable requests get 429 while the pool is saturated; others always pass.
Also through the Director: the objective header sets the priority, and the metrics carry it."""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec
import pytest

from epp.api import errors
from epp.api.requests import Api, InferenceRequest
from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.k8s import objectives
from epp.observability import metrics
from epp.requestcontrol import admission
from epp.requestcontrol.director import Director
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: concurrency-detector
    parameters: {maxConcurrency: 1}
saturationDetector:
  pluginRef: concurrency-detector
"""


class FixedDetector:
    """A detector that reports a set saturation."""

    type = "fixed"
    name = "fixed"

    def __init__(self, value: float) -> None:
        self.value = value
        self.calls = 0

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        self.calls += 1
        return self.value


def request(priority: int) -> InferenceRequest:
    r = InferenceRequest(request_id="r", api=Api.COMPLETIONS, path="/v1/completions", headers={})
    r.priority = priority
    return r


def endpoint() -> Endpoint:
    spec = EndpointSpec(name="e", address="10.0.0.1", port=8000)
    return Endpoint(spec=spec, hostport=spec.hostport)


@pytest.mark.parametrize(
    ("priority", "saturation", "admitted"),
    [
        (0, 5.0, True),  # never shed: not sheddable
        (7, 1.0, True),
        (-1, 0.99, True),
        (-1, 1.0, False),
        (-3, 2.5, False),
    ],
)
def test_legacy_admission(priority: int, saturation: float, admitted: bool) -> None:
    detector = FixedDetector(saturation)
    controller = admission.LegacyAdmissionController(detector)
    if admitted:
        controller.admit(request(priority), [endpoint()])
    else:
        with pytest.raises(errors.NoCapacity) as info:
            controller.admit(request(priority), [endpoint()])
        assert info.value.status == 429
        assert info.value.reason == "system saturated, sheddable request dropped"
    assert detector.calls == (1 if priority < 0 else 0)  # non-sheddable requests skip the detector


def test_no_candidates_is_saturated() -> None:
    controller = admission.LegacyAdmissionController(FixedDetector(0.0))
    with pytest.raises(errors.NoCapacity):
        controller.admit(request(-1), [])
    controller.admit(request(0), [])


def test_priority_from_objectives() -> None:
    store = objectives.ObjectiveStore()
    store.replace({"batch": -1, "chat": 5})
    assert admission.priority(store, "batch") == -1
    assert admission.priority(store, "chat") == 5
    assert admission.priority(store, "unknown") == 0  # as GIE: unknown objective is priority 0
    assert admission.priority(store, None) == 0
    assert admission.priority(None, "batch") == 0  # standalone: no objectives at all


# ---- through the Director ----------------------------------------------------------------------


def make_director(store: objectives.ObjectiveStore | None) -> tuple[Director, Datastore]:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name="pod-0", address="10.0.0.1", port=8000)])
    ds.candidates()[0].metrics.updated_at = time.monotonic()
    cfg = sched_config.load_config(CONFIG, Handle(datastore=ds))
    director = Director(
        datastore=ds,
        scheduler=cfg.scheduler,
        admission_controller=admission.LegacyAdmissionController(cfg.saturation_detector),
        objectives=store,
    )
    return director, ds


BODY = msgspec.json.encode({"model": "m", "prompt": "hi"})


def routed(priority: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "inference_objective_request_total",
        {"model_name": "m", "target_model_name": "m", "priority": priority},
    )
    return value or 0.0


def shed() -> float:
    value = metrics.REGISTRY.get_sample_value(
        "inference_objective_request_error_total",
        {"model_name": "m", "target_model_name": "m", "error_code": "ResourceExhausted"},
    )
    return value or 0.0


async def test_director_sheds_sheddable_requests_once_saturated() -> None:
    store = objectives.ObjectiveStore()
    store.replace({"batch": -1, "chat": 2})
    director, _ = make_director(store)
    batch = {"x-gateway-inference-objective": "batch"}
    chat = {"x-gateway-inference-objective": "chat"}
    shed_before, batch_before = shed(), routed("-1")

    first = await director.route(path="/v1/completions", headers=batch, body=BODY, subset=None)
    assert first.request.priority == -1  # admitted: nothing in flight yet (0 / 1)
    # Now 1 in flight of a capacity of 1: saturated.
    with pytest.raises(errors.NoCapacity, match="sheddable request dropped"):
        await director.route(path="/v1/completions", headers=batch, body=BODY, subset=None)
    assert shed() == shed_before + 1  # counted as GIE counts a shed: an error, not a request
    assert routed("-1") == batch_before + 1
    chat_before = routed("2")
    ctx = await director.route(path="/v1/completions", headers=chat, body=BODY, subset=None)
    assert routed("2") == chat_before + 1  # counted when routed, with its priority
    assert ctx.request.priority == 2  # admitted despite saturation
    unknown = await director.route(
        path="/v1/completions", headers={"x-gateway-inference-objective": "nope"}, body=BODY, subset=None
    )
    assert unknown.request.priority == 0

    for c in (ctx, first, unknown):
        c.finish(complete=True)
    again = await director.route(path="/v1/completions", headers=batch, body=BODY, subset=None)
    again.finish(complete=True)


async def test_without_objectives_every_request_is_priority_zero() -> None:
    director, _ = make_director(None)
    headers = {"x-gateway-inference-objective": "batch"}
    ctxs = [
        await director.route(path="/v1/completions", headers=headers, body=BODY, subset=None)
        for _ in range(3)
    ]
    assert [c.request.priority for c in ctxs] == [0, 0, 0]  # never shed, even past capacity
    for c in ctxs:
        c.finish(complete=True)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-llm-d-inference-objective": "chat"}, 2),  # llm-d v0.10's header
        ({"x-gateway-inference-objective": "chat"}, 2),  # GIE's, which llm-d still reads
        ({"x-llm-d-inference-objective": "batch", "x-gateway-inference-objective": "chat"}, -1),
        ({"x-llm-d-inference-objective": "", "x-gateway-inference-objective": "chat"}, 2),
        ({}, 0),
    ],
)
def test_the_objective_header_llm_d_name_first(headers: dict[str, str], expected: int) -> None:
    store = objectives.ObjectiveStore()
    store.replace({"batch": -1, "chat": 2})
    assert admission.priority(store, admission.objective(headers)) == expected
