"""Back-pressure for the policies that admit whatever comes (cache-aware, consistent-hash, ...).

MISA-T holds new sessions and refuses past its HOLD bound itself; a placement-only policy forwards
every request at once, so more clients than the servers run means an unbounded queue inside vLLM
and in the router. Here at most `--max-concurrent-requests` completions are in flight (0: twice the
max_num_seqs of the servers up); the next `--hold-max` wait in arrival order, each at most
`--hold-timeout` s; the rest get a 429 with Retry-After at once. With no server up, nothing waits:
placement answers 503 at once.
"""

from __future__ import annotations

import asyncio
from collections import deque

from cadencerl.router.rejections import Rejected


class InFlightLimit:
    """Slots for the requests in flight; `enter` takes one (waiting, or a Rejected), `leave` frees it."""

    def __init__(self, svc, limit: int = 0) -> None:
        self.svc, self.limit = svc, limit
        self.in_flight = 0
        self.waiting: deque[asyncio.Future] = deque()

    def capacity(self) -> int:
        if self.limit:
            return self.limit
        return 2 * sum(w.max_num_seqs for up, w in zip(self.svc.upstreams, self.svc.state.workers) if up.routable)

    def try_enter(self) -> bool:
        """A slot now if one is free and none waits (or no server is up: placement's 503)."""
        capacity = self.capacity()
        if capacity == 0 or (self.in_flight < capacity and not self.waiting):
            self.in_flight += 1
            return True
        return False

    async def enter(self) -> None:
        if self.try_enter():
            return
        svc = self.svc
        settings = svc.settings
        if len(self.waiting) >= settings.hold_max:
            svc.metrics.rejections.labels("hold_full").inc()
            raise Rejected(429, "hold_full", "the router's queue is full; retry later", svc.retry_after())
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.waiting.append(fut)
        self._admit()
        timer = loop.call_later(settings.hold_timeout_s, expire, fut)
        try:
            await fut
        except TimeoutError:
            svc.metrics.rejections.labels("hold_timeout").inc()
            raise Rejected(429, "hold_timeout", "waited too long for a slot; retry later", svc.retry_after()) from None
        except asyncio.CancelledError:      # the client left; a slot handed over meanwhile is given back
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.leave()
            raise
        finally:
            timer.cancel()
            if not fut.done() or fut.cancelled() or fut.exception() is not None:
                try:
                    self.waiting.remove(fut)     # timed out or left: its place in the queue goes
                except ValueError:
                    pass

    def leave(self) -> None:
        self.in_flight -= 1
        self._admit()

    def _admit(self) -> None:
        """Hand free slots to the longest waiting (the capacity grows as servers come up)."""
        capacity = self.capacity()
        while self.waiting and (self.in_flight < capacity or capacity == 0):
            fut = self.waiting.popleft()
            if not fut.done():
                self.in_flight += 1
                fut.set_result(None)

    @property
    def depth(self) -> int:
        return len(self.waiting)


def expire(fut: asyncio.Future) -> None:
    """A wait's bound passed: its future raises TimeoutError (unless it was answered)."""
    if not fut.done():
        fut.set_exception(TimeoutError())


def limit_for(svc) -> InFlightLimit | None:
    """The limit of `svc`'s policy: none where an admission gate (MISA-T) bounds what goes in itself."""
    return InFlightLimit(svc, svc.settings.max_concurrent_requests) if svc.state.policy.gate is None else None
