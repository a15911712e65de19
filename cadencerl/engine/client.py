"""An asyncio client for one vLLM server: token ids in, token ids out, abort, metrics.

Generation goes through `POST /inference/v1/generate`, which takes the caller's request id (so an
explicit abort is possible). A failed generation is an outcome, not an exception: the tokens
streamed before it let the controller resume the trajectory elsewhere. Every call has a timeout;
connection failures are retried a bounded number of times. The pitfalls each rule answers:
docs/internals.md, "engine".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Self, TypeVar

import httpx

from cadencerl.engine.errors import (EngineConnectionError, EngineError, EngineHTTPError, EngineProtocolError,
                                     EngineTimeoutError, EngineUnreachableError, ModelMismatchError)
from cadencerl.engine.server_metrics import EngineMetrics, MetricsFormatError, parse_metrics

Liveness = Literal["healthy", "unhealthy", "refused", "slow"]

FinishReason = Literal["length", "stop", "aborted", "error"]
"""`stop` only appears if a stop condition was set server-side; requests here use ignore_eos."""

SERVER_REQUEST_ID_PREFIX = "generate-tokens-"
"""vLLM names a /inference/v1/generate request `generate-tokens-<caller id>` internally."""

KEEPALIVE_EXPIRY_S = 1.0
"""How long an idle connection to a server is kept for reuse. vLLM's API server closes one idle
for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default), httpx's default is also 5 s: a request written
on a connection just as the server closes it breaks before any answer (ReadError or
RemoteProtocolError) on a healthy server. Dropping idle connections well before closes that race."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class Timeouts:
    """Seconds. `stream_read` bounds the gap between two chunks of a generation stream."""

    connect: float = 2.0
    request: float = 10.0
    stream_read: float = 60.0


@dataclass(frozen=True)
class GenerationOutcome:
    """What one generate call produced; `token_ids` are kept whatever the finish reason."""

    token_ids: list[int]
    finish_reason: FinishReason
    error: EngineError | None = None

    def raise_for_error(self) -> None:
        if self.error is not None:
            raise self.error


class VLLMClient:
    """Client for ONE vLLM OpenAI-compatible server started with `--enable-scale-out`.

    Use as `async with VLLMClient(url, model="tiny") as client: ...` (or call `aclose()`).
    """

    def __init__(self, base_url: str, *, model: str, timeouts: Timeouts = Timeouts(), retries: int = 3,
                 backoff_s: float = 0.2, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeouts = timeouts
        self.retries = max(1, retries)
        self.backoff_s = backoff_s
        self.max_model_len: int | None = None
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeouts.request, connect=timeouts.connect),
            # No cap on connections: each in-flight generation holds one stream, and a capped pool
            # would turn "more streams than the cap" into pool timeouts. The server queues excess.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64,
                                keepalive_expiry=KEEPALIVE_EXPIRY_S),
            transport=transport,
            trust_env=False,  # never route a server call through an environment proxy
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    async def _with_retries(self, path: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """Run `call`, retrying only failures where the request never reached the server."""
        url = self._url(path)
        for attempt in range(self.retries):
            try:
                return await call()
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt + 1 == self.retries:
                    raise EngineUnreachableError(
                        f"cannot connect after {self.retries} tries: {_describe(exc)}", url=url
                    ) from exc
                await asyncio.sleep(self.backoff_s * 2**attempt)
            except httpx.TimeoutException as exc:
                raise EngineTimeoutError(f"timed out: {_describe(exc)}", url=url) from exc
            except httpx.TransportError as exc:
                raise EngineConnectionError(f"connection failed: {_describe(exc)}", url=url) from exc
        raise AssertionError("unreachable")

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await self._with_retries(path, lambda: self._http.request(method, path, **kwargs))
        _raise_for_status(response, self._url(path))
        return response

    async def health(self, *, refused_is_final: bool = False) -> bool:
        """True when GET /health answers 200 within the request timeout; never raises, unless
        `refused_is_final` and nothing listens at the URL, or what answers is no vLLM server (a 404:
        vLLM serves /health as soon as it listens, so no wait would change it)."""
        verdict, status = await self._probe_health(self.timeouts.request)
        if refused_is_final and verdict == "refused":
            raise EngineConnectionError("connection refused (no server listens there)", url=self._url("/health"))
        if refused_is_final and status == 404:
            raise EngineConnectionError("GET /health answered 404: no vLLM server serves this URL "
                                        "(another service, or a wrong path)", url=self._url("/health"))
        return verdict == "healthy"

    async def liveness(self, timeout_s: float) -> Liveness:
        """One /health probe that tells a dead server from a slow one: `refused` (nothing listens),
        `unhealthy` (it answered, not 200: vLLM's engine died), `slow` (no answer in `timeout_s`
        or a transport error: a starved machine looks like this), or `healthy`."""
        return (await self._probe_health(timeout_s))[0]

    async def _probe_health(self, timeout_s: float) -> tuple[Liveness, int | None]:
        """`liveness`'s verdict and the status /health answered with (None: no answer)."""
        try:
            response = await asyncio.wait_for(self._http.get("/health", timeout=timeout_s), timeout_s)
        except httpx.ConnectError as exc:
            return ("refused" if _refused(exc) else "slow"), None
        except (httpx.HTTPError, TimeoutError):
            return "slow", None
        return ("healthy" if response.status_code == 200 else "unhealthy"), response.status_code

    async def wait_healthy(self, timeout_s: float, *, poll_s: float = 0.5, refused_is_final: bool = False) -> None:
        """Poll /health until it answers 200; raise `EngineTimeoutError` after `timeout_s`, or
        `EngineConnectionError` at once on a refused connection when `refused_is_final` (a server
        that should be up, not one still starting)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise EngineTimeoutError(f"not healthy after {timeout_s:.0f} s", url=self._url("/health"))
            try:
                if await asyncio.wait_for(self.health(refused_is_final=refused_is_final), timeout=remaining):
                    return
            except TimeoutError:
                continue
            await asyncio.sleep(min(poll_s, max(0.0, deadline - loop.time())))

    async def check_model(self, name: str | None = None) -> int:
        """Check the server serves `name` (default: the client's model); return max_model_len."""
        name = name or self.model
        path = "/v1/models"
        data = _json(await self._request("GET", path), self._url(path))
        served = {m.get("id"): m for m in data.get("data", []) if isinstance(m, dict)}
        if name not in served:
            raise ModelMismatchError(f"model {name!r} not served; server has {sorted(map(str, served))}",
                                     url=self._url(path))
        max_len = served[name].get("max_model_len")
        if isinstance(max_len, int):
            self.max_model_len = max_len
        return max_len if isinstance(max_len, int) else 0

    async def metrics(self) -> EngineMetrics:
        """One reading of /metrics (gauges lag the streams by the engine's stats interval)."""
        path = "/metrics"
        response = await self._request("GET", path)
        try:
            return parse_metrics(response.text)
        except MetricsFormatError as exc:
            raise EngineProtocolError(str(exc), url=self._url(path)) from exc

    async def kv_capacity(self) -> int:
        """The server's KV cache size in tokens, from /metrics' cache-config labels."""
        kv = (await self.metrics()).kv_capacity_tokens
        if kv is None:
            raise EngineProtocolError("/metrics has no vllm:cache_config_info with the KV size",
                                      url=self._url("/metrics"))
        return kv

    async def abort(self, request_id: str) -> None:
        """Ask the server to abort `request_id` (as passed to `generate`); the stream then ends
        with finish_reason "aborted". Unknown or finished ids are a no-op on the server."""
        await self.abort_many([request_id])

    async def abort_many(self, request_ids: Iterable[str]) -> None:
        ids = [SERVER_REQUEST_ID_PREFIX + rid for rid in request_ids]
        if ids:
            await self._request("POST", "/inference/v1/abort_requests", json={"request_ids": ids})

    async def generate(
        self,
        request_id: str,
        token_ids: list[int],
        max_tokens: int,
        on_tokens: Callable[[list[int]], None] | None = None,
        *,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> GenerationOutcome:
        """Stream up to `max_tokens` new ids after the prompt `token_ids` (EOS ignored).

        `on_tokens` gets each new chunk of ids as it arrives. Server or transport failures are
        returned as `finish_reason="error"` with the ids received so far; invalid arguments raise
        `ValueError`. Cancelling the calling task closes the stream, which aborts the request.
        """
        if not token_ids:
            raise ValueError("token_ids must not be empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if self.max_model_len is not None and len(token_ids) + max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt {len(token_ids)} + max_tokens {max_tokens} exceeds "
                f"max_model_len {self.max_model_len} of {self.base_url}"
            )
        sampling: dict[str, Any] = {
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": temperature,
            "detokenize": False,
        }
        if seed is not None:
            sampling["seed"] = seed
        body = {
            "request_id": request_id,
            "model": self.model,
            "token_ids": token_ids,
            "sampling_params": sampling,
            "stream": True,
        }
        received: list[int] = []
        try:
            finish = await self._stream_generate(body, received, on_tokens)
        except EngineError as exc:
            return GenerationOutcome(received, "error", exc)
        return GenerationOutcome(received, finish)

    async def _stream_generate(self, body: dict[str, Any], received: list[int],
                               on_tokens: Callable[[list[int]], None] | None) -> FinishReason:
        path = "/inference/v1/generate"
        url = self._url(path)
        timeout = httpx.Timeout(self.timeouts.stream_read, connect=self.timeouts.connect)
        request = self._http.build_request("POST", path, json=body, timeout=timeout)
        response = await self._with_retries(path, lambda: self._http.send(request, stream=True))
        try:
            if response.status_code >= 400:
                await response.aread()
                _raise_for_status(response, url)
            finish = await _read_stream(response, url, received, on_tokens)
        except httpx.TimeoutException as exc:
            raise EngineTimeoutError(f"no stream data for {self.timeouts.stream_read:.0f} s after "
                                     f"{len(received)} tokens", url=url) from exc
        except httpx.TransportError as exc:
            raise EngineConnectionError(
                f"stream broke after {len(received)} tokens: {_describe(exc)}", url=url
            ) from exc
        finally:
            await response.aclose()  # on cancellation too: the disconnect aborts the request
        if finish not in _FINISH:
            raise EngineProtocolError(
                f"stream ended with finish reason {finish!r} after {len(received)} tokens", url=url
            )
        return _FINISH[finish]


async def _read_stream(
    response: httpx.Response,
    url: str,
    received: list[int],
    on_tokens: Callable[[list[int]], None] | None,
) -> str | None:
    """Consume the SSE events of one generation; return the last finish reason seen."""
    finish: str | None = None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        chunk = _loads(payload, url)
        if "error" in chunk:   # vLLM rejects a bad streamed request with 200, then an event carrying its 4xx
            code = chunk["error"].get("code") if isinstance(chunk["error"], dict) else None
            if isinstance(code, int) and 400 <= code < 600:
                raise EngineHTTPError(f"HTTP {code} in stream: {_error_text(chunk)}", url=url, status_code=code)
            raise EngineProtocolError(f"server error in stream: {_error_text(chunk)}", url=url)
        for choice in chunk.get("choices") or ():
            new = choice.get("token_ids") or []
            if new:
                received.extend(new)
                if on_tokens is not None:
                    on_tokens(list(new))
            finish = choice.get("finish_reason") or finish
    return finish


_FINISH: dict[str, FinishReason] = {"length": "length", "abort": "aborted", "stop": "stop"}


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _loads(payload: str, url: str) -> dict[str, Any]:
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise EngineProtocolError(f"invalid JSON from server: {payload[:120]!r}", url=url) from exc
    if not isinstance(data, dict):
        raise EngineProtocolError(f"unexpected JSON from server: {payload[:120]!r}", url=url)
    return data


def _json(response: httpx.Response, url: str) -> dict[str, Any]:
    return _loads(response.text, url)


def _error_text(data: dict[str, Any]) -> str:
    error = data.get("error")
    if isinstance(error, dict):
        return str(error.get("message", error)).splitlines()[0][:300]
    return str(error or data.get("detail") or data)[:300]


def _raise_for_status(response: httpx.Response, url: str) -> None:
    if response.status_code < 400:
        return
    try:
        detail = _error_text(response.json())
    except ValueError:
        detail = response.text.strip().splitlines()[0][:300] if response.text.strip() else ""
    raise EngineHTTPError(
        f"HTTP {response.status_code} {response.reason_phrase}: {detail}".rstrip(": "),
        url=url,
        status_code=response.status_code,
    )


def _refused(exc: BaseException) -> bool:
    """Whether a connect error is a refusal (ECONNREFUSED), looking through its causes."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or "refused" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False
