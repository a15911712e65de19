"""`router/transport.py`: the router's sharded connection pool reuses a warm connection to the server
a request goes to, whatever other servers' replies ended since."""

from __future__ import annotations

import asyncio

import httpx
from server_thread import ServerThread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from cadencerl.router.transport import ShardedTransport


def port_echo() -> Starlette:
    """Answers with the client's port: one port is one connection."""
    async def echo(request: Request) -> PlainTextResponse:
        await asyncio.sleep(0.02)         # replies in flight together end together
        return PlainTextResponse(str(request.client.port))
    return Starlette(routes=[Route("/", echo)])


def test_a_request_takes_an_idle_connection_to_its_own_server() -> None:
    a, b = ServerThread(port_echo(), name="a").start(), ServerThread(port_echo(), name="b").start()

    async def main() -> tuple[set[str], set[str]]:
        async with httpx.AsyncClient(transport=ShardedTransport()) as client:
            to_b = {(await client.get(b.url)).text}
            for _ in range(3):     # replies from a end after b's: their shards hold no connection to b
                replies = await asyncio.gather(*(client.get(a.url) for _ in range(8)))
                to_b.add((await client.get(b.url)).text)
            return to_b, {r.text for r in replies}
    try:
        to_b, to_a = asyncio.run(main())
    finally:
        a.stop()
        b.stop()
    assert len(to_b) == 1, f"b's warm connection was passed over: {len(to_b)} connections to b"
    assert len(to_a) == 8
