"""A background response's generation, followed to its end so that admission paces it.

`POST /v1/responses` with `background: true` is answered at once (status `queued`) while the server
goes on generating. Released then, its session would leave the server's load and MISA-T's count
while the server still decodes it, and admission would fill the server past what it measured. The
router keeps the session placed and asks the server for the response (`GET /v1/responses/{id}`,
as a client polls it) every poll interval until its status is final; the session is released then,
with the response's output tokens, and the context the server holds for it is learned. A server
that goes down, is removed or no longer knows the response (a restart) releases it with none.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx

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
                       interval_s: float) -> bytes | None:
    """The response object once its status is final, polled at `url` every `interval_s`; None when
    `still_there()` turns false (its server went down or was removed) or the server no longer knows it."""
    while still_there():
        await asyncio.sleep(interval_s)
        try:
            resp = await client.get(url)
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
