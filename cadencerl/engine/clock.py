"""The real path's clock: one private asyncio loop that only runs inside the controller's calls.

Why this shape: between two `advance()` calls nothing moves, so a decision sees one consistent
snapshot of every token count and needs no lock. Timers, tool returns and the controller's ticks
all run off one monotonic clock, every wait has a timeout, and the only ways in from another
thread (a trainer publishing, a caller stopping the run) are `post` and `fail`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import queue
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from cadencerl.core.backend import Event

_T = TypeVar("_T")


class EngineRunError(RuntimeError):
    """The real-engine run cannot go on (a server problem, a deadline, a stop); one line."""


class WallClock:
    """Wall seconds since `restart`, a heap of due items, and the loop that runs the streams."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._t0 = time.monotonic()
        self._wake = asyncio.Event()
        self._seq = itertools.count()
        self._heap: list[tuple[float, int, object]] = []   # (time, seq, item): timers, tool returns
        self._inbox: queue.SimpleQueue[str] = queue.SimpleQueue()   # tags posted from other threads
        self._background: set[asyncio.Task] = set()
        self.events: list[Event] = []
        self.fatal: BaseException | None = None

    def now(self) -> float:
        return time.monotonic() - self._t0

    def restart(self) -> None:
        self._t0 = time.monotonic()

    def next_id(self) -> int:
        return next(self._seq)

    # -- from the loop's own thread -------------------------------------------------------------

    def emit(self, ev: Event) -> None:
        self.events.append(ev)
        self.poke()

    def push(self, t: float, item: object) -> None:
        heapq.heappush(self._heap, (t, self.next_id(), item))

    def pop_due(self) -> list[tuple[float, object]]:
        now, due = self.now(), []
        while self._heap and self._heap[0][0] <= now:
            t, _, item = heapq.heappop(self._heap)
            due.append((t, item))
        return due

    def has_timers(self) -> bool:
        return bool(self._heap)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = self.loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run_until_complete(coro)

    def poke(self) -> None:
        self._wake.set()

    async def pump(self, until: float, deadline_s: float | None) -> None:
        """Sleep until `until`, the first due item, the deadline, an event, or a post."""
        while not self.events and self.fatal is None and self._inbox.empty():
            now = self.now()
            end = min(until, self._heap[0][0] if self._heap else math.inf)
            if deadline_s is not None:
                end = min(end, deadline_s + 1e-3)
            if now >= end:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), end - now)
            except TimeoutError:
                pass

    def take_posted(self) -> list[str]:
        out = []
        while not self._inbox.empty():
            out.append(self._inbox.get_nowait())
        return out

    # -- from any thread ---------------------------------------------------------------------------

    def post(self, tag: str) -> None:
        self._inbox.put(tag)
        self._poke_threadsafe()

    def fail(self, exc: BaseException) -> None:
        self.fatal = self.fatal or exc
        self._poke_threadsafe()

    def _poke_threadsafe(self) -> None:
        if not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.poke)
            except RuntimeError:
                pass

    # -- tear-down ---------------------------------------------------------------------------------

    def close(self, *closers: Coroutine[Any, Any, Any]) -> None:
        """Cancel every background task, await `closers` (bounded), close the loop; idempotent."""
        if self.loop.is_closed():
            for c in closers:
                c.close()
            return
        tasks = list(self._background)
        for t in tasks:
            t.cancel()

        async def settle() -> None:
            try:
                if tasks:
                    await asyncio.wait(tasks, timeout=5.0)
                await asyncio.wait_for(asyncio.gather(*closers, return_exceptions=True), 5.0)
            finally:
                # a stream's generator a cancelled task left suspended is closed here, not by the garbage
                # collector after the loop is gone ("Task was destroyed but it is pending!")
                await asyncio.wait_for(self.loop.shutdown_asyncgens(), 5.0)

        try:
            self.loop.run_until_complete(settle())
        except (TimeoutError, RuntimeError):
            pass
        finally:
            self.loop.close()
