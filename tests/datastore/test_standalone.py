"""The standalone source: --endpoints parsing, the YAML format, and the watched file."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from epp.datastore import standalone
from epp.datastore.endpoints import Datastore, EndpointSpec
from epp.datastore.standalone import (
    EndpointsFile,
    EndpointsFileError,
    parse_endpoints_arg,
    parse_endpoints_yaml,
)

from .fake_vllm import until

POLL = 0.01

# -- --endpoints ------------------------------------------------------------------------------------


def test_parse_endpoints_arg() -> None:
    assert parse_endpoints_arg("10.0.0.1:8000, host.svc:8001 ,[::1]:8002") == [
        EndpointSpec(name="10.0.0.1:8000", address="10.0.0.1", port=8000),
        EndpointSpec(name="host.svc:8001", address="host.svc", port=8001),
        EndpointSpec(name="[::1]:8002", address="::1", port=8002),
    ]


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("", "item 1 is empty"),
        ("a:1,,b:2", "item 2 is empty"),
        ("a:1,", "item 2 is empty"),
        ("a:1,host", "item 2: 'host': missing port"),
        ("host:", "bad port ''"),
        ("host:80a", "bad port '80a'"),
        ("host:-1", "bad port '-1'"),
        ("host:0", "outside 1-65535"),
        ("host:65536", "outside 1-65535"),
        ("::1:8000", "IPv6 address in brackets"),
        ("[::1]", "missing port"),
        ("[::1:8000", "missing ']'"),
        ("[vllm]:8000", "brackets are for IPv6"),
        ("[::zz]:8000", "not a valid IPv6"),
        ("http://h:8000", "no scheme"),
        ("bad host:8000", "not a valid host name"),
        ("a:1,a:1", "a:1 is listed twice"),
    ],
)
def test_parse_endpoints_arg_errors_name_the_item(arg: str, message: str) -> None:
    with pytest.raises(ValueError, match="endpoint list") as e:
        parse_endpoints_arg(arg)
    assert message in str(e.value)


# -- the YAML format --------------------------------------------------------------------------------

FULL = """
endpoints:
  - address: 10.0.0.1
    port: 8000
    name: vllm-0
    metricsPort: 9100
    labels: {zone: a, gpu: 1, spot: true}
  - address: 10.0.0.2
    port: 8000
    name: dp
    ranks: 2
    metricsPort: 9000
  - address: 10.0.0.3
    port: 8000
    ranks: 2
  - 10.0.0.4:8000
  - address: "[fd00::1]"
    port: "8000"
"""


def test_full_format() -> None:
    specs = parse_endpoints_yaml(FULL)
    assert [(s.name, s.address, s.port, s.rank, s.metrics_port) for s in specs] == [
        ("vllm-0", "10.0.0.1", 8000, 0, 9100),
        ("dp-rank-0", "10.0.0.2", 8000, 0, 9000),
        ("dp-rank-1", "10.0.0.2", 8001, 1, 9001),
        ("10.0.0.3:8000", "10.0.0.3", 8000, 0, None),
        ("10.0.0.3:8001", "10.0.0.3", 8001, 1, None),
        ("10.0.0.4:8000", "10.0.0.4", 8000, 0, None),
        ("[fd00::1]:8000", "fd00::1", 8000, 0, None),
    ]
    assert specs[0].labels == {"zone": "a", "gpu": "1", "spot": "true"}
    assert specs[1].labels == {}


def test_kv_event_keys_and_inline_port() -> None:
    """The issue's example: port inline in the address, the model and the KV-event publishers;
    a data-parallel entry offsets both publisher ports by the rank, as vLLM does."""
    specs = parse_endpoints_yaml(
        "endpoints:\n"
        '  - {address: "10.0.0.5:8000", model: llama, kvEvents: "tcp://10.0.0.5:5557",'
        ' kvReplay: "tcp://10.0.0.5:5558"}\n'
        "  - {address: 10.0.0.6, port: 8000, ranks: 2, kvEvents: 'tcp://[fd00::6]:6000'}\n"
        "  - {address: '[fd00::7]:8000'}\n"
    )
    assert [(s.name, s.model, s.kv_events, s.kv_replay) for s in specs] == [
        ("10.0.0.5:8000", "llama", "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558"),
        ("10.0.0.6:8000", "", "tcp://[fd00::6]:6000", None),
        ("10.0.0.6:8001", "", "tcp://[fd00::6]:6001", None),
        ("[fd00::7]:8000", "", None, None),
    ]


def test_bare_list_and_empty_pool() -> None:
    assert [s.name for s in parse_endpoints_yaml("- a:1\n- address: b\n  port: 2\n")] == ["a:1", "b:2"]
    assert parse_endpoints_yaml("endpoints: []\n") == []
    assert parse_endpoints_yaml("endpoints:\n") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("endpoints: [\n", "invalid YAML"),
        ("endpoint: []", "unknown top-level key 'endpoint'"),
        ("{}", "missing top-level key 'endpoints'"),
        ("endpoints: 3", "expected `endpoints:` with a list"),
        (
            "- address: a\n  port: 1\n  metricPort: 2",
            "entry 1: unknown key 'metricPort' (did you mean 'metricsPort'?)",
        ),
        ("- address: a\n  port: 1\n  zzz: 2", "unknown key 'zzz' (known keys: address, port"),
        ("- a:1\n- port: 1", "entry 2: missing required key 'address'"),
        ("- address: a", "missing required key 'port'"),
        ("- address: a\n  port: 1\n  kvEvents: 5557", "kvEvents must be 'tcp://host:port', got 5557"),
        ("- address: a\n  port: 1\n  kvReplay: udp://a:1", "kvReplay must be 'tcp://host:port'"),
        ("- address: a\n  port: 1\n  kvEvents: tcp://a:0", "kvEvents 0 is outside 1-65535"),
        ("- address: a\n  port: 1\n  model: [x]", "model must be a string"),
        ("- address: 'a:1'\n  port: 1", "'a:1' is not a valid IPv6 address"),
        ("- address: a\n  port: true", "port must be an integer"),
        ("- address: a\n  port: 1.5", "port must be an integer"),
        ("- address: a\n  port: 70000", "outside 1-65535"),
        ("- address: a\n  port: 1\n  metricsPort: x", "metricsPort must be an integer"),
        ("- address: 10.5\n  port: 1", "address must be a string"),
        ("- address: http://a\n  port: 1", "no scheme or path"),
        ("- address: a\n  port: 1\n  ranks: 0", "ranks must be an integer in 1-64"),
        ("- address: a\n  port: 65535\n  ranks: 2", "run past port 65535"),
        ("- address: a\n  port: 1\n  labels: [x]", "labels must be a mapping"),
        ("- address: a\n  port: 1\n  labels: {a: {b: c}}", "labels must map strings to plain values"),
        ("- address: a\n  port: 1\n  name: ''", "name must be a non-empty string"),
        ("- 3", "entry 1: expected a mapping or a 'host:port' string"),
        ("- a:1\n- nope", "entry 2: 'nope': missing port"),
        (
            "- {address: a, port: 1, name: x}\n- {address: b, port: 1, name: x}",
            "entry 2 (x): name 'x' is already used by entry 1",
        ),
        ("- a:1\n- {address: a, port: 1, name: other}", "entry 2 (other): a:1 is already listed by entry 1"),
        (
            "- {address: a, port: 1, name: dp, ranks: 2}\n- {address: a, port: 2}",
            "entry 2: a:2 is already listed by entry 1",
        ),
    ],
)
def test_format_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_endpoints_yaml(text)
    assert message in str(e.value)


# -- the watched file ------------------------------------------------------------------------------


def write(path: Path, text: str) -> None:
    """Replace atomically, as editors and ConfigMap updates do (new inode, same path)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def names(ds: Datastore) -> list[str]:
    return sorted(ep.name for ep in ds.endpoints())


async def test_start_loads_and_edits_are_picked_up(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    write(path, "endpoints:\n  - a:1\n  - b:2\n")
    ds = Datastore()
    f = EndpointsFile(path, ds, poll_interval=POLL)
    await f.start()
    try:
        assert names(ds) == ["a:1", "b:2"]
        assert f.source == f"file:{path}"
        kept = ds.get("a:1")
        write(path, "endpoints:\n  - a:1\n  - c:3\n")
        await until(lambda: names(ds) == ["a:1", "c:3"], "reload")
        assert ds.get("a:1") is kept  # an unchanged endpoint keeps its object (and its metrics)
        # Same size, same content length: an atomic replace is still noticed (inode changes).
        write(path, "endpoints:\n  - a:1\n  - d:4\n")
        await until(lambda: names(ds) == ["a:1", "d:4"], "same-size reload")
    finally:
        await f.stop()


async def test_bad_edit_keeps_the_last_good_set_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "endpoints.yaml"
    write(path, "- a:1\n- b:2\n")
    ds = Datastore()
    f = EndpointsFile(path, ds, poll_interval=POLL)
    await f.start()
    caplog.set_level(logging.ERROR, logger="epp.datastore.standalone")
    try:
        write(path, "- a:1\n- address: b\n  port: 2\n  prot: 3\n")
        await until(lambda: len(caplog.records) == 1, "the error")
        await asyncio.sleep(POLL * 5)  # several more polls: no repeat of the error
        assert len(caplog.records) == 1
        msg = caplog.records[0].getMessage()
        assert str(path) in msg and "entry 2" in msg and "'prot'" in msg and "'port'" in msg
        assert names(ds) == ["a:1", "b:2"]

        write(path, "- a:1\n- [b:2\n")  # another bad edit: YAML error, reported too
        await until(lambda: len(caplog.records) == 2, "the second error")
        assert "invalid YAML" in caplog.records[1].getMessage()

        write(path, "- b:2\n")
        await until(lambda: names(ds) == ["b:2"], "the fix applied")
        assert len(caplog.records) == 2
    finally:
        await f.stop()


async def test_deleted_file_keeps_the_set_until_it_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "endpoints.yaml"
    write(path, "- a:1\n")
    ds = Datastore()
    f = EndpointsFile(path, ds, poll_interval=POLL)
    await f.start()
    caplog.set_level(logging.ERROR, logger="epp.datastore.standalone")
    try:
        path.unlink()
        await until(lambda: len(caplog.records) == 1, "the error")
        await asyncio.sleep(POLL * 5)
        assert len(caplog.records) == 1 and "missing" in caplog.records[0].getMessage()
        assert names(ds) == ["a:1"]
        write(path, "- e:5\n")
        await until(lambda: names(ds) == ["e:5"], "reload")
    finally:
        await f.stop()


async def test_bad_file_at_start_is_fatal(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    ds = Datastore()
    with pytest.raises(EndpointsFileError, match="cannot read"):
        await EndpointsFile(path, ds).start()
    write(path, "- a:1\n- a:1\n")
    with pytest.raises(EndpointsFileError, match=r"endpoints\.yaml: entry 2: name 'a:1' is already used"):
        await EndpointsFile(path, ds).start()
    assert ds.endpoints() == [] and not ds.synced


async def test_file_source_does_not_touch_other_sources(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    write(path, "- a:1\n")
    ds = Datastore()
    ds.sync("cli", parse_endpoints_arg("z:9"))
    f = EndpointsFile(path, ds, poll_interval=POLL)
    f.load()  # the synchronous start-up form
    assert names(ds) == ["a:1", "z:9"]
    write(path, "endpoints: []\n")
    assert await f.check() is True
    assert names(ds) == ["z:9"]
    assert await f.check() is False  # unchanged: nothing read


async def test_atomic_replace_with_same_size_and_mtime_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    write(path, "- a:1\n")
    ds = Datastore()
    f = EndpointsFile(path, ds)
    f.load()
    old = os.stat(path)
    write(path, "- b:2\n")
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))  # only the inode tells them apart
    assert await f.check() is True
    assert names(ds) == ["b:2"]


async def test_start_after_load_only_starts_watching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "endpoints.yaml"
    write(path, "- a:1\n")
    ds = Datastore()
    f = EndpointsFile(path, ds, poll_interval=POLL)
    f.load()
    read = f._read
    reads: list[int] = []

    def counting_read() -> tuple[tuple[int, int, int, int], list[EndpointSpec]]:
        reads.append(1)
        return read()

    monkeypatch.setattr(f, "_read", counting_read)
    await f.start()
    try:
        assert reads == []  # already loaded: not read again
        write(path, "- b:2\n")
        await until(lambda: names(ds) == ["b:2"], "reload")
        assert reads == [1]
    finally:
        await f.stop()


def test_objectives_give_priorities_in_standalone_mode(tmp_path: Path) -> None:
    doc = standalone.parse_endpoints_document(
        "endpoints: [10.0.0.1:8000]\nobjectives: {chat: 10, batch: -1}\n"
    )
    assert doc.objectives == {"chat": 10, "batch": -1}
    for bad, message in [
        ("objectives: [chat]", "objectives: expected a mapping"),
        ("objectives: {chat: high}", "objectives.chat: the priority must be an integer, got 'high'"),
        ("objectives: {chat: true}", "objectives.chat: the priority must be an integer, got True"),
    ]:
        with pytest.raises(ValueError, match=message):
            standalone.parse_endpoints_document("endpoints: []\n" + bad)

    class Store:
        priorities: dict[str, int] = {}

        def replace(self, priorities: Mapping[str, int]) -> None:
            self.priorities = dict(priorities)

    path = tmp_path / "endpoints.yaml"
    path.write_text("endpoints: [10.0.0.1:8000]\nobjectives: {chat: 3}\n")
    store = Store()
    standalone.EndpointsFile(path, Datastore(), objectives=store).load()
    assert store.priorities == {"chat": 3}
