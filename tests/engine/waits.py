"""Waiting on a real server: for streamed tokens, or for its `/metrics` to show a state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from cadencerl.engine.client import VLLMClient
from cadencerl.engine.server_metrics import EngineMetrics


async def wait_for_tokens(received: list[int], count: int, task: asyncio.Task[Any],
                          timeout_s: float = 90.0) -> int:
    """Until `count` tokens arrived or `task` (the request) ended, whichever first: a starved
    machine can hold a stream's chunks back until its request ends (seen in CI: none of 6,000 tokens
    in 30 s while the server was generating), and the caller then retries. The bound fails only when
    it has passed on two wake-ups in a row, so a stall of this loop itself (the reader not yet run)
    is not mistaken for a silent stream. Returns the tokens seen by then (fewer than `count`: the
    request ended first), for the caller's message."""
    deadline = time.monotonic() + timeout_s
    overdue = False
    while len(received) < count and not task.done():
        if time.monotonic() >= deadline:
            assert not overdue, f"only {len(received)} tokens after {timeout_s} s, the request still open"
            overdue = True
        await asyncio.sleep(0.005)
    return len(received)


async def poll_metrics(
    client: VLLMClient, done: Callable[[EngineMetrics], bool], what: str, timeout_s: float = 15.0,
    unless: Callable[[], bool] = lambda: False,
) -> EngineMetrics | None:
    """The first `/metrics` reading for which `done` holds; None once `unless()` holds first (what
    was to be seen is over); fails naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not done(m := await client.metrics()):
        if unless():
            return None
        assert time.monotonic() < deadline, f"not seen within {timeout_s} s: {what} (last: {m})"
        await asyncio.sleep(0.05)
    return m
