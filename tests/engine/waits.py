"""Waiting on a real server: for streamed tokens, for its `/metrics` to show a state, or for a
request to be frozen in flight by a pause."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

from cadencerl.engine.client import VLLMClient
from cadencerl.engine.server_metrics import EngineMetrics


async def wait_for_tokens(received: list[int], count: int, task: asyncio.Task[Any],
                          timeout_s: float = 90.0) -> int:
    """Until `count` tokens arrived or `task` (the request) ended, whichever first: a starved
    client can see a stream only at its request's end (seen in CI: none of 6,000 tokens in 30 s
    while the server was generating; with the servers in sessions of their own, docs/internals.md,
    devpool), and the caller then retries. The bound fails only when
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


KEEP = {"mode": "keep", "clear_cache": "false"}   # vLLM 0.32 clears caches on any pause unless told not to


async def pause_while_running(
    client: VLLMClient, dev: httpx.AsyncClient, task: asyncio.Task[Any], received: list[int],
    shown: Callable[[EngineMetrics], bool], what: str, timeout_s: float = 60.0,
) -> EngineMetrics | None:
    """Pause the server with the request of `task` in flight and its KV kept, and return the first
    `/metrics` reading, paused, for which `shown` holds; None, the server resumed, when the request
    ended first (the caller retries with a new one). The pause comes once 8 tokens have streamed or
    a second has passed, whichever is first: a starved client can see a stream only at its end (CI
    and this machine, with the servers in a session of their own: docs/internals.md, devpool). A
    reading that does not show it within 5 s (not admitted yet, or its gauges not yet refreshed)
    resumes the server for half a second and pauses again, until `timeout_s`. On success the
    server stays paused: the caller resumes it."""
    deadline = time.monotonic() + timeout_s
    settle = time.monotonic() + 1.0
    while len(received) < 8 and not task.done() and time.monotonic() < settle:
        await asyncio.sleep(0.005)
    reading = None
    while not task.done():
        (await dev.post("/pause", params=KEEP, timeout=30)).raise_for_status()
        look_until = time.monotonic() + 5.0
        while not task.done() and time.monotonic() < look_until:
            if shown(reading := await client.metrics()):
                return reading
            await asyncio.sleep(0.05)
        (await dev.post("/resume", timeout=30)).raise_for_status()
        assert time.monotonic() < deadline, f"not seen within {timeout_s} s: {what} (last: {reading})"
        await asyncio.sleep(0.5)
    (await dev.post("/resume", timeout=30)).raise_for_status()
    return None
