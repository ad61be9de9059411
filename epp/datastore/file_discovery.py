"""llm-d's `file-discovery`: the pool's endpoints from a YAML (or JSON) file, optionally watched.

The configuration names it (`dataLayer.discovery.pluginRef` -> a `file-discovery` plugin with
`path` and `watchFile`); epp then runs without Kubernetes, as llm-d does. The file is llm-d's:

```yaml
endpoints:
  - name: vllm-0              # required, unique in the file
    namespace: default        # optional ("default")
    address: "10.0.0.1"       # required: an IPv4 address (llm-d resolves no names)
    port: "8000"              # required: 1-65535, a string in llm-d's schema (a number is taken too)
    labels: {zone: a}         # optional
```

As in llm-d:
- the file is at most 1 MiB; a file that cannot be read or parsed fails the start-up, and a
  later one is logged and the last endpoints stay;
- an entry with a bad address or port is logged and skipped, the others are applied;
- metrics are scraped at `address:port` (the serving port);
- with `watchFile: true` the file is re-read when it changes, including an atomic rename or a
  ConfigMap's symlink swap; endpoints no longer listed are removed. epp polls the file's
  (mtime, size, inode) every second instead of using inotify: the same changes are seen, an
  editor's partial write is re-read on the next poll.

epp's own `--endpoints-file` (epp.datastore.standalone) is a different, stricter format with
epp's extras (ranks, KV-event addresses, tokenizers); this source reads only llm-d's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
from pathlib import Path
from typing import Any

import yaml

from epp import tasks
from epp.datastore.endpoints import Datastore, EndpointSpec

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 1 << 20  # llm-d's maxEndpointsFileSize
_KEYS = ("name", "namespace", "address", "port", "labels")


class DiscoveryFileError(ValueError):
    """The endpoints file cannot be used at all; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True, slots=True)
class FileDiscoverySource:
    """One `file-discovery` plugin's settings."""

    path: str
    watch: bool = False
    name: str = "file-discovery"


def parse(text: str) -> tuple[list[EndpointSpec], list[str]]:
    """(endpoints, problems with skipped entries) of an endpoints file's text. Raises
    DiscoveryFileError when the file as a whole is not one."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise DiscoveryFileError(f"not YAML: {err}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise DiscoveryFileError(f"expected a mapping with `endpoints:`, got {type(doc).__name__}")
    entries = doc.get("endpoints") or []
    if not isinstance(entries, list):
        raise DiscoveryFileError("`endpoints` must be a list")
    specs: list[EndpointSpec] = []
    problems: list[str] = []
    for i, entry in enumerate(entries):
        spec = _entry(entry, i, problems)
        if spec is not None:
            specs.append(spec)
    return specs, problems


def _entry(entry: Any, i: int, problems: list[str]) -> EndpointSpec | None:
    if not isinstance(entry, dict):
        problems.append(f"endpoint #{i}: not a mapping")
        return None
    name = str(entry.get("name") or "")
    label = f"endpoint {name!r}" if name else f"endpoint #{i}"
    address = str(entry.get("address") or "")
    try:
        if not isinstance(ipaddress.ip_address(address), ipaddress.IPv4Address):
            raise ValueError
    except ValueError:
        problems.append(f"{label}: invalid IPv4 address {address!r}")
        return None
    raw_port = entry.get("port")
    try:
        port = int(str(raw_port))
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        problems.append(f"{label}: invalid port {raw_port!r}")
        return None
    labels = entry.get("labels") or {}
    if not isinstance(labels, dict):
        problems.append(f"{label}: labels must be a mapping")
        return None
    namespace = str(entry.get("namespace") or "default")
    # llm-d's pod name is the entry's name; its identity is namespace/name.
    return EndpointSpec(
        name=name or f"{address}:{port}",
        address=address,
        port=port,
        pod=name,
        labels={str(k): str(v) for k, v in labels.items()},
        namespace=namespace,
    )


_Signature = tuple[int, int, int, int]


class FileDiscovery:
    """The endpoints file kept in sync with the datastore (source `discovery:<path>`)."""

    def __init__(
        self, source: FileDiscoverySource, datastore: Datastore, *, poll_interval: float = 1.0
    ) -> None:
        self.path = Path(source.path)
        self.watch = source.watch
        self.source = f"discovery:{self.path}"
        self.poll_interval = poll_interval
        self._datastore = datastore
        self._signature: _Signature | None = None
        self._task: asyncio.Task[None] | None = None

    def _stat(self) -> _Signature | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)

    def _read(self) -> tuple[_Signature | None, list[EndpointSpec], list[str]]:
        sig = self._stat()
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError as err:
            raise DiscoveryFileError(f"endpoints file {self.path}: cannot read: {err.strerror}") from None
        if len(data) > MAX_FILE_BYTES:
            raise DiscoveryFileError(f"endpoints file {self.path} exceeds the 1 MiB limit")
        try:
            specs, problems = parse(data.decode("utf-8"))
        except (UnicodeDecodeError, DiscoveryFileError) as err:
            raise DiscoveryFileError(f"endpoints file {self.path}: {err}") from None
        names: set[str] = set()
        unique: list[EndpointSpec] = []
        for spec in specs:
            if spec.name in names:
                problems.append(f"endpoint {spec.name!r}: listed twice; the first is kept")
                continue
            names.add(spec.name)
            unique.append(spec)
        return sig, unique, problems

    def _apply(self, sig: _Signature | None, specs: list[EndpointSpec], problems: list[str]) -> None:
        self._signature = sig
        for problem in problems:
            log.error("endpoints file %s: %s; skipped", self.path, problem)
        added, removed = self._datastore.sync(self.source, specs)
        log.info(
            "endpoints file %s: %d endpoints (%d added, %d removed)",
            self.path,
            len(specs),
            len(added),
            len(removed),
        )

    def load(self) -> list[EndpointSpec]:
        """Read the file and sync it into the datastore now (start-up). Raises DiscoveryFileError."""
        sig, specs, problems = self._read()
        self._apply(sig, specs, problems)
        return specs

    async def check(self) -> bool:
        """Re-read the file if it changed since the last look; True when the datastore was synced.
        A file that cannot be read keeps the last endpoints (logged once per version)."""
        sig = await asyncio.to_thread(self._stat)
        if sig == self._signature:
            return False
        self._signature = sig
        if sig is None:
            log.error("endpoints file %s: missing; keeping the last endpoints", self.path)
            return False
        try:
            new_sig, specs, problems = await asyncio.to_thread(self._read)
        except DiscoveryFileError as err:
            log.error("%s; keeping the last endpoints", err)
            return False
        self._apply(new_sig, specs, problems)
        return True

    async def start(self) -> None:
        if self._signature is None:
            await asyncio.to_thread(self.load)
        if self.watch and self._task is None:
            self._task = tasks.create_guarded_task(self._watch(), name=f"watch {self.path}", logger=log)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await tasks.cancel_and_wait([task])

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            await self.check()
