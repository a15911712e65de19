"""Serve a request only while its client is still there.

A request waiting in the hold queue, or for a non-streaming reply, writes nothing to its client, so
nothing would notice that the client left: it would be admitted later and generate for nobody. A
watcher on the connection's receive channel (after the body, the only message left is the
disconnect) cancels the work; the cancellation withdraws a held request or closes the upstream
call, and vLLM aborts a request whose connection closes. Streams have their own watcher
(`proxy.RelayResponse`) once their first chunk is out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from starlette.requests import Request
from starlette.responses import Response

CLIENT_CLOSED = 499      # nginx's status for a request whose client left; nobody reads it, logs do


async def while_connected(request: Request, work: Awaitable[Response]) -> Response | None:
    """`work`'s response, or None when the client disconnected first (the work is then cancelled).

    `work` runs in the request's own task, which the watcher cancels: one task a request (the
    watcher), not a second one for the work and a wait on both."""
    task = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        response = await work
    except asyncio.CancelledError:
        if not gone:
            raise
        response = None
    finally:
        watcher.cancel()
        if gone:
            task.uncancel()   # the cancellation was the watcher's, and it ends here (whatever the work raised)
    return response
