"""llm-d's `token-producer` plugin (older name `tokenizer`), read into where each model's token ids
come from: a local tokenizer, the model servers' /render routes, or the stand-in.

    - type: token-producer
      parameters:
        modelName: meta-llama/Llama-3.1-8B-Instruct
        path: /models/llama              # epp's: a local tokenizer directory or tokenizer.json
    - type: token-producer
      parameters:
        modelName: Qwen/Qwen3-32B
        vllm: {url: http://localhost:8000, timeout: 5s, mmTimeout: 30s}

- `path` (epp's parameter; relative to the config file): that tokenizer, in-process.
- `vllm` (llm-d's render backend): vLLM's /render routes (`epp.tokenize.render`) at `vllm.url`
  (`http`, an older spelling, is accepted), with `modelName` stamped into the body as llm-d
  stamps it; without a url, at the pool's own pods (llm-d's default url is a sidecar on
  localhost:8000). `timeout` / `mmTimeout` are Go durations ("5s", "750ms"; llm-d's defaults 5 s,
  30 s). A `modelName` alone (no `path`, no `vllm`) is llm-d's render backend too.
- no `modelName`: the producer serves every model (`""`) its way.
- `estimate` (llm-d's tokenizer-free byte packing, also its producer with no parameters at all):
  approximate ids; epp's approximation is the stand-in tokenizer epp-tiny, for every model no other
  source names (whose counts are never held to the pods' context length). Its multimodal tuning
  (`image`, `video`) is refused: epp models no placeholder estimates.
- `udsTokenizerConfig` (llm-d's deprecated UDS sidecar, which tokenizes with the model's own
  tokenizer) is served as its replacement `vllm` without a url is: by the pods' /render, with a
  note. Two of `path`, `vllm`, `udsTokenizerConfig` together are refused (two sources for one model).

A model named twice is an error. Local tokenizers from the flags and the endpoints file win over
these (`epp.tokenize.registry`); a model with a local tokenizer is never rendered.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from epp.tokenize.render import DEFAULT_MM_TIMEOUT, DEFAULT_TIMEOUT, RenderSpec

TYPES = ("tokenizer", "token-producer")  # llm-d: legacy name, current name


class _UdsTokenizerConfig(msgspec.Struct, forbid_unknown_fields=True):
    socketFile: str = ""
    useTCP: bool = False
    modelTokenizerMap: dict[str, str] | None = None


class _VllmRender(msgspec.Struct, forbid_unknown_fields=True):
    url: str = ""
    http: str = ""  # an older spelling of url
    timeout: str = ""
    mmTimeout: str = ""


class Params(msgspec.Struct, forbid_unknown_fields=True):
    modelName: str = ""
    path: str = ""  # epp's: a local tokenizer directory or tokenizer.json
    udsTokenizerConfig: _UdsTokenizerConfig | None = None
    vllm: _VllmRender | None = None
    estimate: dict[str, Any] | None = None


@dataclasses.dataclass
class Sources:
    """Where each model's token ids come from, per the configuration's producers."""

    paths: dict[str, Path] = dataclasses.field(default_factory=dict)  # model -> local tokenizer
    render: dict[str, RenderSpec] = dataclasses.field(default_factory=dict)  # model ("": all) -> render
    stand_in: bool = False  # llm-d's estimate backend asked for: epp-tiny for unnamed models

    def names(self, model: str) -> bool:
        return model in self.paths or model in self.render


Path_ = tuple[str | int, ...]
ErrorAt = Callable[[Path_, str], Exception]
ValidationErrorAt = Callable[[msgspec.ValidationError, Path_, Sequence[str]], Exception]


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str) -> float | None:
    """Seconds of a Go duration string ("5s", "1m30s", "750ms"); None if it is not one."""
    text = text.strip()
    if not text:
        return None
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            return None
        total += float(match[1]) * _UNIT[match[2]]
        pos = match.end()
    return total if pos == len(text) else None


class Collector:
    """The token producers of one configuration, gathered as `epp.scheduling.config` reads them."""

    def __init__(self, base_dir: Path, error_at: ErrorAt, validation_error_at: ValidationErrorAt) -> None:
        self.base_dir = base_dir
        self._error_at = error_at
        self._validation_error_at = validation_error_at
        self.names: set[str] = set()  # plugin names
        self.sources = Sources()
        self.notes: list[str] = []

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def add(self, path: Path_, name: str, type_name: str, parameters: dict[str, Any] | None) -> None:
        where = (*path, "parameters")
        try:
            params = msgspec.convert(parameters or {}, Params)
        except msgspec.ValidationError as err:
            raise self._validation_error_at(err, where, Params.__struct_fields__) from None
        label = f"plugin {name!r} (type {type_name!r})"
        model = params.modelName.strip()
        backends = [k for k in ("path", "vllm", "udsTokenizerConfig") if getattr(params, k)]
        if len(backends) > 1:
            raise self._error_at(where, f"{label}: give one of {' or '.join(backends)}, not both")
        if params.udsTokenizerConfig is not None:
            # The sidecar tokenizes with the model's own tokenizer; so do the pods' /render.
            self.notes.append(
                f"{label}: udsTokenizerConfig (llm-d's deprecated tokenizer sidecar) is served by the "
                "model servers' /render instead, as its replacement `vllm` without a url"
            )
        self.names.add(name)
        if params.estimate is not None or (not model and not params.path.strip() and params.vllm is None):
            self._estimate(where, label, params)
            return
        if model in self.sources.paths or model in self.sources.render:
            shown = repr(model) if model else "every model"
            raise self._error_at((*where, "modelName"), f"{shown} already has a token producer")
        if params.path.strip():
            if not model:
                raise self._error_at(where, f"{label}: parameters.modelName is required with `path`")
            self.sources.paths[model] = self.base_dir / Path(params.path.strip()).expanduser()
            return
        self.sources.render[model] = self._render_spec(where, params)

    def _estimate(self, where: Path_, label: str, params: Params) -> None:
        tuning = {k: v for k, v in (params.estimate or {}).items() if v}
        if tuning:
            raise self._error_at(
                (*where, "estimate", next(iter(tuning))),
                f"{label}: llm-d's multimodal placeholder estimates are not supported: epp "
                "estimates text only, with its stand-in tokenizer",
            )
        self.sources.stand_in = True
        self.notes.append(
            f"{label}: llm-d's estimate backend: models no tokenizer is named for are tokenized "
            "with epp's stand-in, epp-tiny (approximate ids, never held to the context length)"
        )

    def _render_spec(self, where: Path_, params: Params) -> RenderSpec:
        vllm = params.vllm or _VllmRender()
        if vllm.url and vllm.http and vllm.url != vllm.http:
            raise self._error_at((*where, "vllm"), "vllm.url and vllm.http name two servers")
        url = (vllm.url or vllm.http).strip().rstrip("/") or None
        if url is not None and not url.startswith(("http://", "https://")):
            raise self._error_at((*where, "vllm", "url"), f"vllm.url {url!r} must be an http:// URL")
        times = []
        for key, default in (("timeout", DEFAULT_TIMEOUT), ("mmTimeout", DEFAULT_MM_TIMEOUT)):
            text = getattr(vllm, key)
            seconds = go_duration(text) if text else default
            if seconds is None or seconds <= 0:
                raise self._error_at(
                    (*where, "vllm", key), f"vllm.{key} {text!r}: a positive duration such as '5s'"
                )
            times.append(seconds)
        return RenderSpec(url=url, model_name=params.modelName.strip(), timeout=times[0], mm_timeout=times[1])

    def render_model(self, model: str) -> None:
        """A model llm-d would tokenize with a producer of its own (its precise scorer's
        `indexerConfig.tokenizersPoolConfig`): rendered by the pods unless a producer names it."""
        if model and not self.sources.names(model):
            self.sources.render[model] = RenderSpec()
