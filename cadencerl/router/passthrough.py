"""Routes the router places and relays without making them sessions: embeddings and rerank.

`/v1/embeddings`, `/v1/rerank` and `/rerank` are one prefill with no decode: no KV held once answered
and no next turn, so MISA-T has nothing to admit. They are placed by the placement policy's own rule
(`LiveState.route_outside`), relayed with completions' fault rules, and counted in their server's
load while they run (`Worker.outside`). `/v1/responses` generates, so it is admitted (`app.py`).
Details: docs/internals.md, "router".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx
from starlette.requests import Request
from starlette.responses import Response

from cadencerl.router.disconnect import CLIENT_CLOSED, while_connected
from cadencerl.router.framing import EventFramer
from cadencerl.router.proxy import RelayResponse, forwarded_headers, primed, returned_headers, timed_out
from cadencerl.router.requests import ApiError, PassThrough, error_response, read_pass_through
from cadencerl.router.service import Rejected, RouterService
from cadencerl.router.stored import ResponseStream
from cadencerl.router.upstream import Upstream

PASS_THROUGH = ("/v1/embeddings", "/v1/rerank", "/rerank",
                # vLLM's other POST routes, placed the same way: tokenizer work, SageMaker's entry, a render
                "/tokenize", "/detokenize", "/invocations", "/v1/completions/render")


def pass_through(path: str):
    """The handler of one pass-through route."""
    async def handler(request: Request) -> Response:
        svc: RouterService = request.app.state.service
        try:
            req = await read_pass_through(request, svc.settings.max_body_bytes)
        except ApiError as exc:
            svc.metrics.errors.labels("bad_request").inc()
            return exc.response()
        svc.metrics.pass_through.labels(path).inc()
        response = await while_connected(request, _relay(svc, path, req, request.headers))
        if response is None:
            svc.metrics.errors.labels("client_disconnect").inc()
            return Response(status_code=CLIENT_CLOSED)
        return response
    return handler


def place_outside(svc: RouterService, group: int, prompt_len: int, route_key: str,
                  exclude: frozenset[int] = frozenset()) -> Upstream:
    """The server for a request outside sessions, after a decision pass (what waits goes first);
    Rejected (503) when no server other than `exclude` is up."""
    now = svc.now()
    svc.decide(now)
    worker = svc.state.route_outside(group, prompt_len, route_key, now, exclude)
    if worker is None:
        raise Rejected(503, "no_worker", "no server is up; retry later", svc.retry_after())
    return svc.upstreams[worker]


@contextmanager
def outside(svc: RouterService, up: Upstream) -> Iterator[None]:
    """A request outside sessions counts in its server's load while it runs (so load-based rules
    see it), whichever way it ends: answer, error, or the client leaving (a cancellation)."""
    worker = svc.state.workers[up.id]
    worker.outside += 1
    try:
        yield
    finally:
        worker.outside -= 1


async def _relay(svc: RouterService, path: str, req: PassThrough, headers) -> Response:
    fwd = forwarded_headers(headers)
    failed: frozenset[int] = frozenset()
    why = ""
    while True:
        try:
            up = place_outside(svc, req.group, req.prompt_len, req.route_key, failed)
        except Rejected as exc:
            if failed:      # no other server to retry on: the failure is the answer, not a rejection
                return error_response(502, f"upstream server failed ({why}); no other server is up",
                                      kind="upstream_error")
            svc.metrics.rejections.labels(exc.reason).inc()
            return error_response(exc.status, str(exc), None, exc.reason, {"Retry-After": str(exc.retry_after)})
        if failed:
            svc.metrics.retries.inc()
        try:
            with outside(svc, up):
                return await relay_once(svc, up, "POST", path, req.raw, fwd, stream=False)
        except httpx.ReadTimeout:
            return timed_out(svc).response()
        except httpx.HTTPError as exc:
            why = failure(svc, up, exc)
            if failed:
                return error_response(502, f"upstream server failed ({why}), and the retry too",
                                      kind="upstream_error")
            failed = frozenset({up.id})


async def relay_once(svc: RouterService, up: Upstream, method: str, path: str, content: bytes, fwd: list,
                     stream: bool) -> Response:
    """One request to one server and its answer, passed unchanged (an SSE answer streamed when
    `stream`); raises httpx.HTTPError when the server fails before answering."""
    request = httpx.Request(method, up.url + path, content=content, headers=fwd,
                            extensions={"timeout": svc.forward_timeout})
    resp = await svc.transport.handle_async_request(request)
    if resp.status_code >= 500:
        svc.metrics.errors.labels("upstream_5xx").inc()
    out_headers = returned_headers(resp, up.id)
    if stream and resp.status_code == 200 and resp.headers.get("content-type", "").startswith("text/event-stream"):
        return RelayResponse(await primed(_chunks(svc, resp)), out_headers)
    try:
        content = await resp.aread()
    finally:
        await resp.aclose()
    reply = Response(content, status_code=resp.status_code)     # content-length only
    reply.raw_headers.extend(out_headers)
    return reply


def failure(svc: RouterService, up: Upstream, exc: httpx.HTTPError) -> str:
    """Count a request that failed before its answer; a server that refused the connection leaves rotation."""
    refused = isinstance(exc, httpx.ConnectError)
    why = "connect" if refused else f"send_{type(exc).__name__}"
    svc.metrics.errors.labels(why).inc()
    if refused:
        svc.upstream_failed(up)
    return why


async def _chunks(svc: RouterService, resp: httpx.Response) -> AsyncIterator[bytes]:
    """A stored response's stream as it comes (`GET /v1/responses/{id}?stream=true`, the one streamed
    pass-through); one that breaks ends with the Responses API's error event, as a relayed one does."""
    reader = ResponseStream(None, -1)        # numbers the error event after the last one relayed
    framer = EventFramer()                   # whole events only: the error event must not join half of one
    try:
        yield b""               # `primed`: from here on, closing it closes the stream
        async for chunk in resp.aiter_raw():
            if events := framer.whole(chunk):
                reader.feed(events)         # numbers the error event after what the client got
                yield events
        if framer.partial:      # the stream ended without a blank line: what there is
            yield framer.partial
    except httpx.HTTPError as exc:
        svc.metrics.errors.labels("midstream").inc()
        yield reader.error_event(f"the upstream stream broke: {type(exc).__name__}")
    finally:
        await resp.aclose()
