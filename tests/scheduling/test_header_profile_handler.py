"""`header-profile-handler`: one epp serves every stage of llm-d's coordinator pipeline, the
profile named per request by a header, through the real Director."""

from __future__ import annotations

import pytest

from epp.api import errors
from epp.datastore.endpoints import Datastore
from epp.requestcontrol.director import Director
from epp.scheduling import config as sched_config
from epp.scheduling.interfaces import Handle
from epp.scheduling.plugins.header_profile_handler import HeaderProfileScheduler
from tests.scheduling.test_disagg import ROLE, body, pool


def director(text: str, ds: Datastore) -> tuple[Director, sched_config.SchedulerConfig]:
    # Alpha in llm-d v0.10: it needs --allow-experimental-plugins there and here.
    cfg = sched_config.load_config(text, Handle(datastore=ds), allow_experimental=True)
    return Director(datastore=ds, scheduler=cfg.scheduler, pre_request=cfg.pre_request), cfg


# As llm-d's coordinator e2e runs its single EPP: role filters narrow one pool to each stage.
STAGES = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: openai-parser
- type: encode-filter
- type: prefill-filter
- type: label-selector-filter
  name: decode-filter
  parameters:
    matchExpressions:
    - {key: llm-d.ai/role, operator: In, values: ["decode", "prefill-decode"]}
- type: queue-scorer
- type: max-score-picker
- type: header-profile-handler
  parameters: %s
requestHandler:
  parsers:
  - pluginRef: openai-parser
schedulingProfiles:
- name: encode
  plugins: [{pluginRef: encode-filter}, {pluginRef: max-score-picker}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
- name: %s
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""


def stages(params: str = "{}", last: str = "decode") -> str:
    return STAGES % (params, last)


async def test_the_header_names_the_profile_and_its_pod() -> None:
    ds = pool("encode", "prefill", "decode")
    d, cfg = director(stages(), ds)
    assert isinstance(cfg.scheduler, HeaderProfileScheduler)
    assert cfg.scheduler.profile_names() == ["encode", "prefill", "decode"]
    for value, role in (("encode", "encode"), ("prefill", "prefill"), (" decode ", "decode"), ("", "decode")):
        headers = {"epp-profile": value}
        ctx = await d.route(path="/v1/completions", headers=headers, body=body(20), subset=None)
        assert ctx.booked.spec.labels[ROLE] == role, value
        assert ctx.headers == {}  # no P/D headers: the caller runs the stages
        ctx.finish(complete=True)
    # No header at all (GET /v1/models, the client's own request): defaultProfile, decode.
    ctx = await d.route(path="/v1/completions", headers={}, body=body(20), subset=None)
    assert ctx.booked.spec.labels[ROLE] == "decode"
    ctx.finish(complete=True)
    assert all(ep.inflight_requests == 0 for ep in ds.endpoints())


async def test_a_profile_nobody_configured_is_a_400_naming_them() -> None:
    ds = pool("encode", "prefill", "decode")
    d, _ = director(stages(), ds)
    with pytest.raises(errors.BadRequest, match=r"no scheduling profile 'prefil'.*encode, prefill, decode"):
        await d.route(path="/v1/completions", headers={"epp-profile": "prefil"}, body=body(20), subset=None)
    assert all(ep.inflight_requests == 0 for ep in ds.endpoints())


async def test_header_name_default_profile_and_a_missing_default() -> None:
    ds = pool("encode", "prefill", "decode")
    d, _ = director(stages("{headerName: X-Stage, defaultProfile: prefill}"), ds)
    ctx = await d.route(path="/v1/completions", headers={"x-stage": "encode"}, body=body(20), subset=None)
    assert ctx.booked.spec.labels[ROLE] == "encode"
    ctx.finish(complete=True)
    ctx = await d.route(path="/v1/completions", headers={"epp-profile": "encode"}, body=body(20), subset=None)
    assert ctx.booked.spec.labels[ROLE] == "prefill"  # not the configured header: the default
    ctx.finish(complete=True)
    # llm-d loads a default that names no profile; epp too, says so, and answers 400 without it.
    d, cfg = director(stages(last="generate"), ds)
    assert any("defaultProfile 'decode' is not a scheduling profile" in w for w in cfg.warnings), cfg.warnings
    with pytest.raises(errors.BadRequest, match="epp-profile is missing and the default profile 'decode'"):
        await d.route(path="/v1/completions", headers={}, body=body(20), subset=None)
    headers = {"epp-profile": "generate"}
    ctx = await d.route(path="/v1/completions", headers=headers, body=body(20), subset=None)
    assert ctx.booked.spec.labels[ROLE] == "decode"
    ctx.finish(complete=True)


async def test_one_profile_always_runs() -> None:
    text = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: header-profile-handler
schedulingProfiles:
- name: only
  plugins: [{pluginRef: queue-scorer}]
"""
    ds = pool("decode", "decode")
    d, cfg = director(text, ds)
    assert not cfg.warnings
    for headers in ({}, {"epp-profile": "anything"}):
        ctx = await d.route(path="/v1/completions", headers=headers, body=body(20), subset=None)
        ctx.finish(complete=True)


def test_two_profiles_without_a_handler_name_both_handlers_and_alpha_needs_the_flag() -> None:
    text = stages().replace("- type: header-profile-handler\n  parameters: {}\n", "")
    with pytest.raises(sched_config.ConfigError, match="header-profile-handler"):
        director(text, pool("decode"))
    with pytest.raises(sched_config.ConfigError, match="--allow-experimental-plugins"):
        sched_config.load_config(stages(), Handle(datastore=pool("decode")))
