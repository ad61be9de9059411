"""Per-model tokenizers in the EndpointPickerConfig: llm-d's `token-producer` (`tokenizer`) plugin,
with epp's `path`, llm-d's `vllm` render backend, or its estimate (epp's stand-in)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from epp.datastore.endpoints import Datastore
from epp.scheduling import config, interfaces
from epp.tokenize.render import RenderSpec

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def load(body: str, base_dir: Path | None = None) -> config.SchedulerConfig:
    handle = interfaces.Handle(datastore=Datastore(), kv_index=None)
    return config.load_config(HEAD + textwrap.dedent(body), handle, base_dir=base_dir)


def test_llm_d_style_tokenizer_plugins(tmp_path: Path) -> None:
    cfg = load(
        """
        plugins:
        - type: tokenizer
          name: tokenizer-llama
          parameters:
            modelName: meta-llama/Llama-3.1-8B-Instruct
            path: /models/llama
        - type: tokenizer
          name: tokenizer-qwen
          parameters:
            modelName: Qwen/Qwen3-8B
            path: qwen              # relative: to the config file's directory
        - type: token-producer      # llm-d's render backend: the pods' /render, or this url
          name: render-mistral
          parameters:
            modelName: mistral
            vllm: {url: "http://render.svc:8000/", timeout: 750ms, mmTimeout: 1m30s}
        - type: queue-scorer
        - type: max-score-picker
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: tokenizer-llama   # llm-d lists its tokenizer with weight 0: no effect here
            weight: 0
          - pluginRef: queue-scorer
          - pluginRef: max-score-picker
        """,
        base_dir=tmp_path,
    )
    assert cfg.tokenizers == {
        "meta-llama/Llama-3.1-8B-Instruct": Path("/models/llama"),
        "Qwen/Qwen3-8B": tmp_path / "qwen",
    }
    profile = cfg.scheduler.profiles[0]
    assert [s.name for s, _ in profile.scorers] == ["queue-scorer"]
    assert "tokenizer" not in " ".join(cfg.plugins)
    assert cfg.render == {
        "mistral": RenderSpec(
            url="http://render.svc:8000", model_name="mistral", timeout=0.75, mm_timeout=90.0
        )
    }
    assert cfg.warnings == [] and not cfg.stand_in


def test_config_file_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "epp.yaml"
    path.parent.mkdir()
    path.write_text(HEAD + "plugins:\n- type: tokenizer\n  parameters: {modelName: m, path: tok}\n")
    handle = interfaces.Handle(datastore=Datastore(), kv_index=None)
    assert config.load_config_file(path, handle).tokenizers == {"m": tmp_path / "conf" / "tok"}


def test_without_a_path_the_pods_render() -> None:
    # llm-d: a modelName alone is its vLLM render backend (at localhost:8000); epp asks the pods
    cfg = load("plugins:\n- type: tokenizer\n  parameters: {modelName: m}\n")
    assert (cfg.tokenizers, cfg.render) == ({}, {"m": RenderSpec(model_name="m")})
    # no modelName: every model; llm-d's deprecated sidecar: the pods' /render, with a note
    cfg = load("plugins:\n- type: token-producer\n  parameters: {vllm: {}}\n")
    assert cfg.render == {"": RenderSpec()}
    cfg = load(
        "plugins:\n- type: tokenizer\n  parameters: {modelName: m, udsTokenizerConfig: {socketFile: /s}}\n"
    )
    assert cfg.render == {"m": RenderSpec(model_name="m")} and "sidecar" in cfg.warnings[0]


def test_estimate_is_the_stand_in() -> None:
    # llm-d's tokenizer-free estimate (also its bare token-producer): epp's stand-in, epp-tiny
    for body in ("- type: token-producer", "- type: token-producer\n  parameters: {estimate: {}}"):
        cfg = load("plugins:\n" + body + "\n")
        assert cfg.stand_in and (cfg.tokenizers, cfg.render) == ({}, {})


def test_no_tokenizer_plugins() -> None:
    assert load("plugins:\n- type: queue-scorer\n").tokenizers == {}


@pytest.mark.parametrize(
    ("plugins", "message"),
    [
        (
            "- type: tokenizer\n  parameters: {path: /t}",
            "plugins[0].parameters (line 5): plugin 'tokenizer' (type 'tokenizer'): "
            "parameters.modelName is required",
        ),
        (
            "- type: tokenizer\n  parameters: {modelName: m, path: /t, vllm: {}}",
            "plugins[0].parameters (line 5): plugin 'tokenizer' (type 'tokenizer'): give one of path or vllm",
        ),
        (
            "- type: tokenizer\n  parameters: {estimate: {image: {mode: static}}}",
            "plugins[0].parameters.estimate.image (line 5)",
        ),
        (
            "- type: tokenizer\n  parameters: {modelName: m, vllm: {url: localhost:8000}}",
            "vllm.url 'localhost:8000' must be an http:// URL",
        ),
        ("- type: tokenizer\n  parameters: {modelName: m, vllm: {timeout: 5}}", "Expected `str`, got `int`"),
        ("- type: tokenizer\n  parameters: {modelName: m, vllm: {timeout: fast}}", "a positive duration"),
        (
            "- type: tokenizer\n  parameters: {modelName: m, path: /t, tokenizersCacheDir: /c}",
            "plugins[0].parameters.tokenizersCacheDir (line 5): unknown key 'tokenizersCacheDir'; "
            "known keys: modelName, path, udsTokenizerConfig",
        ),
        (
            "- type: tokenizer\n  parameters: {modelName: 3, path: /t}",
            "plugins[0].parameters.modelName (line 5): Expected `str`, got `int`",
        ),
        (
            "- {type: tokenizer, name: a, parameters: {modelName: m, path: /t}}\n"
            "- {type: tokenizer, name: b, parameters: {modelName: m, path: /u}}",
            "plugins[1].parameters.modelName (line 5): 'm' already has a token producer",
        ),
        (
            "- {type: tokenizer, parameters: {modelName: m, path: /t}}\n"
            "- {type: tokenizer, parameters: {modelName: n, path: /u}}",
            "plugins[1] (line 5): duplicate plugin name 'tokenizer'",
        ),
    ],
)
def test_errors(plugins: str, message: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        load("plugins:\n" + plugins + "\n")
    assert message in str(info.value)
