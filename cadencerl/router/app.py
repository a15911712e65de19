"""The router's HTTP face: OpenAI-compatible routes, health, metrics and the admin endpoints.

Starlette (no per-route validation layer: the body is checked once in `requests.py` and forwarded
as received). Every error is an OpenAI-style JSON body; an unexpected exception is a 500 body, not a
dropped connection, sent by `request_id.py` so that it carries the request id.
"""

from __future__ import annotations

import hmac
import os
from contextlib import asynccontextmanager

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cadencerl.admission.misa import MisaT
from cadencerl.engine.urls import check_server_url
from cadencerl.router.areal import ROUTES as AREAL_ROUTES
from cadencerl.router.areal import while_paused
from cadencerl.router.backpressure import limit_for
from cadencerl.router.disconnect import CLIENT_CLOSED, while_connected
from cadencerl.router.gateway import routes as gateway_routes
from cadencerl.router.live import Session
from cadencerl.router.passthrough import PASS_THROUGH, pass_through
from cadencerl.router.proxy import forward
from cadencerl.router.request_id import RequestIdMiddleware
from cadencerl.router.requests import ApiError, Routed, check_content_type, error_response, read_request
from cadencerl.router.responses import UNKNOWN_RESPONSE, stored_response
from cadencerl.router.service import Rejected, RouterService
from cadencerl.router.settings import ADMIN_TOKEN_ENV, RouterSettings


def create_app(settings: RouterSettings, admin_token: str | None = None) -> GeneratingRoutes:
    """The app; the admin token defaults to $CADENCERL_ROUTER_ADMIN_TOKEN (admin is off without one)."""
    svc = RouterService(settings)
    token = admin_token if admin_token is not None else os.environ.get(ADMIN_TOKEN_ENV)
    lifespan = service_lifespan(svc)
    routes = [
        Route("/v1/completions", _completion("/v1/completions", "prompt"), methods=["POST"]),
        Route("/v1/chat/completions", _completion("/v1/chat/completions", "messages"), methods=["POST"]),
        Route("/v1/responses", Bounded(_completion("/v1/responses", "input")), methods=["POST"]),
        Route("/v1/responses/{response_id}", stored_response(""), methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", stored_response("/cancel"), methods=["POST"]),
        *(Route(path, pass_through(path), methods=["POST"]) for path in PASS_THROUGH),
        *(Route(path, _any_server(path), methods=["GET"]) for path in ANY_SERVER),
        Route("/v1/sessions/{key}", _end_session, methods=["DELETE"]),
        Route("/health", _health, methods=["GET"]),
        Route("/liveness", _liveness, methods=["GET"]),
        Route("/readiness", _readiness, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        Route("/admin/workers", _admin(token, _list_workers), methods=["GET"]),
        Route("/admin/workers", _admin(token, _add_worker), methods=["POST"]),
        Route("/admin/workers/remove", _admin(token, _remove_worker), methods=["POST"]),
        Route("/admin/workers/drain", _admin(token, _drain_worker), methods=["POST"]),
        *AREAL_ROUTES,
        # SGLang's /generate and the model gateway's /workers (open unless an admin token is set)
        *gateway_routes(serve_routed, (lambda h: _admin(token, h)) if token else (lambda h: h), Bounded),
    ]
    # an unhandled exception's 500 is RequestIdMiddleware's, so that it carries the request id
    handlers = {ApiError: _api_error, HTTPException: _http_error, ClientDisconnect: _client_left}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers,
                    middleware=[Middleware(RequestIdMiddleware)])
    app.state.service = svc
    app.state.limit = limit_for(svc)       # placement-only policies: a bound on what is in flight
    fast = {path: _completion(path, field) for path, field in (("/v1/completions", "prompt"),
                                                               ("/v1/chat/completions", "messages"))}
    return GeneratingRoutes(app, fast)


def service_lifespan(svc):
    """The app's lifespan: `svc` started before the first request, stopped after the last."""
    @asynccontextmanager
    async def lifespan(app):
        await svc.start()
        try:
            yield
        finally:
            await svc.stop()
    return lifespan


class GeneratingRoutes:
    """The two generating routes most traffic takes, straight to their handlers (with the request id
    and the 500 of `RequestIdMiddleware`): Starlette's route matching and exception layers cost as
    much as the rest of a request's work. Everything else, lifespan included, goes to `app`."""

    def __init__(self, app: Starlette, handlers: dict) -> None:
        self.app, self.state, self.handlers = app, app.state, handlers
        self.serve = None       # the data path's own serving, where not `serve_routed` (`helper.serve_remote`)
        self._direct = {path: RequestIdMiddleware(_asgi(app, handler)) for path, handler in handlers.items()}

    async def __call__(self, scope, receive, send) -> None:
        direct = self._direct.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        await (direct or self.app)(scope, receive, send)


class Bounded:
    """A generating route's endpoint within the in-flight bound (`backpressure.py`), its reply's
    stream included, as the two routes of `GeneratingRoutes` are."""

    def __init__(self, handler) -> None:
        self.handler = handler

    async def __call__(self, scope, receive, send) -> None:
        await _asgi(scope["app"], self.handler)(scope, receive, send)


def _asgi(app: Starlette, handler):
    async def run(scope, receive, send) -> None:
        scope["app"] = app                       # `request.app.state.service`, as Starlette sets it
        request = Request(scope, receive, send)
        limit = app.state.limit
        try:
            if limit is not None:       # waits unwatched (bounded by --hold-timeout): the body is not read yet
                await limit.enter()
        except Rejected as exc:
            await rejection(exc)(scope, receive, send)
            return
        try:
            try:
                response = await handler(request)
            except ClientDisconnect:
                response = await _client_left(request, None)
            await response(scope, receive, send)
        finally:
            if limit is not None:
                limit.leave()
    return run


def rejection(exc: Rejected) -> Response:
    return error_response(exc.status, str(exc), exc.param, exc.reason, {"Retry-After": str(exc.retry_after)})


def _completion(path: str, field: str):
    """The handler of a generating route; `field` names its prompt (`prompt`, `messages`, `input`)."""
    async def handler(request: Request) -> Response:
        svc: RouterService = request.app.state.service
        s = svc.settings
        try:
            check_content_type(request.headers)
            routed = await read_request(request, field, s.classes, s.fallback_class, s.max_body_bytes)
            svc.check_fits(routed.prompt_len, field)
        except ApiError as exc:
            svc.metrics.errors.labels("bad_request").inc()
            return exc.response()
        response = await while_connected(request, serve_routed(svc, path, routed, request.headers, field))
        if response is None:
            svc.metrics.errors.labels("client_disconnect").inc()
            return Response(status_code=CLIENT_CLOSED)
        return response
    return handler


async def serve_routed(svc: RouterService, path: str, routed: Routed, headers, field: str) -> Response:
    try:
        session = await place(svc, routed, field)
        svc.metrics.served_by("0").inc()
    except Rejected as exc:
        return rejection(exc)
    except ApiError as exc:           # an unknown previous response, or it stopped fitting any server's KV
        svc.metrics.errors.labels(UNKNOWN_RESPONSE if exc.status == 404 else "bad_request").inc()
        return exc.response()
    try:
        return await forward(svc, session, path, routed, headers)
    except ApiError as exc:
        return exc.response()


async def place(svc: RouterService, routed: Routed, field: str) -> Session:
    """The decision part of serving a request: admit or place it (waiting in HOLD, or through a
    weight update's pause, as it must). The decision owner runs it for its data-path processes too."""
    previous = routed.previous_response_id
    await svc.settle_background(routed.session_key, previous)
    await while_paused(svc)
    session = svc.resumes.take(routed.group) if routed.prompt_ids is not None else None
    if session is not None and await svc.resume(session, field):
        svc.metrics.resumed.inc()
        return session
    pin = None if previous is None else svc.owner(previous, "previous_response_id", generate=True).id
    held = 0 if previous is None else svc.owners.context(previous)
    return await svc.acquire(field=field, **_session_of(routed, pin, held))


def enter_at_once(svc: RouterService, routed: Routed) -> Session | None:
    """`place` up to its wait where nothing comes before the decision (no pause, no background
    response to settle, no stored response, no evicted request it may resume); else None. The
    session is placed or held for the pass due (`RouterService.decide_now`), as in `place`."""
    if svc.paused or svc.followers or routed.previous_response_id is not None or \
            (routed.prompt_ids is not None and svc.resumes.evicted_at):
        return None
    return svc.enter(**_session_of(routed, None, 0))


def _session_of(routed: Routed, pin: int | None, held: int) -> dict:
    """What `RouterService.acquire` and `enter` take of a request."""
    return {"key": routed.session_key, "cls": routed.workload_class, "prompt_len": routed.prompt_len,
            "group": routed.group, "route_key": routed.route_key, "pin": pin, "held": held,
            "max_new_tokens": routed.max_new_tokens, "resumable": routed.prompt_ids is not None,
            "prefix": routed.prefix}


ANY_SERVER = ("/v1/models", "/version", "/ping", "/load")     # the same on every server: asked of one up


def _any_server(path: str):
    async def handler(request: Request) -> Response:
        svc: RouterService = request.app.state.service
        for up in svc.upstreams:
            if up.routable:
                try:
                    resp = await svc.client.get(f"{up.url}{path}", timeout=5.0)
                except Exception:
                    continue
                return Response(resp.content, status_code=resp.status_code,
                                media_type=resp.headers.get("content-type", "application/json"))
        return error_response(503, "no server is up", kind="service_unavailable")
    return handler


async def _end_session(request: Request) -> Response:
    svc: RouterService = request.app.state.service
    if svc.end_session(request.path_params["key"]):
        return JSONResponse({"ended": True})
    return error_response(404, "no parked session with that id", "key", "not_found")


async def _health(request: Request) -> Response:
    svc: RouterService = request.app.state.service
    up = sum(u.routable for u in svc.upstreams)
    body = {"status": "ok" if up else "no_workers", "workers_up": up, "held": len(svc.state.hold)}
    if svc.settings.processes > 1:
        body["processes_up"] = svc.processes_up
    return JSONResponse(body, status_code=200 if up else 503)


async def _liveness(request: Request) -> Response:
    """vllm-router's liveness probe: the router process answers (whatever its servers' state), so
    an orchestrator restarts the router only when the router itself is stuck."""
    return JSONResponse({"status": "alive"})


async def _readiness(request: Request) -> Response:
    """vllm-router's readiness probe, with its body's names: ready while at least one server takes
    new requests (healthy, not drained or removed), else 503 with the reason, so an orchestrator
    sends no traffic to a router that could only answer 503."""
    svc: RouterService = request.app.state.service
    listed = [u for u in svc.upstreams if not u.removed]
    up = sum(u.routable for u in listed)
    body = {"status": "ready" if up else "not_ready", "healthy_workers": up, "total_workers": len(listed)}
    if up:
        return JSONResponse(body)
    down, draining = sum(not u.healthy for u in listed), sum(u.healthy and u.draining for u in listed)
    body["reason"] = (f"no healthy workers available ({down} down, {draining} draining)" if listed
                      else "no workers: every one was removed")
    return JSONResponse(body, status_code=503)


async def _metrics(request: Request) -> Response:
    svc: RouterService = request.app.state.service
    m, st = svc.metrics, svc.state
    misa = st.policy.gate if isinstance(st.policy.gate, MisaT) else None
    caps = misa.caps if misa is not None else {}
    held = misa.learner.held_off_engine() if misa is not None else {}
    for up, w in zip(svc.upstreams, st.workers):
        label = up.url
        m.load.labels(label).set(w.load)
        m.sessions.labels(label).set(w.sessions)
        m.kv.labels(label).set(w.engine_kv / max(w.kv_capacity, 1))
        m.up.labels(label).set(1 if up.routable else 0)
        m.cap.labels(label).set(caps.get(w.id, 0))
        m.held_kv.labels(label).set(held.get(w.id, 0) / max(w.kv_capacity, 1))
        if up.prefix_queries:
            m.server_hit_rate.labels(label).set(up.prefix_hits / up.prefix_queries)
    limit = request.app.state.limit
    m.hold_depth.set(len(st.hold) + (limit.depth if limit is not None else 0))
    m.parked.set(len(st.parked))
    for cls in svc.settings.classes:
        m.completed.labels(cls).set(st.completed.get(cls, 0))
    m.dtv.labels("all").set(st.mix_dtv())
    m.dtv.labels("recent").set(st.mix_dtv(recent=True))
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)


# -- admin ----------------------------------------------------------------------------------------

def _admin(token: str | None, handler):
    """Bearer-token check: no credentials -> 401; wrong ones, or admin disabled (no token set) -> 403."""
    async def guarded(request: Request) -> Response:
        given = request.headers.get("authorization", "")
        if not given:
            return error_response(401, "admin endpoints need 'Authorization: Bearer <token>'",
                                  kind="authentication_error", headers={"WWW-Authenticate": "Bearer"})
        scheme, _, value = given.partition(" ")
        if not token or scheme.lower() != "bearer" or not hmac.compare_digest(value.encode(), token.encode()):
            return error_response(403, "the admin token is not valid" if token else
                                  f"admin endpoints are disabled ({ADMIN_TOKEN_ENV} is not set)",
                                  kind="permission_error")
        return await handler(request)
    return guarded


async def _list_workers(request: Request) -> Response:
    svc: RouterService = request.app.state.service
    rows = [{"id": u.id, "url": u.url, "healthy": u.healthy, "draining": u.draining, "removed": u.removed,
             "in_flight": w.load, "sessions": w.sessions} for u, w in zip(svc.upstreams, svc.state.workers)]
    return JSONResponse({"workers": rows})


async def _worker_url(request: Request) -> str:
    try:
        body = await request.json()
    except ValueError:
        raise ApiError(400, "the body is not valid JSON") from None
    url = body.get("url") if isinstance(body, dict) else None
    if not isinstance(url, str):
        raise ApiError(400, "url: required, an http(s) URL", "url")
    try:
        return check_server_url(url, "url:")
    except ValueError as exc:
        raise ApiError(400, str(exc), "url") from None


async def _add_worker(request: Request) -> Response:
    svc: RouterService = request.app.state.service
    url = await _worker_url(request)
    if svc.find(url) is not None:
        raise ApiError(409, f"url: {url} is already a worker", "url", "conflict")
    up = svc.add_worker(url)
    await svc.poll_once()
    return JSONResponse({"id": up.id, "url": up.url, "healthy": up.healthy}, status_code=201)


async def _remove_worker(request: Request) -> Response:
    return await _retire(request, "removed")


async def _drain_worker(request: Request) -> Response:
    return await _retire(request, "draining")


async def _retire(request: Request, flag: str) -> Response:
    """Drain: no new requests, those in flight finish. Remove: the same, and it stays listed as
    removed in `GET /admin/workers` (ids are never reused: added again, it gets a new one)."""
    svc: RouterService = request.app.state.service
    up = svc.find(await _worker_url(request))
    if up is None:
        raise ApiError(404, "url: not a worker of this router", "url", "not_found")
    setattr(up, flag, True)
    svc.set_routable(up)
    return JSONResponse({"id": up.id, "url": up.url, flag: True, "in_flight": svc.state.workers[up.id].load})


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return error_response(exc.status_code, exc.detail or "error", kind="invalid_request_error")


async def _api_error(request: Request, exc: ApiError) -> Response:
    return exc.response()


async def _client_left(request: Request, exc: ClientDisconnect) -> Response:
    """The client left while its body was on the way: nothing was sent on, nobody reads this."""
    request.app.state.service.metrics.errors.labels("client_disconnect").inc()
    return Response(status_code=CLIENT_CLOSED)
