"""Waiting on a real server: for streamed tokens, or for its `/metrics` to show a state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from cadencerl.engine.client import VLLMClient
from cadencerl.engine.server_metrics import EngineMetrics


async def wait_for_tokens(received: list[int], count: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(received) < count:
        assert time.monotonic() < deadline, f"only {len(received)} tokens after {timeout_s} s"
        await asyncio.sleep(0.005)


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
