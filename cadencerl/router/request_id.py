"""Every request carries an X-Request-Id, and every response the router sends echoes it.

A client's id is kept; a request without one gets a fresh one before any route sees it, so the
upstream server (which receives the client's headers), the router's response and the client's
logs all name the same request. Pure ASGI: no per-request task or body buffering.

An unhandled exception is caught here too, not left to Starlette's outermost handler: that one runs
outside every middleware, so its 500 would carry no id (the answer to a bug is the one a client most
needs to quote). The traceback is logged once, with the id; an error after the response started
is re-raised, for the server to log and close the connection (no second status can be sent).
"""

from __future__ import annotations

import logging
import os

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cadencerl.router.requests import internal_error

HEADER = b"x-request-id"


def new_request_id() -> bytes:
    """A fresh id, 32 hex digits as a uuid4's (uuid4's object alone cost a few percent of a request's CPU)."""
    return os.urandom(16).hex().encode()


log = logging.getLogger(__name__)


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next((v for k, v in scope["headers"] if k == HEADER), None)
        if rid is None:
            rid = new_request_id()
            scope = {**scope, "headers": [*scope["headers"], (HEADER, rid)]}
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if not any(k == HEADER for k, _ in message["headers"]):
                    message = {**message, "headers": [*message["headers"], (HEADER, rid)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            if started:
                raise
            log.exception("unhandled error in %s %s (request %s)", scope["method"], scope["path"],
                          rid.decode("latin-1"))
            await internal_error(exc)(scope, receive, send_with_id)
