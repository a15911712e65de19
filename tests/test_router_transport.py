"""`router/transport.py`: the router's raw connections to its servers keep httpx's behaviour (its
responses, streams and errors) while reusing a warm connection to the server a request goes to."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from server_thread import ServerThread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from cadencerl.router.transport import RawTransport


def port_echo() -> Starlette:
    """Answers with the client's port (one port is one connection); /stream streams 5 parts, /slow sleeps."""
    async def echo(request: Request) -> PlainTextResponse:
        body = await request.body()
        await asyncio.sleep(0.02)         # replies in flight together end together
        return PlainTextResponse(f"{request.client.port} {len(body)}")

    async def stream(request: Request) -> StreamingResponse:
        async def parts():
            for i in range(5):
                yield f"part{i};".encode()
                await asyncio.sleep(0.01)
        return StreamingResponse(parts())

    async def slow(request: Request) -> PlainTextResponse:
        await asyncio.sleep(2)
        return PlainTextResponse("late")
    return Starlette(routes=[Route("/", echo, methods=["GET", "POST"]), Route("/stream", stream),
                             Route("/slow", slow)])


@pytest.fixture(scope="module")
def servers():
    a, b = ServerThread(port_echo(), name="a").start(), ServerThread(port_echo(), name="b").start()
    yield a, b
    a.stop()
    b.stop()


def test_a_request_takes_an_idle_connection_to_its_own_server(servers) -> None:
    a, b = servers

    async def main() -> tuple[set[str], set[str]]:
        async with httpx.AsyncClient(transport=RawTransport()) as client:
            to_b = {(await client.get(b.url)).text}
            for _ in range(3):     # replies from a end after b's: no connection to a is taken for b
                replies = await asyncio.gather(*(client.get(a.url) for _ in range(8)))
                to_b.add((await client.get(b.url)).text)
            return to_b, {r.text for r in replies}
    to_b, to_a = asyncio.run(main())
    assert len(to_b) == 1, f"b's warm connection was passed over: {len(to_b)} connections to b"
    assert len(to_a) == 8


def test_bodies_streams_and_errors_are_httpx_s(servers) -> None:
    a, _ = servers

    async def main():
        async with httpx.AsyncClient(transport=RawTransport()) as client:
            posted = (await client.post(a.url, content=b"x" * 200_000)).text
            async with client.stream("GET", f"{a.url}/stream") as resp:
                parts = [chunk async for chunk in resp.aiter_raw()]
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"{a.url}/slow", timeout=0.2)
            with pytest.raises(httpx.ConnectError):
                await client.get("http://127.0.0.1:9/")      # nothing listens on the discard port
            again = (await client.get(a.url)).status_code     # the timed-out connection was not given back
            return posted, parts, again
    posted, parts, again = asyncio.run(main())
    assert posted.endswith(" 200000")
    assert b"".join(parts) == b"part0;part1;part2;part3;part4;" and len(parts) > 1, "streamed as it came"
    assert again == 200


def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    """The server's keep-alive ran out between two requests: the connection is gone, the request is not."""
    server = ServerThread(port_echo(), name="c", timeout_keep_alive=1).start()

    async def main():
        async with httpx.AsyncClient(transport=RawTransport()) as client:
            first = (await client.get(server.url)).text
            await asyncio.sleep(1.5)
            return first, (await client.get(server.url)).text
    try:
        first, second = asyncio.run(main())
    finally:
        server.stop()
    assert first.split()[0] != second.split()[0], "a new connection"
