"""A stream's chunks in runs: those that were ready together, as one list.

httpx yields an upstream SSE stream one HTTP chunk at a time, and vLLM (or the benchmark's stub)
writes one chunk per event, so a relay that sends each chunk on its own makes one ASGI send, one
write() and one TCP segment per event, even for events that came in one read from the socket. Here
each next chunk is asked for and, when it is ready at once (httpcore had it buffered), added to the
run; the run is handed on as soon as the next chunk is not ready, before waiting for it. A chunk is
therefore never held back for a later one: the relay sends what it would have sent, in fewer writes.

The next chunk is asked for by running its step of the stream until it would wait (a coroutine's
`send`, as the event loop runs one): then the run is yielded, and the rest of that step is awaited
as it would have been, every value the task sends in and every exception it throws in (a
cancellation, a timeout) going to the step, as `yield from` passes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from typing import Any


async def ready_runs(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """The chunks of `chunks`, in order, grouped in the runs that were ready together (never empty).
    An exception from `chunks` is raised after the run read before it. Closed while a step waits
    (its reader stopped while sending a run: the client left, say), the step is cancelled as a
    task's cancellation would reach it, so the stream under it cleans up as it does on a cancel."""
    run: list[bytes] = []
    while True:
        step = chunks.__anext__().__await__()
        try:
            waiting = step.send(None)
        except StopIteration as ready:
            run.append(ready.value)
            continue
        except StopAsyncIteration:
            break
        except BaseException:
            if run:
                yield run
            raise
        if run:
            try:
                yield run
            except BaseException:
                await _given_up(_Rest(step, waiting, asyncio.CancelledError()))
                raise
        run = []
        try:
            run.append(await _Rest(step, waiting))
        except StopAsyncIteration:
            break
    if run:
        yield run


async def _given_up(rest: "_Rest") -> None:
    try:
        await rest
    except BaseException:   # the cancellation, or what the stream raised closing on it: nobody reads it
        pass


class _Rest:
    """The rest of a step that `ready_runs` ran until it waited on `waiting`, awaited in its place;
    with `throw`, that exception is thrown into the step first (it was not waited for)."""

    __slots__ = ("step", "waiting", "throw")

    def __init__(self, step: Generator[Any, Any, bytes], waiting: Any, throw: BaseException | None = None) -> None:
        self.step, self.waiting, self.throw = step, waiting, throw

    def __await__(self) -> Generator[Any, Any, bytes]:
        step, waiting, exc = self.step, self.waiting, self.throw
        while True:
            if exc is None:
                try:
                    sent = yield waiting
                except GeneratorExit:
                    step.close()
                    raise
                except BaseException as thrown:  # a cancellation or a timeout: the step's to handle
                    exc = thrown
                    continue
                try:
                    waiting = step.send(sent)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    waiting = step.throw(exc)
                except StopIteration as done:
                    return done.value
                finally:
                    exc = None
