"""The router's connections to its servers: an httpx transport over raw asyncio connections.

httpx's own transport (httpcore + h11, pure Python, a pool scanned on every request) was half of the
router's CPU a request. This one keeps httpx's request, response and error types for the code above
it, and does the wire work with httptools' C parser on uvloop protocols: one request head written in
one call, body chunks handed on as they come (all that is buffered in one piece), and per server a
stack of idle kept-alive connections (the most recently used first, no scan). Measured in
benchmarks/router_overhead.md.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque

import httptools
import httpx

from cadencerl.engine.client import KEEPALIVE_EXPIRY_S

READ_AHEAD = 1 << 20        # a reply's bytes buffered unread before the server is asked to wait
IDLE_PER_SERVER = 512       # idle connections kept per server; more are closed as they come back


class _Connection(asyncio.Protocol):
    """One connection, one request at a time: what its current reply has brought so far."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.keep_alive = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.complete = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future | None = None

    # -- asyncio.Protocol and httptools callbacks --------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed reply from the server: {exc}"))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(httpx.RemoteProtocolError("the server closed the connection before its reply's end"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()     # read here: the parser resets at the message's end
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > READ_AHEAD:
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- the transport's side ---------------------------------------------------------------------

    def _fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, timeout: float | None, what: str) -> None:
        """Until the reply brings something (or breaks); httpx.ReadTimeout after `timeout` s of nothing."""
        loop = asyncio.get_running_loop()
        self.waiter = fut = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _time_out, fut, what)
        try:
            await fut
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    def take(self) -> bytes:
        """What the reply's body brought since the last take, in one piece."""
        data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks, resumed = [], self.buffered > READ_AHEAD
        self.buffered = 0
        if resumed and not self.closed:
            self.transport.resume_reading()
        return data

    @property
    def reusable(self) -> bool:
        return self.complete and self.error is None and not self.closed and self.keep_alive


def _time_out(fut: asyncio.Future, what: str) -> None:
    if not fut.done():
        fut.set_exception(httpx.ReadTimeout(f"no {what} from the server in time"))


class _Body(httpx.AsyncByteStream):
    """A reply's body as it arrives; closing it gives the connection back (or closes it, unread)."""

    def __init__(self, conn: _Connection, pool: deque[_Connection], timeout: float | None) -> None:
        self._conn, self._pool, self._timeout = conn, pool, timeout

    async def __aiter__(self):
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
            elif conn.error is not None:
                raise conn.error
            elif conn.complete:
                return
            else:
                await conn.wait(self._timeout, "reply body")

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.reusable and len(self._pool) < IDLE_PER_SERVER:
            conn._reset()
            conn.idle_since = time.monotonic()
            self._pool.append(conn)
        elif not conn.closed:
            conn.transport.close()


class RawTransport(httpx.AsyncBaseTransport):
    """httpx's transport interface over `_Connection`s, pooled per server (scheme, host, port)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._idle: dict[tuple[bytes, bytes, int | None], deque[_Connection]] = {}
        self._tls = tls
        self._closing = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = request.content if isinstance(request.stream, httpx.ByteStream) else await request.aread()
        if request.headers.get("transfer-encoding") == "chunked":     # a streamed body, read whole: one chunk
            body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
        return await self._send(request.url, _head(request), body, request.extensions.get("timeout", {}))

    async def post(self, url: httpx.URL, headers: list[tuple[bytes, bytes]], body: bytes,
                   timeout: dict) -> httpx.Response:
        """POST `body` with `headers` (Host and Content-Length are added here): the request as
        `handle_async_request` sends it, without building an httpx.Request on the way."""
        lines = [b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n" % (url.raw_path, url.netloc, len(body))]
        lines.extend(b"%s: %s\r\n" % kv for kv in headers)
        lines.append(b"\r\n")
        return await self._send(url, b"".join(lines), body, timeout)

    async def _send(self, url: httpx.URL, head: bytes, body: bytes, timeout: dict) -> httpx.Response:
        origin = (url.raw_scheme, url.raw_host, url.port)
        pool = self._idle.get(origin)
        if pool is None:
            pool = self._idle[origin] = deque()
        conn = self._reused(pool)
        if conn is not None:
            try:
                return await self._exchange(conn, head, body, pool, timeout)
            except httpx.RemoteProtocolError:
                if conn.status:           # the server answered, then broke: not a stale connection
                    raise
        conn = await self._connect(url, timeout.get("connect"))     # stale (closed by the server while idle), or none idle
        return await self._exchange(conn, head, body, pool, timeout)

    def _reused(self, pool: deque[_Connection]) -> _Connection | None:
        expired = time.monotonic() - KEEPALIVE_EXPIRY_S
        while pool:
            conn = pool.pop()
            if not conn.closed and conn.idle_since > expired:
                return conn
            conn.transport.close()
        return None

    async def _connect(self, url: httpx.URL, timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        https = url.raw_scheme == b"https"
        if https and self._tls is None:
            self._tls = httpx.create_ssl_context()
        port = url.port or (443 if https else 80)
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(
                _Connection, url.host, port, ssl=self._tls if https else None), timeout)
        except (OSError, TimeoutError) as exc:
            raise httpx.ConnectError(f"cannot connect to {url.host}:{port}: {exc}") from None
        return conn

    async def _exchange(self, conn: _Connection, head: bytes, body: bytes, pool: deque[_Connection],
                        timeout: dict) -> httpx.Response:
        conn.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            conn.transport.write(body)
        try:
            while not conn.status:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(timeout.get("read"), "reply")
        except BaseException:
            if not conn.closed:
                conn.transport.close()
            raise
        return httpx.Response(conn.status, headers=conn.headers, stream=_Body(conn, pool, timeout.get("read")),
                              extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        for pool in self._idle.values():
            while pool:
                conn = pool.pop()
                if not conn.closed:
                    conn.transport.close()


def _head(request: httpx.Request) -> bytes:
    """The request line and headers, as one piece of bytes (httpx set Host and Content-Length)."""
    lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)]
    lines.extend(b"%s: %s\r\n" % (k, v) for k, v in request.headers.raw)
    lines.append(b"\r\n")
    return b"".join(lines)


async def post(transport: httpx.AsyncBaseTransport, url: httpx.URL, headers: list[tuple[bytes, bytes]],
               body: bytes, timeout: dict) -> httpx.Response:
    """A POST straight to `transport`: `RawTransport.post`, else (any other httpx transport) an
    httpx.Request to its `handle_async_request`."""
    if isinstance(transport, RawTransport):
        return await transport.post(url, headers, body, timeout)
    request = httpx.Request("POST", url, content=body, headers=headers, extensions={"timeout": timeout})
    return await transport.handle_async_request(request)


def raw_reply(resp: httpx.Response) -> bool:
    """Whether `resp` came over this transport (its body chunks are all that was ready, joined)."""
    return type(resp.stream) is _Body


def body_chunks(resp: httpx.Response):
    """A reply's body as it arrives: this transport's stream itself (httpx's `aiter_raw` adds a
    re-chunker and a timer per chunk), else `aiter_raw`. The caller closes `resp`."""
    return resp.stream.__aiter__() if type(resp.stream) is _Body else resp.aiter_raw()


async def read_body(resp: httpx.Response) -> bytes:
    """A whole reply's body: this transport's chunks joined, unless the server encoded it (then
    httpx's `aread`, which decodes). The caller closes `resp`."""
    if type(resp.stream) is not _Body or "content-encoding" in resp.headers:
        return await resp.aread()
    return b"".join([chunk async for chunk in resp.stream])
