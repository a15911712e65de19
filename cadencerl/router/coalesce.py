"""A stream's chunks in runs: those that were ready together, as one list.

httpx yields an upstream SSE stream one HTTP chunk at a time, and vLLM (or the benchmark's stub)
writes one chunk per event, so a relay that sends each chunk on its own makes one ASGI send, one
write() and one TCP segment per event, even for events that came in one read from the socket. Here
a task of its own reads the stream into a bounded queue, and the reader takes everything queued at
once: a chunk is never held back for a later one, and a relay that falls behind (a busy router)
catches up in one send instead of one per event. The bound keeps back-pressure: a client that
stops reading stops the upstream read after `LIMIT` chunks.

The stream is read only in that task, so its own deadlines and cancel scopes (httpcore's read
timeout) stay in it; stopping the runs cancels the task, which reaches the stream as a cancel would.
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
