"""The standalone endpoint source: a fixed list on the command line, or a watched YAML file.

For running epp without Kubernetes (RL post-training, batch jobs, a laptop). Two forms:

`--endpoints 10.0.0.1:8000,vllm-1.internal:8000,[::1]:8002` -> `parse_endpoints_arg`. Each item
is `host:port` (IPv6 in brackets); the endpoint's name is that same `host:port`.

`--endpoints-file endpoints.yaml` -> `EndpointsFile`, reloaded when the file changes:

```yaml
endpoints:
  - address: 10.0.0.1         # required: IP or DNS name (IPv6 without brackets), or
                              #   "host:port" ("[v6]:port") with the port inline
    port: 8000                # required unless inline: the serving port Envoy sends requests to
    name: vllm-0              # optional; default "address:port". Must be unique.
    metricsPort: 9100         # optional; default: port. Where /metrics is scraped.
    labels: {zone: a}         # optional; string values (numbers are turned into strings)
    ranks: 2                  # optional, default 1: a data-parallel server listening on ports
                              #   port .. port+ranks-1, one endpoint per rank, named
                              #   "<name>-rank-<i>", or by its own "address:port" when no name
                              #   is given; metricsPort, if set, is offset by the rank too.
    model: llama              # optional: the base model, as clients name it (vLLM's
                              #   --served-model-name): seeds KV block keys; needed to
                              #   tell LoRA adapters from the base model in KV events)
    kvEvents: tcp://10.0.0.1:5557   # optional: the pod's vLLM KV-event publisher; default
                              #   tcp://<address>:<--kv-events-port>. Offset by the rank, as vLLM
                              #   offsets a data-parallel rank's publisher port.
    kvReplay: tcp://10.0.0.1:5558   # optional: its replay endpoint (vLLM's replay_endpoint);
                              #   offset by the rank too
    tokenizer: /models/llama  # optional, needs `model`: that model's tokenizer (a Hugging Face
                              #   tokenizer directory or tokenizer.json; relative paths are
                              #   relative to this file's directory)
  - 10.0.0.2:8000             # a plain "host:port" string is an entry with only address and port
```

```yaml
objectives:                   # optional: InferenceObjective name -> priority, what a Kubernetes
  chat: 10                    #   pool's InferenceObjectives say; a request names its objective in
  batch: -1                   #   x-gateway-inference-objective (flow control and admission read
                              #   its priority: negative is sheddable). Integers only.
```

The file may also be just a list (the value of `endpoints:` without the key). `endpoints: []`
is a valid, empty pool; an empty file is rejected, because an editor that truncates the file
before writing it would otherwise empty the pool for one poll.

Ports may also be quoted ("8000"), as templating tools often write them.

`tokenizer:` is per model, not per endpoint: entries of one model may each repeat it or name it
once, but two different paths for one model are an error. The paths go to a `TokenizerSink` (the
tokenizer registry, which this package does not import): at start-up `load()` must succeed (its
error names the model and the path), on a change `reload()` loads new paths off the loop and keeps
the previous tokenizer of a model whose new path fails. It is called on every change of the file,
so a fixed tokenizer directory is picked up at the next edit of the file.

Validation is strict and every error names the file, the entry and the problem: unknown keys
(with a suggestion: `metricPort` -> did you mean `metricsPort`?), wrong types, ports outside
1-65535, duplicate names, and the same address:port listed twice. At start-up a bad file is
fatal (`EndpointsFileError`); after that, a bad edit is logged once at ERROR and the last good
set stays in force until the file is fixed. A deleted file is handled the same way.

Change detection polls `os.stat` every `poll_interval` (1 s) and compares (mtime, size, inode),
so an atomic replace (rename, or a Kubernetes ConfigMap's symlink swap) is seen even when the
new file has the old size and the same mtime. File reads run in a worker thread; the datastore
is updated on the event loop, where its listeners run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from epp import tasks
from epp.datastore.endpoints import Datastore, EndpointSpec

log = logging.getLogger(__name__)

_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9_])?")  # DNS name or IPv4
_PORT = re.compile(r"[0-9]{1,5}")
_KEYS = (
    "address",
    "port",
    "name",
    "metricsPort",
    "labels",
    "ranks",
    "model",
    "kvEvents",
    "kvReplay",
    "tokenizer",
)
_ZMQ_TCP = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")
_MAX_RANKS = 64  # far above any real data-parallel size; catches "ranks: 8000" typos


class EndpointsFileError(ValueError):
    """The endpoints file cannot be used; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True, slots=True)
class EndpointsDocument:
    """A parsed endpoints file: its endpoints, and the tokenizer paths it names per model (as
    written: relative paths are resolved against the file's directory by `EndpointsFile`)."""

    endpoints: list[EndpointSpec]
    tokenizers: dict[str, str] = dataclasses.field(default_factory=dict)
    objectives: dict[str, int] = dataclasses.field(default_factory=dict)


class ObjectiveSink(Protocol):
    """Where the file's objectives go (`epp.k8s.objectives.ObjectiveStore` has the same shape)."""

    def replace(self, priorities: Mapping[str, int]) -> None: ...


class TokenizerSink(Protocol):
    """Where the file's per-model tokenizer paths go (`epp.tokenize.registry.TokenizerSource`)."""

    def load(self, paths: Mapping[str, Path]) -> None:
        """Start-up: load them now; raise, naming the model and the path, if one cannot be loaded."""
        ...

    async def reload(self, paths: Mapping[str, Path]) -> bool:
        """After a change: load new paths off the loop; log failures, keep what worked before."""
        ...


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _check_address(address: str) -> str:
    """Return the address without brackets, or raise ValueError saying what is wrong."""
    if "/" in address:
        raise ValueError(f"{address!r}: no scheme or path, just the host")
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    if ":" in address:
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise ValueError(f"{address!r} is not a valid IPv6 address") from None
        return address
    if not _HOST.fullmatch(address):
        raise ValueError(f"{address!r} is not a valid host name or IP address")
    return address


def _check_port(value: object, what: str = "port") -> int:
    # Strings of digits are accepted for templated files (Helm often quotes numbers).
    if isinstance(value, str) and _PORT.fullmatch(value.strip()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if not 1 <= value <= 65535:
        raise ValueError(f"{what} {value} is outside 1-65535")
    return value


def _split_hostport(item: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (address, port); ValueError names the item and the problem."""
    if "://" in item or "/" in item:
        raise ValueError(f"{item!r}: no scheme or path, just host:port")
    if item.startswith("["):
        close = item.find("]")
        if close == -1:
            raise ValueError(f"{item!r}: missing ']' after the IPv6 address")
        address, rest = item[1:close], item[close + 1 :]
        if not rest.startswith(":"):
            raise ValueError(f"{item!r}: missing port (expected [address]:port)")
        port = rest[1:]
        if ":" not in address:
            raise ValueError(f"{item!r}: brackets are for IPv6 addresses only")
    else:
        address, sep, port = item.rpartition(":")
        if not sep:
            raise ValueError(f"{item!r}: missing port (expected host:port)")
        if ":" in address:
            raise ValueError(f"{item!r}: put an IPv6 address in brackets, e.g. [::1]:8000")
    if not _PORT.fullmatch(port):
        raise ValueError(f"{item!r}: bad port {port!r}")
    try:
        return _check_address(address), _check_port(int(port))
    except ValueError as e:
        raise ValueError(f"{item!r}: {e}") from None


def parse_endpoints_arg(value: str) -> list[EndpointSpec]:
    """Parse `host:port,host:port,[v6]:port` into specs named `host:port`.

    Raises ValueError naming the offending item (empty, missing or bad port, bad host,
    duplicate).
    """
    specs: list[EndpointSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(value.split(","), 1):
        item = raw.strip()
        if not item:
            raise ValueError(f"endpoint list {value!r}: item {i} is empty")
        try:
            address, port = _split_hostport(item)
        except ValueError as e:
            raise ValueError(f"endpoint list item {i}: {e}") from None
        name = _hostport(address, port)
        if name in seen:
            raise ValueError(f"endpoint list item {i}: {name} is listed twice")
        seen.add(name)
        specs.append(EndpointSpec(name=name, address=address, port=port))
    return specs


def _entry_specs(entry: object) -> tuple[list[EndpointSpec], str | None]:
    """Specs for one file entry (several with `ranks`) and its tokenizer path, if it names one;
    ValueError names the problem."""
    if isinstance(entry, str):
        address, port = _split_hostport(entry.strip())
        return [EndpointSpec(name=_hostport(address, port), address=address, port=port)], None
    if not isinstance(entry, Mapping):
        raise ValueError(f"expected a mapping or a 'host:port' string, got {type(entry).__name__}")
    for key in entry:
        if key not in _KEYS:
            close = difflib.get_close_matches(str(key), _KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(_KEYS)})"
            raise ValueError(f"unknown key {key!r}{hint}")
    if "address" not in entry:
        raise ValueError("missing required key 'address'")
    address = entry["address"]
    if not isinstance(address, str):
        raise ValueError(f"address must be a string, got {address!r}")
    address = address.strip()
    if "port" in entry:
        address = _check_address(address)
        port = _check_port(entry["port"])
    elif (address.startswith("[") and "]:" in address) or address.count(":") == 1:
        address, port = _split_hostport(address)  # "10.0.0.5:8000": the port given inline
    else:
        raise ValueError("missing required key 'port' (or give the address as host:port)")
    raw_metrics_port = entry.get("metricsPort")
    metrics_port = None if raw_metrics_port is None else _check_port(raw_metrics_port, "metricsPort")
    name = entry.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    labels = _labels(entry.get("labels"))
    model = entry.get("model", "")
    if not isinstance(model, str):
        raise ValueError(f"model must be a string, got {model!r}")
    tokenizer = _tokenizer_path(entry.get("tokenizer"), model.strip())
    kv_events = _zmq_endpoint(entry.get("kvEvents"), "kvEvents")
    kv_replay = _zmq_endpoint(entry.get("kvReplay"), "kvReplay")
    ranks = entry.get("ranks", 1)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= _MAX_RANKS:
        raise ValueError(f"ranks must be an integer in 1-{_MAX_RANKS}, got {ranks!r}")
    if port + ranks - 1 > 65535 or (metrics_port or 0) + ranks - 1 > 65535:
        raise ValueError(f"ranks {ranks} run past port 65535")
    specs = []
    for r in range(ranks):
        if name is None:
            ep_name = _hostport(address, port + r)
        else:
            ep_name = name.strip() if ranks == 1 else f"{name.strip()}-rank-{r}"
        specs.append(
            EndpointSpec(
                name=ep_name,
                address=address,
                port=port + r,
                rank=r,
                labels=dict(labels),
                metrics_port=None if metrics_port is None else metrics_port + r,
                model=model.strip(),
                kv_events=None if kv_events is None else _offset(kv_events, r),
                kv_replay=None if kv_replay is None else _offset(kv_replay, r),
            )
        )
    return specs, tokenizer


def _tokenizer_path(value: object, model: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"tokenizer must be a non-empty path, got {value!r}")
    if not model:
        # Requests choose a tokenizer by their model name, so a tokenizer belongs to a model.
        raise ValueError("tokenizer needs model: the tokenizer is chosen by the request's model name")
    return value.strip()


def _zmq_endpoint(value: object, key: str) -> tuple[str, int] | None:
    """A `tcp://host:port` ZMQ endpoint as (host, port); None when absent."""
    if value is None:
        return None
    m = _ZMQ_TCP.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"{key} must be 'tcp://host:port', got {value!r}")
    return m.group(1), _check_port(int(m.group(2)), key)


def _offset(endpoint: tuple[str, int], rank: int) -> str:
    host, port = endpoint
    if port + rank > 65535:
        raise ValueError(f"rank {rank} runs port {port} past 65535")
    return f"tcp://{host}:{port + rank}"


def _labels(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"labels must be a mapping, got {value!r}")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, Mapping | list) or v is None:
            raise ValueError(f"labels must map strings to plain values, got {k!r}: {v!r}")
        # YAML reads `true`/`1` as bool/int; labels are strings, as in Kubernetes.
        out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def parse_endpoints_yaml(text: str) -> list[EndpointSpec]:
    """Parse an endpoints document (format in the module docstring); ValueError on any problem."""
    return parse_endpoints_document(text).endpoints


def parse_endpoints_document(text: str) -> EndpointsDocument:
    """Parse an endpoints document with its per-model tokenizers; ValueError on any problem."""
    try:
        doc: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"invalid YAML: {e}") from None
    if doc is None:
        raise ValueError("the file is empty (write `endpoints: []` for an empty pool)")
    objectives: dict[str, int] = {}
    if isinstance(doc, Mapping):
        extra = [k for k in doc if k not in ("endpoints", "objectives")]
        if extra:
            raise ValueError(f"unknown top-level key {extra[0]!r} (expected 'endpoints' and 'objectives')")
        if "endpoints" not in doc:
            raise ValueError("missing top-level key 'endpoints'")
        objectives = _objectives(doc.get("objectives"))
        doc = doc["endpoints"] if doc["endpoints"] is not None else []
    if not isinstance(doc, list):
        raise ValueError("expected `endpoints:` with a list, or a list of endpoints")
    specs: list[EndpointSpec] = []
    names: dict[str, int] = {}
    hostports: dict[str, int] = {}
    tokenizers: dict[str, tuple[str, int]] = {}  # model -> (path, first entry naming it)
    for i, entry in enumerate(doc, 1):
        label = f"entry {i}"
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            label += f" ({entry['name']})"
        try:
            entry_specs, tokenizer = _entry_specs(entry)
        except ValueError as e:
            raise ValueError(f"{label}: {e}") from None
        if tokenizer is not None:
            model = entry_specs[0].model
            path, first = tokenizers.setdefault(model, (tokenizer, i))
            if path != tokenizer:
                raise ValueError(
                    f"{label}: model {model!r} already has tokenizer {path!r} (entry {first}); "
                    "a model has one tokenizer"
                )
        for spec in entry_specs:
            if spec.name in names:
                raise ValueError(f"{label}: name {spec.name!r} is already used by entry {names[spec.name]}")
            hp = _hostport(spec.address, spec.port)
            if hp in hostports:
                raise ValueError(f"{label}: {hp} is already listed by entry {hostports[hp]}")
            names[spec.name] = hostports[hp] = i
            specs.append(spec)
    return EndpointsDocument(specs, {model: path for model, (path, _) in tokenizers.items()}, objectives)


def _objectives(value: object) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("objectives: expected a mapping of objective name to priority")
    out: dict[str, int] = {}
    for name, priority in value.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"objectives: a name must be a non-empty string, got {name!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"objectives.{name}: the priority must be an integer, got {priority!r}")
        out[name] = priority
    return out


_Signature = tuple[int, int, int, int]  # (mtime_ns, size, inode, device)
_UNREAD: _Signature = (-1, -1, -1, -1)  # matches no real file


class EndpointsFile:
    """A YAML endpoints file kept in sync with the datastore (source `file:<path>`), and its
    per-model tokenizers with `tokenizers` (a `TokenizerSink`) when given."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        datastore: Datastore,
        *,
        poll_interval: float = 1.0,
        tokenizers: TokenizerSink | None = None,
        objectives: ObjectiveSink | None = None,
    ) -> None:
        self.path = Path(path)
        self.source = f"file:{self.path}"
        self.poll_interval = poll_interval
        self._datastore = datastore
        self._tokenizers = tokenizers
        self._objectives = objectives
        # Of the version last read (good or bad); None while the file is missing; _UNREAD
        # before the first read, so the first check always reads.
        self._signature: _Signature | None = _UNREAD
        self._task: asyncio.Task[None] | None = None

    def _read(self) -> tuple[_Signature, EndpointsDocument]:
        """Stat, read and parse the file (blocking). EndpointsFileError names file and problem."""
        try:
            st = os.stat(self.path)
            # The signature is taken before reading: if the file changes during the read, the
            # next poll sees a newer signature and reads it again.
            sig = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise EndpointsFileError(f"endpoints file {self.path}: cannot read: {e}") from None
        try:
            return sig, parse_endpoints_document(text)
        except ValueError as e:
            raise EndpointsFileError(f"endpoints file {self.path}: {e}") from None

    def _stat(self) -> _Signature | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)

    def tokenizer_paths(self, doc: EndpointsDocument) -> dict[str, Path]:
        """`doc`'s tokenizer paths, relative ones taken from this file's directory."""
        return {model: self.path.parent / Path(raw).expanduser() for model, raw in doc.tokenizers.items()}

    def _apply(self, sig: _Signature, doc: EndpointsDocument) -> None:
        self._signature = sig
        if self._objectives is not None:
            self._objectives.replace(doc.objectives)
        specs = doc.endpoints
        added, removed = self._datastore.sync(self.source, specs)
        log.info(
            "endpoints file %s: %d endpoints (%d added, %d removed)",
            self.path,
            len(specs),
            len(added),
            len(removed),
        )

    def load(self) -> list[EndpointSpec]:
        """Read the file, load its tokenizers and sync it into the datastore now (blocking; for
        start-up).

        Raises EndpointsFileError, or the sink's error for a tokenizer that cannot be loaded,
        leaving the datastore untouched.
        """
        sig, doc = self._read()
        if self._tokenizers is not None:
            self._tokenizers.load(self.tokenizer_paths(doc))
        self._apply(sig, doc)
        return doc.endpoints

    async def check(self) -> bool:
        """Reload if the file changed since the last look. True if the datastore was synced.

        Never raises for a bad or missing file: it logs the problem once per version of the
        file and keeps the last good set. The endpoints are synced first; tokenizers then load
        off the loop (a request for a new model meanwhile routes without token ids).
        """
        sig = await asyncio.to_thread(self._stat)
        if sig == self._signature:
            return False
        # Remembered whether good or bad, so a broken version is read and reported only once.
        self._signature = sig
        if sig is None:
            log.error("endpoints file %s: missing; keeping the last good set of endpoints", self.path)
            return False
        try:
            new_sig, doc = await asyncio.to_thread(self._read)
        except EndpointsFileError as e:
            log.error("%s; keeping the last good set of endpoints", e)
            return False
        self._apply(new_sig, doc)
        if self._tokenizers is not None:
            await self._tokenizers.reload(self.tokenizer_paths(doc))
        return True

    async def start(self) -> None:
        """Start watching the file, loading it first unless `load()` already did.

        A bad file at this point raises EndpointsFileError, and a tokenizer that cannot be loaded
        the sink's error (fail fast at start-up: its tokenizers load on the loop, as `load()`).
        """
        if self._task is not None:
            return
        if self._signature == _UNREAD:
            sig, doc = await asyncio.to_thread(self._read)
            if self._tokenizers is not None:
                self._tokenizers.load(self.tokenizer_paths(doc))
            self._apply(sig, doc)
        self._task = tasks.create_guarded_task(self._watch(), name=f"watch {self.path}", logger=log)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await tasks.cancel_and_wait([task])

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            await self.check()
