"""Every request carries an X-Request-Id, and every response the router's routes send echoes it.

A client's id is kept; a request without one gets a fresh one before any route sees it, so the
upstream server (which receives the client's headers), the router's response and the client's
logs all name the same request. Pure ASGI: no per-request task or body buffering. Not echoed: the
500 of an unhandled error, which Starlette sends from outside every middleware (a bug's answer).
"""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next((v for k, v in scope["headers"] if k == HEADER), None)
        if rid is None:
            rid = uuid.uuid4().hex.encode()
            scope = {**scope, "headers": [*scope["headers"], (HEADER, rid)]}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start" and not any(k == HEADER for k, _ in message["headers"]):
                message = {**message, "headers": [*message["headers"], (HEADER, rid)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
