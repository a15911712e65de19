"""The generating routes' data path: served on the connection's own protocol, not through ASGI.

`POST /v1/completions` and `/v1/chat/completions` (most of a rollout's traffic) are read by
httptools' callbacks into one buffer, checked and placed by the same code as on the ASGI path
(`requests.py`, `app.serve_routed`) and answered by writes to the transport: a JSON reply in one
write, a stream as the relay's chunks (the server's bytes, cut only at event boundaries). No ASGI
messages, Starlette request or disconnect-watcher task between. Every other request (other routes,
a query string, HTTP/1.0, one pipelined behind another) goes on to uvicorn's protocol, which this
class is (with limits.py's head limits), and the Starlette app, on the same connection.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus

from starlette.responses import Response

from cadencerl.router.app import GeneratingRoutes, rejection, serve_routed
from cadencerl.router.limits import LimitedHttpToolsProtocol, _Refused
from cadencerl.router.proxy import LastChunk, RelayResponse
from cadencerl.router.rejections import Rejected
from cadencerl.router.request_id import HEADER as REQUEST_ID
from cadencerl.router.request_id import new_request_id
from cadencerl.router.requests import ApiError, RawHeaders, check_content_type, internal_error, parse_request, too_large

ROUTES = {b"/v1/completions": ("/v1/completions", "prompt"),
          b"/v1/chat/completions": ("/v1/chat/completions", "messages")}
_PHRASES = {s.value: s.phrase.encode() for s in HTTPStatus}
STATUS_LINE = {code: b"HTTP/1.1 %d %s\r\n" % (code, _PHRASES.get(code, b"")) for code in range(100, 600)}
_CHUNKED = b"transfer-encoding: chunked\r\n"
_CLOSE = b"connection: close\r\n"
_END = b"0\r\n\r\n"

log = logging.getLogger(__name__)


class _NoEvent:
    """uvicorn's protocol sets its cycle's message event on a disconnect; this request has none."""

    @staticmethod
    def set() -> None:
        pass


class _Exchange:
    """One request on the data path. It takes uvicorn's cycle slot while it runs, so that a request
    pipelined behind it waits in uvicorn's queue, and a shutdown sees it in flight (`keep_alive`)."""

    __slots__ = ("path", "field", "headers", "chunks", "size", "keep_alive", "response_complete",
                 "disconnected", "task", "slot")
    message_event = _NoEvent

    def __init__(self, path: str, field: str, headers: list, keep_alive: bool) -> None:
        self.path, self.field, self.headers, self.keep_alive = path, field, headers, keep_alive
        self.chunks: list[bytes] = []
        self.size = 0
        self.response_complete = self.disconnected = self.slot = False
        self.task: asyncio.Task | None = None


class DataPathProtocol(LimitedHttpToolsProtocol):
    """uvicorn's httptools protocol (with the head limits) that serves the generating routes itself."""

    routes: GeneratingRoutes        # set by `protocol_for`
    _reading: _Exchange | None = None       # the data-path request whose body is being read
    _current: _Exchange | None = None       # the one being served

    def on_headers_complete(self) -> None:
        route = ROUTES.get(self.url)
        parser = self.parser
        if (route is None or parser.get_method() != b"POST" or parser.get_http_version() != "1.1"
                or parser.should_upgrade() or not (self.cycle is None or self.cycle.response_complete)):
            super().on_headers_complete()
            return
        self._end_head()
        self._unset_keepalive_if_required()
        exch = _Exchange(route[0], route[1], self.headers, parser.should_keep_alive())
        self.cycle = self._current = self._reading = exch
        declared = next((v for k, v in self.headers if k == b"content-length"), None)
        limit = self.routes.state.service.settings.max_body_bytes
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            self._refuse_body(exch, limit)      # (raises: parsing stops here)
        if self.expect_100_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        exch = self._reading
        if exch is None:
            super().on_body(body)
            return
        exch.size += len(body)
        exch.chunks.append(body)
        limit = self.routes.state.service.settings.max_body_bytes
        if exch.size > limit:
            self._refuse_body(exch, limit)

    def _reading_body(self) -> bool:
        cycle = self.cycle
        return self._reading is not None if isinstance(cycle, _Exchange) else super()._reading_body()

    def on_message_complete(self) -> None:
        exch = self._reading
        if exch is None:
            super().on_message_complete()
            return
        self._reading = None
        exch.task = task = self.loop.create_task(self._serve(exch))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def connection_lost(self, exc: Exception | None) -> None:
        exch = self._current
        if exch is not None and not exch.response_complete:
            exch.disconnected = True
            if exch.task is not None:
                exch.task.cancel()      # withdraws a held request, closes the upstream call (vLLM aborts)
            else:                       # it left while sending its body: nothing was sent on
                self.routes.state.service.metrics.errors.labels("client_disconnect").inc()
        super().connection_lost(exc)

    def _refuse_body(self, exch: _Exchange, limit: int) -> None:
        """A body over the limit: answered at once, the connection closed (the rest is not read)."""
        self.routes.state.service.metrics.errors.labels("bad_request").inc()
        exch.response_complete, exch.keep_alive = True, False
        self._current = self._reading = None
        self._write_plain(exch, too_large(limit).response(), self._request_id(exch))
        self.transport.close()
        raise _Refused      # stops the parser

    # -- one request ------------------------------------------------------------------------------

    @staticmethod
    def _request_id(exch: _Exchange) -> bytes:
        """The client's X-Request-Id, or a new one, added to the headers the server is sent."""
        rid = next((v for k, v in exch.headers if k == REQUEST_ID), None)
        if rid is None:
            rid = new_request_id()
            exch.headers.append((REQUEST_ID, rid))
        return rid

    async def _serve(self, exch: _Exchange) -> None:
        rid = self._request_id(exch)
        started = False
        try:
            response = await self._response(exch)
            if response is not None and self.transport.is_closing():
                # the client left as its reply was made (3.11's wait_for can drop a cancel that
                # comes with the result: the held request's wait in `service.py`)
                self.routes.state.service.metrics.errors.labels("client_disconnect").inc()
                if isinstance(response, RelayResponse):
                    await response.body_iterator.aclose()       # releases, closes the upstream stream
            elif response is not None:
                if isinstance(response, RelayResponse):
                    started = True
                    await self._write_stream(exch, response, rid)
                else:
                    self._write_plain(exch, response, rid)
        except asyncio.CancelledError:
            if not exch.disconnected:
                raise
        except Exception as exc:
            log.exception("unhandled error in POST %s (request %s)", exch.path, rid.decode("latin-1"))
            if started:
                exch.keep_alive = False         # a second status cannot follow a started reply
            elif not self.transport.is_closing():
                self._write_plain(exch, internal_error(exc), rid)
        finally:
            exch.response_complete = True
            self._current = None
            if exch.slot:
                self.routes.state.limit.leave()
            if not exch.keep_alive:
                self.transport.close()
            elif not exch.disconnected:
                self.on_response_complete()     # the next pipelined request, or the keep-alive timer

    async def _response(self, exch: _Exchange) -> Response | None:
        """`app._completion`'s work on the body read here; None when the client left first."""
        svc = self.routes.state.service
        headers = RawHeaders(exch.headers)
        raw = exch.chunks[0] if len(exch.chunks) == 1 else b"".join(exch.chunks)
        exch.chunks = []
        try:
            check_content_type(headers)
            routed = parse_request(raw, headers, exch.field, svc.settings.classes, svc.settings.fallback_class)
            svc.check_fits(routed.prompt_len, exch.field)
        except ApiError as exc:
            svc.metrics.errors.labels("bad_request").inc()
            return exc.response()
        try:
            limit = self.routes.state.limit
            if limit is not None:
                await limit.enter()
                exch.slot = True
            return await (self.routes.serve or serve_routed)(svc, exch.path, routed, headers, exch.field)
        except Rejected as exc:
            return rejection(exc)
        except asyncio.CancelledError:
            if exch.disconnected:
                svc.metrics.errors.labels("client_disconnect").inc()
                return None
            raise

    def _head(self, exch: _Exchange, status: int, headers: list, rid: bytes) -> list[bytes]:
        out = [STATUS_LINE.get(status) or b"HTTP/1.1 %d \r\n" % status]
        out.extend(b"%s: %s\r\n" % kv for kv in self.server_state.default_headers)
        out.extend(b"%s: %s\r\n" % kv for kv in headers)
        if not any(k.lower() == REQUEST_ID for k, _ in headers):
            out.append(b"x-request-id: %s\r\n" % rid)
        if not exch.keep_alive:
            out.append(_CLOSE)
        return out

    def _write_plain(self, exch: _Exchange, response: Response, rid: bytes) -> None:
        out = self._head(exch, response.status_code, response.raw_headers, rid)
        out.append(b"\r\n")
        out.append(response.body)
        self.transport.write(b"".join(out))

    async def _write_stream(self, exch: _Exchange, response: RelayResponse, rid: bytes) -> None:
        """The relay's chunks, chunked; the head goes with the first, the end with the last."""
        out = self._head(exch, response.status_code, response.raw_headers, rid)
        out.append(_CHUNKED + b"\r\n")
        pending = b"".join(out)
        body, write, flow = response.body_iterator, self.transport.write, self.flow
        try:
            async for chunk in body:
                if self.transport.is_closing():     # the client left (its cancel is on the way, or lost)
                    return
                last = type(chunk) is LastChunk
                if chunk:
                    pending += b"%x\r\n%s\r\n" % (len(chunk), chunk)
                if last:
                    break
                if pending:
                    write(pending)
                    pending = b""
                    if flow.write_paused:
                        await flow.drain()
            if not self.transport.is_closing():
                write(pending + _END)
        finally:
            await body.aclose()


def protocol_for(app: GeneratingRoutes) -> type[DataPathProtocol]:
    """The protocol class uvicorn is given for `app` (uvicorn makes one per connection)."""
    return type("DataPath", (DataPathProtocol,), {"routes": app})
