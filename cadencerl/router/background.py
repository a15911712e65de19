"""A background response's generation, followed to its end so that admission paces it.

`POST /v1/responses` with `background: true` is answered at once while the server goes on
generating; released then, its session would leave the server's load and MISA-T's count. So the
router keeps it placed and polls `GET /v1/responses/{id}` until its status is final, then releases
it with its output tokens. When it is released with none, and how a broken stream or a polling
client is handled: docs/internals.md, "router".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import httpx

from cadencerl.router.settings import RouterSettings
from cadencerl.router.stored import ResponseOwners, response_path, usage_tokens
from cadencerl.router.upstream import Upstream

FINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
RUNNING = frozenset({"queued", "in_progress"})


def running_id(content: bytes) -> str | None:
    """The id of a response object whose generation goes on (status queued or in_progress), else None."""
    try:
        body = json.loads(content)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if isinstance(body, dict) and body.get("status") in RUNNING and isinstance(body.get("id"), str) and body["id"]:
        return body["id"]
    return None


async def final_answer(client: httpx.AsyncClient, url: httpx.URL, still_there: Callable[[], bool],
                       interval_s: float, deadline_s: float, wake: asyncio.Event) -> bytes | None:
    """The response object once its status is final, asked at `url` every `interval_s` (at once
    when `wake` is set); None when `still_there()` turns false, the server no longer knows it, or
    `deadline_s` (on the loop's clock) passes. Each ask is bounded as a health poll is."""
    loop = asyncio.get_running_loop()
    while still_there() and loop.time() < deadline_s:
        try:
            await asyncio.wait_for(wake.wait(), interval_s)
        except TimeoutError:
            pass
        wake.clear()
        try:
            resp = await client.get(url, timeout=max(1.0, 2 * interval_s))
        except httpx.HTTPError:
            continue                # a server that stays unreachable is taken out by the health poll
        if resp.status_code == 404:
            return None
        if resp.status_code == 200:
            try:
                status = json.loads(resp.content).get("status")
            except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
                continue
            if status in FINAL:
                return resp.content
    return None


class Followers:
    """The background responses being followed, by session (trajectory id) and by response id."""

    def __init__(self) -> None:
        self._by_traj: dict[int, tuple[asyncio.Task, asyncio.Event]] = {}
        self._by_id: dict[str, int] = {}

    def start(self, traj_id: int, response_id: str, follow: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        wake = asyncio.Event()
        task = asyncio.create_task(follow(wake))
        self._by_traj[traj_id], self._by_id[response_id] = (task, wake), traj_id

        def forget(_: asyncio.Task) -> None:
            self._by_traj.pop(traj_id, None)
            self._by_id.pop(response_id, None)
        task.add_done_callback(forget)

    async def settle(self, traj_id: int | None, response_id: str | None, timeout_s: float) -> None:
        """A turn that continues a followed response (its session, or its id) wakes the follower and
        waits for it to end, at most `timeout_s` (the response may really still be running)."""
        followed = self._by_traj.get(traj_id if traj_id in self._by_traj else self._by_id.get(response_id or ""))
        if followed is not None:
            task, wake = followed
            wake.set()
            await asyncio.wait([task], timeout=timeout_s)

    def tasks(self) -> list[asyncio.Task]:
        return [task for task, _ in self._by_traj.values()]

    def __len__(self) -> int:
        return len(self._by_traj)


async def follow(client: httpx.AsyncClient, up: Upstream, settings: RouterSettings, owners: ResponseOwners,
                 response_id: str, context: int, release: Callable[[int], None], wake: asyncio.Event) -> None:
    """Follow one background response on `up` to its end, then `release` its session with the
    tokens it generated (exactly once); `context`: the turn's, for an answer without usage."""
    generated = 0
    # gone: removed, or down for twice the polls that take a server out (one refused request takes
    # it out at once, and the response may still be generating there)
    try:
        content = await final_answer(
            client, httpx.URL(up.url + response_path(response_id)),
            lambda: not up.removed and up.failures < 2 * settings.failures_to_down, settings.metrics_interval_s,
            asyncio.get_running_loop().time() + settings.request_timeout_s, wake)
        if content is not None:
            owners.learn(content, up.id, context)
            generated = usage_tokens(json.loads(content))[1] or 0
    finally:
        release(generated)
