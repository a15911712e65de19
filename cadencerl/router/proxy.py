"""Forwarding one placed request to its server, with the router's fault rules.

A request that fails before its first token is retried once on another server (one that refused the
connection leaves rotation until a health poll gets through); a stream that breaks after it ends with
an error event and `[DONE]`, never a hang. Headers pass both ways less the hop-by-hop ones and those
of a re-framed body; the server's own 4xx / 5xx pass unchanged, as vllm-router passes them. The rules
with their reasons: docs/internals.md, "router".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from cadencerl.router import resumable
from cadencerl.router.background import running_id
from cadencerl.router.coalesce import ready_runs, single_runs
from cadencerl.router.framing import EventFramer
from cadencerl.router.live import Session
from cadencerl.router.requests import ApiError, Routed
from cadencerl.router.service import RouterService
from cadencerl.router.stored import ResponseStream
from cadencerl.router.transport import body_chunks, post, raw_reply, read_body

WORKER_HEADER = "x-cadencerl-worker"
END_GRACE_S = 1.0       # how long a stream that sent its end may stay open before the relay ends it
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"proxy-connection"})
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length", b"content-type", b"accept-encoding"}
_NOT_SENT = HOP_BY_HOP | {b"host", b"content-length"}
_NOT_RETURNED = HOP_BY_HOP | {b"content-length", b"content-encoding", b"date", b"server"}   # uvicorn sets its own


def _without(headers: list[tuple[bytes, bytes]], drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """`headers` less the names in `drop` and those the Connection header lists (hop-by-hop too)."""
    kept = [(k, v) for k, v in headers if k.lower() not in drop]
    if len(kept) == len(headers) or not any(k.lower() == b"connection" for k, _ in headers):
        return kept
    listed = {n.strip().lower() for k, v in headers if k.lower() == b"connection" for n in v.split(b",")}
    return [(k, v) for k, v in kept if k.lower() not in listed]


class _BeforeFirstToken(Exception):
    """The server failed before the client saw a byte: the request may go elsewhere. `down`: it did
    not take the connection (as opposed to, say, closing a kept-alive one), so it leaves rotation."""

    def __init__(self, kind: str, down: bool = False) -> None:
        super().__init__(kind)
        self.down = down


def timed_out(svc: RouterService) -> ApiError:
    """The 504 for a server that took the request and did not answer within the request timeout:
    slow is not failed, so it is not sent again (another server would generate it all again)."""
    svc.metrics.errors.labels("timeout").inc()
    return ApiError(504, f"upstream server did not answer within {svc.settings.request_timeout_s:g} s "
                         "(--request-timeout-secs)", kind="upstream_timeout")


def forwarded_headers(headers) -> list[tuple[bytes, bytes]]:
    """The client's request headers as they go upstream (the body is JSON)."""
    return [*_without(headers.raw, _NOT_FORWARDED), (b"content-type", b"application/json")]


def returned_headers(resp: httpx.Response, worker: int) -> list[tuple[bytes, bytes]]:
    """The server's response headers as they go back, with the worker that answered."""
    return [*relayed_headers(resp), (WORKER_HEADER.encode(), str(worker).encode())]


def relayed_headers(resp: httpx.Response) -> list[tuple[bytes, bytes]]:
    """A relayed response's headers as they go back (less hop-by-hop and what the relay sets)."""
    return _without(resp.headers.raw, _NOT_RETURNED)


def sent_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A relayed request's headers as they go on (less hop-by-hop, Host and Content-Length)."""
    return _without(headers, _NOT_SENT)


async def forward(svc: RouterService, session: Session, path: str, req: Routed, headers) -> Response:
    fwd = forwarded_headers(headers)
    retried = False
    while True:
        up = svc.upstreams[session.traj.worker]
        try:
            return await _attempt(svc, session, up.endpoint(path), req, fwd, up.id)
        except _BeforeFirstToken as exc:
            svc.metrics.errors.labels(str(exc)).inc()
            if exc.down:
                svc.upstream_failed(up)
            if not retried and await svc.reroute(session, up.id):
                retried = True
                continue
            svc.release(session, 0, last=req.last)
            if req.previous_response_id is not None:    # pinned: no other server holds what it continues
                raise ApiError(502, f"previous_response_id: the server that holds {req.previous_response_id!r} "
                                    f"failed ({exc})", "previous_response_id", "upstream_error") from None
            raise ApiError(502, f"upstream server failed ({exc})", kind="upstream_error") from None
        except BaseException:
            svc.release(session, 0, last=req.last)    # never leave a session placed with no request
            raise


async def _attempt(svc: RouterService, session: Session, url: httpx.URL, req: Routed, fwd: list,
                   worker: int) -> Response:
    # Straight to the transport: the client's layers (cookies, auth, redirects, default headers such
    # as Accept-Encoding, which a raw relay must not ask for) do nothing a forwarded request needs.
    content = req.raw if req.prompt_ids is None else resumable.upstream_body(req.raw)
    try:
        resp = await post(svc.transport, url, fwd, content, svc.forward_timeout)
    except httpx.ConnectError:     # refused or unreachable: the server is gone
        raise _BeforeFirstToken("connect", down=True) from None
    except httpx.ReadTimeout:
        raise timed_out(svc) from None
    except httpx.HTTPError as exc:
        raise _BeforeFirstToken(f"send_{type(exc).__name__}") from None
    if resp.status_code >= 500:
        svc.metrics.errors.labels("upstream_5xx").inc()
    out_headers = returned_headers(resp, worker)
    if resp.status_code == 200 and req.prompt_ids is not None:
        return await resumable.answer(svc, session, resp, req, out_headers)
    if resp.status_code != 200 or not req.stream:
        try:
            content = await read_body(resp)
        except httpx.ReadTimeout:
            raise timed_out(svc) from None
        except httpx.HTTPError:
            raise _BeforeFirstToken("read") from None
        finally:
            await resp.aclose()
        if req.remember and resp.status_code == 200:
            svc.owners.learn(content, worker, session.traj.context)
        if req.background and resp.status_code == 200 and (running := running_id(content)) is not None:
            svc.follow_background(session, running, worker, req.last)    # released when it is generated
        else:
            svc.release(session, _completion_tokens(content) if resp.status_code == 200 else 0, last=req.last)
        reply = Response(content, status_code=resp.status_code)     # content-length only
        reply.raw_headers.extend(out_headers)
        return reply
    chunks = body_chunks(resp)
    try:
        first = await anext(chunks, b"")
    except httpx.HTTPError as exc:
        await resp.aclose()
        raise (timed_out(svc) if isinstance(exc, httpx.ReadTimeout) else _BeforeFirstToken("stream_start")) from None
    except BaseException:       # the client left before the first chunk: the server's stream is closed
        await resp.aclose()
        raise
    reader = ResponseStream(svc.owners if req.remember else None, worker, session.traj.context) \
        if req.responses else EventCount()
    follow = worker if req.background else None
    return RelayResponse(await primed(_relay(svc, session, resp, chunks, first, req.last, reader, follow)),
                         out_headers)


async def primed(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`body` run to its first `yield b""` (inside its try): an async generator closed before it
    started runs no `finally`, so a relay given up before its first chunk (the client gone while
    the response's head waited to be written) would never release its session or close the stream."""
    await anext(body)
    return body


class LastChunk(bytes):
    """A body's last chunk, when its iterator knows it: it goes out with the end of the body, in one
    write (the iterator is closed after it, not read to its end)."""


class RelayResponse(Response):
    """An SSE relay with one watcher task for the client's disconnect (cheaper per request than
    Starlette's StreamingResponse, which starts a task group); a disconnect stops the relay, which
    closes the upstream stream, so vLLM aborts the request."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes], headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = 200
        self.background = None
        self.body_iterator = body
        self.raw_headers = headers     # no Content-Length: chunked
        if not any(k.lower() == b"content-type" for k, _ in headers):
            self.raw_headers.append((b"content-type", self.media_type.encode()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        relay = asyncio.current_task()
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            relay.cancel()

        watcher = asyncio.create_task(watch())
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            end = b""
            async for chunk in self.body_iterator:
                if type(chunk) is LastChunk:
                    end = chunk
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": end, "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
        finally:
            watcher.cancel()
            await self.body_iterator.aclose()


class EventCount:
    """A completion stream's tokens: its SSE events (vLLM streams about one token per event); it has
    `ended` once `data: [DONE]` went by (each found across a chunk boundary too). Only a `data:`
    that opens a line is an event's: generated text can hold `data: [DONE]` too (JSON escapes none
    of it), but never a raw newline."""

    def __init__(self) -> None:
        self.generated = 0
        self.ended = False
        self._tail = b"\n"      # the stream's start opens a line

    def feed(self, chunk: bytes) -> None:
        tail, seen = self._tail, self._tail + chunk     # an event's start or end cut between chunks
        events = seen.count(_EVENT) - tail.count(_EVENT)
        done = seen.count(_END) - tail.count(_END)
        self.generated += events - done
        self.ended = self.ended or done > 0
        self._tail = seen[-len(_END):]

    @staticmethod
    def error_event(message: str) -> bytes:
        return error_event(message)


async def _relay(svc: RouterService, session: Session, resp: httpx.Response, chunks: AsyncIterator[bytes],
                 first: bytes, last: bool, reader: EventCount | ResponseStream,
                 background: int | None = None) -> AsyncIterator[bytes]:
    """The stream as it arrives, in whole events (`framing.py`), but for the chunk that ends it
    (`[DONE]`, a Responses stream's last event), kept until the upstream closes (at most END_GRACE_S):
    the session is released before that goes out, so a client that sends the next turn as soon as it
    reads the end finds the session parked. `reader` counts the tokens as the chunks pass (a Responses
    stream's also learns its stored response's id, `stored.py`). Chunks that arrived together go out
    together (`runs.py`): one send for a burst of events, not one each. A streamed background
    response (`background`: its server) that the client leaves, or whose stream breaks, before its
    end goes on generating on its server: its session stays placed, followed as a non-streamed one
    is (`background.py`)."""

    def release() -> None:
        nonlocal released
        released = True
        running = None if reader.ended or background is None else reader.response_id
        if running is None:
            svc.release(session, reader.generated, last=last)
        else:
            svc.follow_background(session, running, background, last)

    framer = EventFramer()
    ending = b""            # from the chunk that ends the stream on
    released = False
    runs = single_runs(chunks) if raw_reply(resp) else ready_runs(chunks)
    events = framer.whole(first)
    if background is not None:      # before the client can leave: the response's id is in its first event
        reader.feed(events)
    try:
        yield b""               # `primed`: from here on, closing the relay releases and closes
        if background is None:      # what the client gets is what is counted
            reader.feed(events)
        deadline: float | None = None       # set once the end went by: the stream's close is awaited until then
        while True:
            if deadline is None and reader.ended:       # from the chunk that ends the stream on, all is kept
                ending, framer.partial = events + framer.partial, b""
                deadline = asyncio.get_running_loop().time() + END_GRACE_S
            elif deadline is None and events:
                yield events
            run = await _next_run(runs, deadline)
            if run is None:
                break
            data = b"".join(run)
            if deadline is not None:
                ending += data
            else:
                events = framer.whole(data)
                reader.feed(events)         # what the client gets is what is counted
        release()
        yield LastChunk(ending or framer.partial)
    except httpx.HTTPError as exc:
        svc.metrics.errors.labels("midstream").inc()
        if not released:
            release()
        if ending:              # it broke after its end: the client has what it asked for
            yield ending
        else:                   # after the last whole event: half an event would spoil this one
            yield reader.error_event(f"the upstream stream broke: {type(exc).__name__}")
    finally:
        if not released:
            release()
        await runs.aclose()      # first: a chunk it was waiting for (the client left meanwhile) is given up
        try:
            await resp.aclose()
        except Exception:  # closing a broken connection may fail again; nothing is left to save
            pass


async def _next_run(runs: AsyncIterator[list[bytes]], deadline: float | None) -> list[bytes] | None:
    """The next run of chunks, None at the stream's end; once the stream has sent its end, a server
    that keeps it open (or sends on: keep-alive comments) is not waited on past `deadline`, END_GRACE_S
    after the end (the read timeout would allow minutes)."""
    if deadline is None:
        return await anext(runs, None)
    try:
        return await asyncio.wait_for(anext(runs, None), max(0.0, deadline - asyncio.get_running_loop().time()))
    except TimeoutError:
        return None


DONE = b"data: [DONE]"
_EVENT, _END = b"\ndata: ", b"\n" + DONE     # at a line's start


def error_event(message: str) -> bytes:
    body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": 502}}
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


def _completion_tokens(content: bytes) -> int:
    """Tokens generated, from a completion's `usage.completion_tokens` (a response's `output_tokens`)."""
    try:
        usage = json.loads(content).get("usage") or {}
        return int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return 0
