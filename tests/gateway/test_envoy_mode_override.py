"""The mode-override gateway config: what `override_params` and `epp envoy-config` produce, and
that the real Envoy 1.40 loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from epp import cli
from epp.gateway import envoy
from epp.gateway.envoy import BodyMode, GatewayParams

needs_envoy = pytest.mark.skipif(envoy.find_envoy() is None, reason="envoy binary not found")


def ext_proc(config: dict[str, Any]) -> dict[str, Any]:
    (listener,) = config["static_resources"]["listeners"]
    filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    (found,) = [f for f in filters if f["name"] == "envoy.filters.http.ext_proc"]
    typed: dict[str, Any] = found["typed_config"]
    return typed


def listener(config: dict[str, Any]) -> dict[str, Any]:
    (found,) = config["static_resources"]["listeners"]
    result: dict[str, Any] = found
    return result


def base() -> GatewayParams:
    return GatewayParams(listen_port=10000, admin_port=19000)


def test_override_params_buffer_the_request_and_stream_the_response() -> None:
    config = envoy.gateway_config(envoy.override_params(base()))
    f = ext_proc(config)
    assert f["allow_mode_override"] is True
    assert f["processing_mode"] == {
        "request_header_mode": "SEND",
        "request_body_mode": "BUFFERED",
        "request_trailer_mode": "SKIP",
        "response_header_mode": "SEND",
        "response_body_mode": "STREAMED",
        "response_trailer_mode": "SKIP",
    }
    # Envoy answers 413 above its default 1 MiB buffer; epp accepts 16 MiB bodies.
    assert listener(config)["per_connection_buffer_limit_bytes"] == 16 << 20


def test_gies_config_is_unchanged() -> None:
    config = envoy.gateway_config(base())
    f = ext_proc(config)
    assert "allow_mode_override" not in f
    assert f["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert f["processing_mode"]["response_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert "per_connection_buffer_limit_bytes" not in listener(config)


@pytest.mark.parametrize(
    "fields",
    [
        {"body_mode": BodyMode.FULL_DUPLEX_STREAMED, "response_body_mode": BodyMode.STREAMED},
        {"body_mode": BodyMode.BUFFERED, "response_body_mode": BodyMode.FULL_DUPLEX_STREAMED},
        {"body_mode": BodyMode.BUFFERED, "response_body_mode": BodyMode.STREAMED, "process_responses": False},
    ],
)
def test_an_override_envoy_would_ignore_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="mode override needs"):
        GatewayParams(listen_port=10000, admin_port=19000, mode_override=True, **fields)


def generate(tmp_path: Path, *argv: str) -> dict[str, Any]:
    out = tmp_path / "envoy.yaml"
    assert cli.main(["envoy-config", "-o", str(out), *argv]) == 0
    config: dict[str, Any] = yaml.safe_load(out.read_text())
    return config


def test_envoy_config_turns_it_on_by_default(tmp_path: Path) -> None:
    f = ext_proc(generate(tmp_path))
    assert f["allow_mode_override"] is True
    assert f["processing_mode"]["response_body_mode"] == "STREAMED"
    off = ext_proc(generate(tmp_path, "--mode-override=false"))
    assert "allow_mode_override" not in off
    assert off["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    plain = ext_proc(generate(tmp_path, "--process-responses=false"))
    assert "allow_mode_override" not in plain
    assert plain["processing_mode"]["response_body_mode"] == "NONE"


def test_envoy_config_refuses_full_duplex_with_the_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["envoy-config", "--body-mode", "FULL_DUPLEX_STREAMED"]) == 2
    assert "--mode-override=false" in capsys.readouterr().err


@needs_envoy
def test_envoy_loads_the_override_config(tmp_path: Path) -> None:
    path = envoy.write_config(tmp_path / "envoy.yaml", envoy.override_params(base()))
    result = envoy.validate_config(path)
    assert result.returncode == 0, result.stderr + result.stdout
