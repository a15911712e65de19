"""A data-path process of a router run as several (`--processes N`): processes 1 .. N-1.

It accepts on the router's port beside the decision owner (SO_REUSEPORT) and serves the generating
routes' plain requests itself: read and checked here, admitted or placed by the owner over
`channel.py` (`owner.py`), forwarded and relayed here by the single router's code (`proxy.forward`),
released to the owner at the end. Every other request (other routes, resumable AReaL requests) is
relayed whole to the owner's private port, so each answer is the single router's answer.
`python -m cadencerl.router.helper INDEX CHANNEL OWNER_URL` is one (`processes.py` starts them).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
from dataclasses import dataclass

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cadencerl.router.app import GeneratingRoutes, rejection, service_lifespan
from cadencerl.router.channel import Channel
from cadencerl.router.processes import SETTINGS_ENV
from cadencerl.router.proxy import RelayResponse, forward, relayed_headers, sent_headers
from cadencerl.router.rejections import Rejected
from cadencerl.router.requests import ApiError, Routed, error_response, too_large
from cadencerl.router.serve import bind, uvicorn_config
from cadencerl.router.settings import RouterSettings
from cadencerl.router.transport import RawTransport, body_chunks, read_body
from cadencerl.router.upstream import Upstream

METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]


@dataclass
class Placement:
    """What a data-path process knows of a placed request's trajectory: where it runs."""

    worker: int
    context: int = 0


@dataclass
class RemoteSession:
    """A request placed by the owner, named by this process's request id."""

    rid: int
    traj: Placement


class _Child:
    def __init__(self, svc: HelperService, name: str, label: str) -> None:
        self.svc, self.name, self.label = svc, name, label

    def inc(self, amount: int = 1) -> None:
        self.svc.channel.send(["c", self.name, self.label, amount])


class _Counter:
    def __init__(self, svc: HelperService, name: str) -> None:
        self.svc, self.name = svc, name

    def labels(self, label: str) -> _Child:
        return _Child(self.svc, self.name, label)


class _OwnersMetrics:
    """The counters the data path counts in, counted in the owner's /metrics."""

    def __init__(self, svc: HelperService) -> None:
        self.errors = _Counter(svc, "errors")
        self.rejections = _Counter(svc, "rejections")


class HelperService:
    """What `proxy.forward` and the data path use of a router, with the decisions asked of the owner."""

    def __init__(self, settings: RouterSettings, index: int, channel_path: str, owner_url: str) -> None:
        self.settings, self.index, self.channel_path = settings, index, channel_path
        self.owner_url = owner_url.rstrip("/")
        self.metrics = _OwnersMetrics(self)
        self.upstreams: dict[int, Upstream] = {}
        self.transport: RawTransport | None = None
        self.forward_timeout: dict = {}
        self.channel: Channel | None = None
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}

    async def start(self) -> None:
        timeout = httpx.Timeout(self.settings.request_timeout_s, connect=10.0)
        self.transport, self.forward_timeout = RawTransport(), timeout.as_dict()
        loop = asyncio.get_running_loop()
        _, self.channel = await loop.create_unix_connection(lambda: Channel(self._on_message, self._owner_left),
                                                            self.channel_path)
        self.channel.send(["hello", self.index])

    async def stop(self) -> None:
        if self.channel is not None and self.channel.transport is not None:
            self.channel.transport.close()
        if self.transport is not None:
            await self.transport.aclose()

    def _owner_left(self) -> None:
        """Without its owner a data-path process cannot place anything: it stops (its clients reconnect
        to whatever serves the port)."""
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(Rejected(503, "no_worker", "the router is restarting; retry later"))
        os.kill(os.getpid(), signal.SIGTERM)

    def _on_message(self, m: list) -> None:
        fut = self._waiting.pop(m[1], None)
        if fut is None or fut.done():
            if m[0] == "p":             # placed as its client left: given back at once
                self.channel.send(["d", m[1], 0, True])
            return
        if m[0] == "p":
            up = self.upstreams.get(m[2])
            if up is None or up.url != m[3]:
                up = self.upstreams[m[2]] = Upstream(m[2], m[3])
            fut.set_result(m[2])
        elif m[0] == "n":
            fut.set_result(None)
        elif m[0] == "r":
            fut.set_exception(Rejected(m[2], m[3], m[4], m[5], m[6]))
        else:
            fut.set_exception(ApiError(m[2], m[3], m[4], m[5]))

    async def _ask(self, rid: int, message: list) -> int | None:
        fut = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        self.channel.send(message)
        try:
            return await fut
        except asyncio.CancelledError:      # the client left: the owner withdraws or releases it
            self._waiting.pop(rid, None)
            self.channel.send(["x", rid])
            raise

    def check_fits(self, prompt_len: int, field: str) -> None:
        """Checked by the owner, as it places the request (it knows the servers' KV)."""

    async def acquire(self, routed: Routed, field: str) -> RemoteSession:
        rid = next(self._ids)
        worker = await self._ask(rid, ["a", rid, field, routed.session_key, routed.workload_class,
                                       routed.prompt_len, routed.group, routed.route_key,
                                       routed.max_new_tokens, routed.last, routed.prefix])
        return RemoteSession(rid, Placement(worker))

    async def reroute(self, session: RemoteSession, failed: int) -> bool:
        worker = await self._ask(session.rid, ["f", session.rid, failed])
        if worker is None:
            return False
        session.traj.worker = worker
        return True

    def release(self, session: RemoteSession, generated: int, last: bool) -> None:
        self.channel.send(["d", session.rid, generated, last])

    def upstream_failed(self, up: Upstream) -> None:
        self.channel.send(["u", up.id])


async def serve_remote(svc: HelperService, path: str, routed: Routed, headers, field: str) -> Response:
    """The data path's request: placed by the owner, served here (resumable ones: by the owner, whole)."""
    if routed.prompt_ids is not None:
        fwd = [*sent_headers(headers.raw), (b"content-type", b"application/json")]
        return await relay_to_owner(svc, "POST", path, routed.raw, fwd)
    try:
        session = await svc.acquire(routed, field)
    except Rejected as exc:
        return rejection(exc)
    except ApiError as exc:
        return exc.response()
    try:
        return await forward(svc, session, path, routed, headers)
    except ApiError as exc:
        return exc.response()


async def relay_to_owner(svc: HelperService, method: str, target: str, body: bytes, headers: list) -> Response:
    """One request relayed to the owner's private port, its answer passed back (a stream as it comes)."""
    request = httpx.Request(method, svc.owner_url + target, content=body, headers=headers,
                            extensions={"timeout": svc.forward_timeout})
    try:
        resp = await svc.transport.handle_async_request(request)
    except httpx.HTTPError as exc:
        return error_response(503, f"the router is restarting ({type(exc).__name__}); retry later",
                              kind="service_unavailable")
    out = relayed_headers(resp)
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        return RelayResponse(_stream(resp), out)
    try:
        content = await read_body(resp)
    finally:
        await resp.aclose()
    reply = Response(content, status_code=resp.status_code)
    reply.raw_headers.extend(out)
    return reply


async def _stream(resp: httpx.Response):
    try:
        async for chunk in body_chunks(resp):
            yield chunk
    finally:
        await resp.aclose()


async def _relay_any(request: Request) -> Response:
    svc: HelperService = request.app.state.service
    chunks, size, limit = [], 0, svc.settings.max_body_bytes
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return too_large(limit).response()
    body = b"".join(chunks)
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return await relay_to_owner(svc, request.method, target, body, sent_headers(request.headers.raw))


def helper_routes(settings: RouterSettings, index: int, channel_path: str, owner_url: str) -> GeneratingRoutes:
    """A data-path process's app: the generating routes on the data path, every other request relayed."""
    svc = HelperService(settings, index, channel_path, owner_url)
    app = Starlette(routes=[Route("/{path:path}", _relay_any, methods=METHODS)], lifespan=service_lifespan(svc))
    app.state.service, app.state.limit = svc, None
    routes = GeneratingRoutes(app, {})
    routes.serve = serve_remote
    return routes


def main(argv: list[str]) -> None:
    """One data-path process: `INDEX CHANNEL_PATH OWNER_URL`, the settings in $CADENCERL_ROUTER_PROCESS_SETTINGS."""
    index, channel_path, owner_url = int(argv[0]), argv[1], argv[2]
    settings = RouterSettings.model_validate_json(os.environ[SETTINGS_ENV])
    socks = bind(settings.host, settings.port, reuse_port=True)
    routes = helper_routes(settings, index, channel_path, owner_url)
    _HelperServer(uvicorn_config(routes, settings)).run(sockets=socks)


class _HelperServer(uvicorn.Server):
    """A data-path process's server: it tells its owner once it accepts on the port."""

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            self.config.app.state.service.channel.send(["ready"])


if __name__ == "__main__":
    main(sys.argv[1:])
