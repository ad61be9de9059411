"""llm-d v0.10's plugins built in epp: topology affinity, endpoint attributes, session affinity and
agent identity, the probabilistic admitter, GIE's served-endpoint verifier, the load and label
plugins; and the director's request-control hooks that run them."""

from __future__ import annotations

import base64
import dataclasses
import time
from typing import Any

import msgspec
import pytest

from epp.api import errors
from epp.api.requests import InferenceRequest
from epp.datastore.dcgm import GPU_UTILIZATION
from epp.datastore.endpoints import Datastore, Endpoint, EndpointSpec
from epp.flowcontrol.controller import fairness_id
from epp.k8s import objectives
from epp.requestcontrol.director import Director
from epp.scheduling import config, interfaces
from epp.scheduling.datalayer import TopologyLabels
from epp.scheduling.disagg import runner
from epp.scheduling.plugins import topology_affinity

from . import builders

E = builders.endpoint


def labelled(name: str, **labels: str) -> Endpoint:
    spec = EndpointSpec(name=name, address="10.0.0.1", port=8000, labels=labels, namespace="ns")
    return Endpoint(spec=spec, hostport=spec.hostport)


def req(**headers: str) -> InferenceRequest:
    return builders.request(headers=headers)


# ---- topology ----------------------------------------------------------------------------------


def test_the_peer_key_is_the_disagg_runners() -> None:
    assert topology_affinity.PEER_KEY == runner.PEER_KEY


def test_topology_filter_and_scorer_follow_the_peer() -> None:
    zone, host = "topology.kubernetes.io/zone", "kubernetes.io/hostname"
    peer = labelled("decode", **{host: "n1", zone: "z1"})
    same_host = labelled("a", **{host: "n1", zone: "z1"})
    same_zone = labelled("b", **{host: "n2", zone: "z1"})
    far = labelled("c", **{host: "n3", zone: "z2"})
    eps = [same_host, same_zone, far]
    filt = builders.plugin("topology-affinity-filter", {"minAffinity": "zone"})
    scorer = builders.plugin("topology-affinity-scorer")
    # No extractor, or no peer: everything passes, nothing scores (llm-d fails open).
    assert filt.filter({runner.PEER_KEY: peer}, req(), eps) == eps
    filt.labels = scorer.labels = TopologyLabels()
    assert filt.filter({}, req(), eps) == eps
    cycle = {runner.PEER_KEY: peer}
    assert filt.filter(cycle, req(), eps) == [same_host, same_zone]
    assert scorer.score(cycle, req(), eps) == [1.0, 0.05, 0.0]
    assert builders.plugin("topology-affinity-filter").filter(cycle, req(), [far]) == [far]  # none: all
    # The pod's spec.hostname stands in for a missing hostname label.
    by_spec = Endpoint(spec=dataclasses.replace(far.spec, hostname="n1", labels={}), hostport="x")
    assert scorer.score(cycle, req(), [by_spec]) == [1.0]


# ---- endpoint attributes -----------------------------------------------------------------------


def test_endpoint_attribute_filter_and_scorer_read_dcgm_and_custom_metrics() -> None:
    a, b, c = E("a"), E("b"), E("c")
    a.attributes[GPU_UTILIZATION], b.attributes[GPU_UTILIZATION] = 0.5, 0.95
    filt = builders.plugin(
        "endpoint-attribute-filter",
        {
            "attribute": "GPUUtilization",
            "producer": "dcgm-extractor",
            "algorithm": {"type": "threshold", "threshold": {"operator": "LessThanOrEqual", "value": 0.9}},
        },
    )
    assert filt.filter({}, req(), [a, b, c]) == [a, c]  # c has none: onMissing Pass
    scorer = builders.plugin(
        "endpoint-attribute-scorer",
        {
            "attributeKey": "GPUUtilization",
            "producer": "dcgm-extractor",
            "algorithm": {
                "type": "linear_lower_is_better",
                "normalization": {"fixedRange": {"min": 0, "max": 1}},
            },
        },
    )
    assert scorer.score({}, req(), [a, b, c]) == [0.5, pytest.approx(0.05), 0.0]
    a.metrics.custom["Temp"], b.metrics.custom["Temp"] = 60.0, 80.0
    adaptive = builders.plugin(
        "endpoint-attribute-scorer",
        {"attributeKey": "Temp", "algorithm": {"type": "linear_higher_is_better"}},
    )
    assert adaptive.score({}, req(), [a, b, c]) == [0.0, 1.0, 0.0]


def test_endpoint_attribute_old_spelling_is_refused() -> None:
    with pytest.raises(config.ConfigError, match="no producer is set"):
        builders.plugin(
            "endpoint-attribute-filter",
            {
                "attribute": "GPUUtilization/dcgm-extractor",
                "algorithm": {"type": "threshold", "threshold": {}},
            },
        )


# ---- session affinity and agent identity --------------------------------------------------------


def _result(ep: Endpoint) -> interfaces.SchedulingResult:
    return interfaces.SchedulingResult("default", {"default": interfaces.ProfileResult("default", [ep])})


def test_encoded_endpoint_header_pins_the_client_to_its_token() -> None:
    scorer = builders.plugin("session-affinity-scorer")
    a, b = labelled("a"), labelled("b")
    headers = scorer.response_headers(req(), _result(b), None, {":status": "200"})
    assert headers == {"x-session-token": base64.b64encode(b"ns/b").decode()}
    assert scorer.score({}, req(**headers), [a, b]) == [0.0, 1.0]
    assert scorer.score({}, req(), [a, b]) == [0.0, 0.0]
    filt = builders.plugin("session-affinity-filter")
    assert filt.filter({}, req(**headers), [a, b]) == [b]
    assert filt.filter({}, req(**{"x-session-token": "%%%"}), [a, b]) == [a, b]  # undecodable: no pin


def test_session_id_binds_a_session_to_its_first_endpoint() -> None:
    scorer = builders.plugin(
        "session-affinity-scorer",
        {
            "strategy": "session_id",
            "sessionIdConfig": {"sources": [{"header": "x-s"}, {"attribute": "agent-identity"}]},
        },
    )
    a, b = labelled("a"), labelled("b")
    first = req(**{"x-s": "one"})
    assert scorer.score({}, first, [a, b]) == [0.0, 0.0]  # unbound: no preference
    scorer.pre_request(first, _result(b))
    assert scorer.score({}, req(**{"x-s": "one"}), [a, b]) == [0.0, 1.0]
    gone = req(**{"x-s": "one"})
    assert scorer.score({}, gone, [a]) == [0.0]  # its endpoint left: it moves where this one goes
    scorer.pre_request(gone, _result(a))
    assert scorer.score({}, req(**{"x-s": "one"}), [a, b]) == [1.0, 0.0]
    # The agent identity is a fallback source.
    agent = req(**{"x-claude-code-session-id": "cc-1"})
    builders.plugin("agent-identity").request_headers(agent)
    scorer.score({}, agent, [a, b])
    scorer.pre_request(agent, _result(b))
    again = req(**{"x-claude-code-session-id": "cc-1"})
    builders.plugin("agent-identity").request_headers(again)
    assert scorer.score({}, again, [a, b]) == [0.0, 1.0]


def test_agent_identity_is_flow_controls_fairness_id_unless_one_is_given() -> None:
    plugin = builders.plugin("agent-identity", {"additionalSessionHeaders": ["X-My-Agent"]})
    r = req(**{"session-id": "codex-7"})
    assert fairness_id(r) == "default-flow"
    plugin.request_headers(r)
    assert fairness_id(r) == "codex-7"
    both = req(**{"x-my-agent": "mine", "x-session-affinity": "opencode"})
    plugin.request_headers(both)
    assert fairness_id(both) == "mine"  # the additional header comes first
    explicit = req(**{"x-llm-d-inference-fairness-id": "tenant", "session_id": "x"})
    plugin.request_headers(explicit)
    assert fairness_id(explicit) == "tenant"


def test_session_id_producer_reads_a_header_or_a_cookie() -> None:
    by_cookie = builders.plugin("session-id-producer", {"cookieName": "sid"}, name="sp")
    r = req(cookie="a=1; sid=abc; b=2")
    by_cookie.request_headers(r)
    assert r.attributes[("SessionIDDataKey", "sp")] == "abc"
    with pytest.raises(config.ConfigError, match="exactly one of headerName or cookieName"):
        builders.plugin("session-id-producer", {"headerName": "x", "cookieName": "y"})


# ---- load and label plugins ---------------------------------------------------------------------


def test_active_request_scorer_and_utilization_filter() -> None:
    idle, busy, busier = E("a", inflight_requests=0), E("b", inflight_requests=2), E("c", inflight_requests=4)
    scorer = builders.plugin("active-request-scorer", {"maxBusyScore": 0.5})
    assert scorer.score({}, req(), [idle, busy, busier]) == [1.0, 0.25, 0.0]
    filt = builders.plugin(
        "utilization-filter",
        {"conditions": [{"metric": "active-requests", "maxValue": 2}], "fallbackOnEmpty": True},
    )
    assert filt.filter({}, req(), [idle, busy, busier]) == [idle, busy]
    assert filt.filter({}, req(), [busier]) == [busier]


def test_label_plugins() -> None:
    a, b, c = labelled("a", role="decode"), labelled("b", role="prefill"), labelled("c")
    by_label = builders.plugin(
        "by-label", {"label": "role", "validValues": ["decode"], "allowsNoLabel": True}
    )
    assert by_label.filter({}, req(), [a, b, c]) == [a, c]
    header = builders.plugin("header-label-affinity-scorer", {"headerName": "X-Role", "labelKey": "role"})
    assert header.score({}, req(**{"x-role": "prefill"}), [a, b, c]) == [0.0, 1.0, 0.0]
    short, long_ = labelled("s", **{"llm-d.ai/context-length-range": "0-100"}), labelled("l")
    ctx = builders.plugin("context-length-aware", {"enableFiltering": True})
    r = req()
    r.token_ids = list(range(500))
    assert ctx.filter({}, r, [short, long_]) == [long_]
    assert ctx.score({}, r, [short, long_]) == [pytest.approx(0.3 / 1.4), 0.5]


# ---- the director's hooks -----------------------------------------------------------------------

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: queue-scorer}
- {type: agent-identity}
- {type: probabilistic-admitter, parameters: {queueDepthThreshold: 1}}
- {type: destination-endpoint-served-verifier}
- {type: session-affinity-scorer}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: session-affinity-scorer}]
"""
BODY = msgspec.json.encode({"model": "m", "prompt": "hi"})


def _director() -> tuple[Director, Any, Datastore]:
    ds = Datastore()
    ds.sync("t", [EndpointSpec(name="pod-0", address="10.0.0.1", port=8000, namespace="ns")])
    ds.candidates()[0].metrics.updated_at = time.monotonic()
    cfg = config.load_config(CONFIG, interfaces.Handle(datastore=ds), allow_experimental=True)
    store = objectives.ObjectiveStore()
    store.replace({"batch": -1})
    director = Director(
        objectives=store,
        datastore=ds,
        scheduler=cfg.scheduler,
        pre_request=cfg.pre_request,
        header_processors=cfg.header_processors,
        admitters=cfg.admitters,
        response_headers=cfg.response_headers,
    )
    return director, cfg, ds


async def test_the_director_runs_llm_ds_request_control_plugins() -> None:
    director, cfg, ds = _director()
    ctx = await director.route(
        path="/v1/completions", headers={"x-claude-code-session-id": "s1"}, body=BODY, subset=None
    )
    assert ctx.request.attributes[("agent-identity", "")] == "s1"
    added = ctx.on_response_headers({":status": "200"}, "10.0.0.1:8000")
    assert added == {
        "x-conformance-test-served-endpoint": "10.0.0.1:8000",
        "x-session-token": base64.b64encode(b"ns/pod-0").decode(),
    }
    assert ctx.on_response_headers({":status": "200"}, None)["x-conformance-test-served-endpoint"].startswith(
        "fail:"
    )
    ctx.finish(complete=True)
    # A sheddable request at saturation 1 (one waiting of threshold 1): refused, as llm-d, with 500.
    ds.candidates()[0].metrics.waiting = 1
    (admitter,) = cfg.admitters
    admitter.random = lambda: 0.5
    with pytest.raises(errors.RequestError) as info:
        await director.route(
            path="/v1/completions", headers={"x-gateway-inference-objective": "batch"}, body=BODY, subset=None
        )
    assert info.value.status == 500
    assert info.value.reason == (
        "request cannot be admitted: probabilistic-admitter: rejected, saturation=1.000 prob=1.00"
    )
    ok = await director.route(path="/v1/completions", headers={}, body=BODY, subset=None)  # priority 0
    ok.finish(complete=True)


def test_the_admitter_sheds_sheddable_requests_by_saturation() -> None:
    admitter = builders.plugin("probabilistic-admitter")
    loaded = E("a", waiting=5)  # saturation 1.0: probability min(1 * 300, 1) = 1
    sheddable = req()
    sheddable.priority = -1
    admitter.random = lambda: 0.99
    assert (
        admitter.admit(sheddable, [loaded]) == "probabilistic-admitter: rejected, saturation=1.000 prob=1.00"
    )
    assert admitter.admit(req(), [loaded]) is None  # priority 0: always admitted
    light = E("b", waiting=1)  # 0.2 ** 5 * 300 = 0.096
    admitter.random = lambda: 0.1
    assert admitter.admit(sheddable, [light]) is None
    admitter.random = lambda: 0.09
    assert admitter.admit(sheddable, [light]) is not None


# ---- burst co-location --------------------------------------------------------------------------


async def test_a_burst_of_one_prompt_goes_to_one_replica() -> None:
    import asyncio

    producer = builders.plugin("burst-prefix-cache-producer", {"windowDurationMs": 20, "blockSizeTokens": 4})
    a, b = E("a"), E("b", running=1)

    def prompt(ids: list[int]) -> InferenceRequest:
        r = req()
        r.token_ids = ids
        return r

    group = [prompt(list(range(10))) for _ in range(3)]
    alone = prompt([7] * 10)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.gather(*(producer.produce(r, [a, b]) for r in [*group, alone]))
    assert loop.time() - start >= 0.015  # every request waited for the window
    scores = [producer.score({}, r, [a, b]) for r in group]
    assert scores == [[1.0, 0.0]] * 3  # together, on the less busy replica
    assert producer.score({}, alone, [a, b]) == [0.0, 0.0]  # overlaps nothing: no affinity
    cycle: dict[str, Any] = {}
    producer.score(cycle, group[0], [a, b])
    assert producer.match_info(cycle, [a, b]) == [(3.0, 3, 4), (0.0, 3, 4)]


async def test_max_per_replica_spills_a_group_and_min_colocate_places_singles() -> None:
    import asyncio

    producer = builders.plugin(
        "burst-prefix-cache-producer",
        {"windowDurationMs": 10, "blockSizeTokens": 2, "maxPerReplica": 2, "minColocateBlocks": 2},
    )
    a, b = E("a"), E("b")
    rs = []
    for ids in [[1, 2, 3, 4]] * 3 + [[1, 2, 3, 4, 5, 6], [1, 2, 9, 9]]:
        r = req()
        r.token_ids = list(ids)
        rs.append(r)
    await asyncio.gather(*(producer.produce(r, [a, b]) for r in rs))
    placed = [producer.score({}, r, [a, b]) for r in rs]
    assert placed[:3] in ([[1.0, 0.0]] * 2 + [[0.0, 1.0]], [[0.0, 1.0]] * 2 + [[1.0, 0.0]])
    assert sum(placed[3]) == 1.0  # shares the group's 2 leading blocks: placed
    assert placed[4] == [0.0, 0.0]  # shares 1 block only: no affinity
