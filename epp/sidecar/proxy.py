"""`epp sidecar`: the decode pod's side of prefill/decode disaggregation, on aiohttp.

It listens where the pool's target port points (the decode pod's port), in front of the pod's
own vLLM (`--decoder-url`). A completions or chat completions request that names a prefill pod
(`x-prefiller-host-port`, set by the router) is split as `epp.sidecar.protocol` describes: the
prefill leg to that pod, then the decode leg, with the KV handles the prefill returned, to the
local vLLM, whose answer is streamed back as it comes. Every other request, and every path but
those two (`/metrics`, `/health`, `/v1/models`, ...), goes to the local vLLM as it is.

What can go wrong, and what the client gets (never a hang):

- The prefill pod refuses the connection, resets it, or answers 502/503/504: retried on the same
  pod (`--prefill-max-retries`, `--prefill-retry-backoff`), as llm-d's sidecar does.
- The prefill leg does not answer within `--prefill-timeout`, fails for good (other 5xx, bad
  JSON, no `kv_transfer_params`), or the decode pod cannot pull the KV (the prefill pod died after
  its answer: vLLM's NixlConnector then fails the decode request with a 500 at once, before any
  output): with `--prefill-fallback local` (the default) the local vLLM prefills it itself, and
  the answer carries `x-epp-prefill: local`; with `error`, a 502 that names the prefill pod and the
  reason. Each is logged and counted (`epp_sidecar_requests_total{outcome}`): a fallback is never
  silent.
- The prefill pod answers 4xx: the request itself is wrong; that answer goes to the client.
- The client goes away: the handler is cancelled (aiohttp's handler cancellation), which closes
  the open leg's connection; vLLM aborts a request whose connection closes, so neither pod keeps
  working for nobody.
- The local vLLM goes silent mid-answer: `--decode-idle-timeout` without a byte ends the response.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from typing import Any, Final, Literal

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter

from epp.sidecar import protocol

log = logging.getLogger("epp.sidecar")

SPLIT_PATHS: Final = ("/v1/completions", "/v1/chat/completions")
_RETRYABLE: Final = frozenset({502, 503, 504})
# Hop-by-hop headers (RFC 9110 7.6.1) and the ones aiohttp sets itself for the new message.
_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

REGISTRY: Final = CollectorRegistry(auto_describe=True)
REQUESTS: Final = Counter(
    "epp_sidecar_requests",
    "Requests the sidecar handled, by outcome: aggregated (no prefill pod named), disaggregated, "
    "fallback_local (the local vLLM prefilled after the prefill leg or the KV pull failed), "
    "prefill_failed (answered 502, --prefill-fallback error), client_error (4xx from the prefill "
    "pod, or a body that is not JSON), cancelled (the client went away)",
    ["outcome"],
    registry=REGISTRY,
)
PREFILL_ATTEMPTS: Final = Counter(
    "epp_sidecar_prefill_attempts",
    "Prefill legs sent, by result: ok, retried (a transient failure, sent again), failed",
    ["result"],
    registry=REGISTRY,
)


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    decoder_url: str
    """The local vLLM, e.g. http://127.0.0.1:8200."""
    prefill_timeout_s: float = 120.0
    """The whole prefill leg, queueing on the prefill pod included."""
    prefill_max_retries: int = 2
    prefill_retry_backoff_s: float = 0.1
    prefill_fallback: Literal["local", "error"] = "local"
    connect_timeout_s: float = 5.0
    decode_idle_timeout_s: float = 300.0
    """The longest the decode leg may go without a byte (its KV pull and queueing included)."""
    prefill_tls: bool = False
    """Reach prefill pods over HTTPS (llm-d's `--enable-tls prefiller`)."""
    prefill_verify: bool = True
    """Check the prefill pods' certificates (off: llm-d's `--tls-insecure-skip-verify prefiller`)."""
    decoder_verify: bool = True
    """Check an https decoder URL's certificate (off: `--tls-insecure-skip-verify decoder`)."""
    prefiller_sampling: bool = False
    """Of several prefill pods in the header, pick one at random rather than the first
    (llm-d's `--enable-prefiller-sampling`)."""
    rank_decoders: Mapping[int, str] = dataclasses.field(default_factory=dict)
    """On the first rank's listener: each data-parallel rank's port -> its model server's URL, for
    a request whose `x-data-parallel-host-port` names a rank (llm-d's deprecated DP routing)."""
    pod_ip: str = ""
    """This pod's address ($POD_IP): a rank header naming another host is refused, as llm-d's."""

    def __post_init__(self) -> None:
        if not self.decoder_url.startswith(("http://", "https://")):
            raise ValueError(f"decoder URL {self.decoder_url!r} must start with http:// or https://")
        for name in ("prefill_timeout_s", "connect_timeout_s", "decode_idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.prefill_max_retries < 0 or self.prefill_retry_backoff_s < 0:
            raise ValueError("prefill retries and backoff must be >= 0")


class _PrefillFailed(Exception):
    """The prefill leg failed for good; `reason` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Answered(Exception):
    """The prefill pod's answer goes to the client as it is (a 4xx: the request is wrong)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


class Sidecar:
    """The proxy; `app()` is its aiohttp application. One `aiohttp.ClientSession` for both legs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.decoder = settings.decoder_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._warned_encode = False

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 << 20)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        # No pool limit: the pod's concurrency is vLLM's to bound, not the sidecar's.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def _close(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the application has not started"
        return self._session

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = _forwarded(request.headers)
        target = protocol.prefiller(
            request.headers.getall(protocol.PREFILL_HEADER, []), sample=self.settings.prefiller_sampling
        )
        headers.popall(protocol.PREFILL_HEADER, None)
        rank = request.headers.get(protocol.DATA_PARALLEL_HEADER)
        if rank and self.settings.rank_decoders:
            port = protocol.rank_port(rank, self.settings.pod_ip)
            decoder = self.settings.rank_decoders.get(port) if port is not None else None
            if decoder is None:
                REQUESTS.labels("client_error").inc()
                return _error(400, f"{protocol.DATA_PARALLEL_HEADER} {rank!r} names no rank of this pod")
            request[_DECODER] = decoder.rstrip("/")
        if headers.popall(protocol.ENCODER_HEADER, None) and not self._warned_encode:
            # E/P/D's encode stage needs vLLM's EC connectors, which this sidecar does not speak.
            self._warned_encode = True
            log.warning(
                "%s names encode pods; epp sidecar runs no encode stage (the prefilling vLLM "
                "encodes): run llm-d's routing sidecar with --ec-connector for E/P/D",
                protocol.ENCODER_HEADER,
            )
        if target is None or request.method != "POST" or request.path not in SPLIT_PATHS:
            if target is None and request.path in SPLIT_PATHS:
                REQUESTS.labels("aggregated").inc()
            return await self._relay(request, self._decoder_url(request), headers, body)
        try:
            parsed = json.loads(body)
            if not isinstance(parsed, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            REQUESTS.labels("client_error").inc()
            return _error(400, f"the request body is not a JSON object: {err}")
        try:
            return await self._split(request, headers, body, parsed, target)
        except asyncio.CancelledError:
            REQUESTS.labels("cancelled").inc()
            raise

    async def _split(
        self,
        request: web.Request,
        headers: CIMultiDict[str],
        body: bytes,
        parsed: dict[str, Any],
        target: str,
    ) -> web.StreamResponse:
        started = time.monotonic()
        try:
            params = await self._prefill(target, request.path, headers, parsed)
        except _Answered as answered:
            REQUESTS.labels("client_error").inc()
            return answered.response
        except _PrefillFailed as failed:
            return await self._fall_back(request, headers, body, target, failed.reason)
        prefill_s = time.monotonic() - started
        decode = protocol.decode_body(parsed, params)
        marks = {protocol.PREFILL_RESULT_HEADER: target, protocol.PREFILL_SECONDS_HEADER: f"{prefill_s:.6f}"}
        response = await self._relay(
            request, self._decoder_url(request), headers, _json(decode), marks=marks, fail_over=True
        )
        if response is _FAILED_OVER:
            return await self._fall_back(
                request, headers, body, target, "the decode pod could not pull the KV"
            )
        REQUESTS.labels("disaggregated").inc()
        return response

    async def _fall_back(
        self, request: web.Request, headers: CIMultiDict[str], body: bytes, target: str, reason: str
    ) -> web.StreamResponse:
        if self.settings.prefill_fallback == "error":
            log.warning("prefill on %s failed: %s; answering 502", target, reason)
            REQUESTS.labels("prefill_failed").inc()
            return _error(502, f"prefill on {target} failed: {reason}")
        log.warning("prefill on %s failed: %s; prefilling on the local vLLM", target, reason)
        REQUESTS.labels("fallback_local").inc()
        marks = {protocol.PREFILL_RESULT_HEADER: "local"}
        return await self._relay(request, self._decoder_url(request), headers, body, marks=marks)

    async def _prefill(
        self, target: str, path: str, headers: CIMultiDict[str], parsed: dict[str, Any]
    ) -> dict[str, Any]:
        """The prefill leg, retried on transient failures; the `kv_transfer_params` it returned."""
        settings = self.settings
        payload = _json(protocol.prefill_body(parsed))
        out_headers = CIMultiDict(headers)
        out_headers["content-type"] = "application/json"
        url = f"{'https' if settings.prefill_tls else 'http'}://{target}{path}"
        deadline = time.monotonic() + settings.prefill_timeout_s
        reason = ""
        for attempt in range(settings.prefill_max_retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if attempt:
                PREFILL_ATTEMPTS.labels("retried").inc()
                await asyncio.sleep(min(settings.prefill_retry_backoff_s, left))
            timeout = aiohttp.ClientTimeout(
                total=max(deadline - time.monotonic(), 0.001), sock_connect=settings.connect_timeout_s
            )
            try:
                async with self.session.post(
                    url, data=payload, headers=out_headers, timeout=timeout, ssl=settings.prefill_verify
                ) as resp:
                    raw = await resp.read()
                    status = resp.status
                    content_type = resp.headers.get("content-type", "application/json")
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as err:
                reason = f"{type(err).__name__}: {err}"
                continue
            except TimeoutError:
                reason = f"no answer within {settings.prefill_timeout_s:g} s"
                break
            if status in _RETRYABLE:
                reason = f"HTTP {status}"
                continue
            if 400 <= status < 500:
                PREFILL_ATTEMPTS.labels("failed").inc()
                raise _Answered(
                    web.Response(status=status, body=raw, content_type=content_type.split(";")[0])
                )
            if status != 200:
                reason = f"HTTP {status}: {raw[:200].decode(errors='replace')}"
                break
            try:
                params = protocol.transfer_params(json.loads(raw))
            except (ValueError, protocol.ProtocolError) as err:
                reason = str(err)
                break
            PREFILL_ATTEMPTS.labels("ok").inc()
            return params
        PREFILL_ATTEMPTS.labels("failed").inc()
        raise _PrefillFailed(reason or f"no answer within {settings.prefill_timeout_s:g} s")

    def _decoder_url(self, request: web.Request) -> str:
        return f"{request.get(_DECODER, self.decoder)}{request.rel_url}"

    async def _relay(
        self,
        request: web.Request,
        url: str,
        headers: CIMultiDict[str],
        body: bytes,
        *,
        marks: Mapping[str, str] | None = None,
        fail_over: bool = False,
    ) -> web.StreamResponse:
        """Send the request to `url` and stream the answer back as it comes. With `fail_over`, a
        5xx answer is not relayed: `_FAILED_OVER` is returned instead, nothing having been sent."""
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.settings.connect_timeout_s,
            sock_read=self.settings.decode_idle_timeout_s,
        )
        response: web.StreamResponse | None = None
        try:
            async with self.session.request(
                request.method,
                url,
                data=body or None,
                headers=headers,
                timeout=timeout,
                ssl=self.settings.decoder_verify,  # aiohttp: True checks, False does not
            ) as upstream:
                if fail_over and upstream.status >= 500:
                    detail = await upstream.read()
                    log.warning(
                        "decode leg answered %d: %s", upstream.status, detail[:300].decode(errors="replace")
                    )
                    return _FAILED_OVER
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for key, value in upstream.headers.items():
                    if key.lower() not in _HOP:
                        response.headers.add(key, value)
                for key, value in (marks or {}).items():
                    response.headers[key] = value
                if upstream.content_length is not None:
                    response.content_length = upstream.content_length
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as err:
            if response is not None and response.prepared:
                # Mid-answer: the client must see a cut stream, not a complete one. Raising out
                # of the handler makes aiohttp drop the connection.
                log.warning("the local model server failed mid-answer: %s: %s", type(err).__name__, err)
                raise
            if fail_over:
                log.warning("decode leg failed: %s: %s", type(err).__name__, err)
                return _FAILED_OVER
            return _error(
                502, f"the local model server at {self.decoder} failed: {type(err).__name__}: {err}"
            )


_FAILED_OVER: Final = web.StreamResponse(status=599)
_DECODER: Final = "epp.sidecar.decoder"  # a request's model server, when its rank header chose one
"""Marker: the decode leg failed before answering anything (see `Sidecar._relay`)."""


def _forwarded(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        if key.lower() not in _HOP:
            out.add(key, value)
    return out


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _error(status: int, message: str) -> web.Response:
    kind = "BadRequestError" if status < 500 else "BadGatewayError"
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.Response(status=status, body=_json(body), content_type="application/json")
