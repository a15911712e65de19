"""A stream's chunks in runs: those that were ready together, as one list.

httpx yields an upstream SSE stream one chunk per event, so a relay sending each on its own makes one
send, write() and TCP segment per event. A task of its own reads the stream into a bounded queue and
the reader takes everything queued at once: nothing is held back, a relay that falls behind catches
up in one send, and the bound (`LIMIT`) keeps back-pressure. Why the read stays in that task:
docs/internals.md, "router".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

LIMIT = 64      # chunks read ahead of the reader


class _End:
    """The stream's end in the queue: `error` is what broke it, None for a clean end."""

    __slots__ = ("error",)

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error


async def ready_runs(chunks: AsyncIterator[bytes], limit: int = LIMIT) -> AsyncIterator[list[bytes]]:
    """The chunks of `chunks`, in order, grouped in the runs that were ready together (never empty).
    An exception from `chunks` is raised after the run read before it."""
    queue: asyncio.Queue[bytes | _End] = asyncio.Queue(limit)
    pump = asyncio.create_task(_pump(chunks, queue))
    try:
        while True:
            run = [await queue.get()]
            while not queue.empty():
                run.append(queue.get_nowait())
            end = run.pop() if isinstance(run[-1], _End) else None
            if run:
                yield run          # type: ignore[misc]   # only the last item can be the end
            if end is not None:
                if end.error is not None:
                    raise end.error
                return
    finally:
        pump.cancel()
        await asyncio.wait([pump])     # the stream has closed before the caller closes its response


async def _pump(chunks: AsyncIterator[bytes], queue: asyncio.Queue[bytes | _End]) -> None:
    try:
        async for chunk in chunks:
            await queue.put(chunk)
    except Exception as exc:        # a broken stream: the reader raises it after what came before
        await queue.put(_End(exc))
    else:
        await queue.put(_End())
    finally:                        # cancelled while the queue was full: the stream is closed too
        aclose = getattr(chunks, "aclose", None)
        try:
            if aclose is not None:
                await aclose()
        except Exception:           # closing a broken stream may fail again; its reader closes the response
            pass


async def single_runs(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """`ready_runs` of a stream that yields all it has buffered at each step (`transport.py`'s reply
    bodies): each chunk is a run already, read in the caller's task, with no queue and no task."""
    try:
        async for chunk in chunks:
            yield [chunk]
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
