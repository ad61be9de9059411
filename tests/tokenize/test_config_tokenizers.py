"""Per-model tokenizers in the EndpointPickerConfig: llm-d's `tokenizer` plugin with epp's `path`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from epp.datastore.endpoints import Datastore
from epp.scheduling import config, interfaces

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
            udsTokenizerConfig:     # llm-d's sidecar socket: accepted, not used
              socketFile: /tmp/tokenizer/tokenizer-uds.socket
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
    assert cfg.warnings == [
        "plugin 'tokenizer-qwen' (type 'tokenizer'): udsTokenizerConfig is ignored: epp tokenizes in-process"
    ]


def test_config_file_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "epp.yaml"
    path.parent.mkdir()
    path.write_text(HEAD + "plugins:\n- type: tokenizer\n  parameters: {modelName: m, path: tok}\n")
    handle = interfaces.Handle(datastore=Datastore(), kv_index=None)
    assert config.load_config_file(path, handle).tokenizers == {"m": tmp_path / "conf" / "tok"}


def test_without_a_path_the_model_needs_a_tokenizer_from_elsewhere() -> None:
    # llm-d's configs name no path (its sidecar loads the tokenizer): the caller must find one.
    cfg = load("plugins:\n- type: tokenizer\n  parameters: {modelName: m}\n")
    assert (cfg.tokenizers, cfg.tokenizer_models) == ({}, ["m"])


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
        ("- type: tokenizer", "parameters.modelName is required"),
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
            "plugins[1].parameters.modelName (line 5): model 'm' already has a tokenizer",
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
