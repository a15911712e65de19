"""The router's connections to its servers: one httpx transport, its pool split in shards.

httpcore scans every connection of a pool each time a request starts or ends, and asks the socket
of each idle one whether its server closed it (a poll() per idle connection): one pool of hundreds
of streams costs O(n) a request. Split in shards, each scan covers a few connections. A request
goes to the shard of the connection to its server that went idle last (most recently used first,
so at low load one warm connection serves request after request, well within its keep-alive), and
to the shards in turn when none is idle (a new connection there). The hints are kept per server:
a shard idle towards another server would open a new connection.
"""

from __future__ import annotations

from collections import deque

import httpx

from cadencerl.engine.client import KEEPALIVE_EXPIRY_S


class ShardedTransport(httpx.AsyncBaseTransport):
    def __init__(self, shards: int = 64, connections: int = 512) -> None:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections // 4,
                              keepalive_expiry=KEEPALIVE_EXPIRY_S)
        tls = httpx.create_ssl_context()    # one for all shards: loading the CA bundle takes ~0.1 s each
        self.shards = [httpx.AsyncHTTPTransport(limits=limits, verify=tls) for _ in range(shards)]
        self._turn, self._connections = 0, connections
        # per server, one entry per reply that ended, latest last: the shard that has an idle
        # connection to it (a hint: the connection may have expired since, and then that shard
        # opens a new one)
        self._idle: dict[tuple[bytes, bytes, int | None], deque[int]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = (url.raw_scheme, url.raw_host, url.port)
        idle = self._idle.get(origin)
        if idle is None:
            idle = self._idle[origin] = deque(maxlen=self._connections)
        if idle:
            shard = idle.pop()
        else:
            shard = self._turn = (self._turn + 1) % len(self.shards)
        resp = await self.shards[shard].handle_async_request(request)
        resp.stream = _Tracked(resp.stream, idle, shard)
        return resp

    async def aclose(self) -> None:
        for shard in self.shards:
            await shard.aclose()


class _Tracked(httpx.AsyncByteStream):
    """A reply's body as the shard's transport gives it; closing it marks the shard's connection idle."""

    def __init__(self, stream: httpx.AsyncByteStream, idle: deque[int], shard: int) -> None:
        self._stream, self._idle, self._shard = stream, idle, shard

    def __aiter__(self):
        return self._stream.__aiter__()     # no layer of its own between the chunks and their reader

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            if self._shard >= 0:
                self._idle.append(self._shard)
                self._shard = -1
