"""SGLang's router face, for slime and SGLang clients: `POST /generate` (through the router's own
completion path, translated by `sglang.py`), the model gateway's worker registry (`GET/POST
/workers`, `DELETE /workers/{id}`) and `/abort_request` (one request by `rid`, or `abort_all`).

`GET /workers` lists each worker at the router's own per-worker address (`/workers/{id}`), where
`/abort_request` and `/v1/loads` are answered for that worker: slime aborts by posting to every
listed worker, and a vLLM server has no `/abort_request`. An aborted request is handed back as an
eviction is: `finish_reason.type: "abort"` with every token so far (`resumable.py`).
"""

from __future__ import annotations

import json
from collections import OrderedDict

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cadencerl.engine.urls import check_server_url
from cadencerl.router import sglang
from cadencerl.router.disconnect import CLIENT_CLOSED, while_connected
from cadencerl.router.proxy import WORKER_HEADER, RelayResponse
from cadencerl.router.requests import SESSION_HEADER, ApiError, RawHeaders, _read_body, _route, read_json
from cadencerl.router.service import RouterService

MAX_RIDS = 65536        # rid -> prompt group, remembered for `/abort_request {"rid"}`


class Rids:
    """The prompt group of each recent `/generate` request that named its `rid` (bounded)."""

    def __init__(self) -> None:
        self.groups: OrderedDict[str, int] = OrderedDict()

    def learn(self, rid: object, group: int) -> None:
        if isinstance(rid, str) and rid:
            self.groups[rid] = group
            if len(self.groups) > MAX_RIDS:
                self.groups.popitem(last=False)


def abort_running(svc: RouterService, worker: int | None = None, group: int | None = None) -> int:
    """Hand back the resumable requests running (on `worker`; of prompt `group`: the first only) with
    "abort" and their tokens so far; how many."""
    n = 0
    for tid, event in list(svc.resumes.running.items()):
        traj = svc.state.controller.trajectories.get(tid)
        if traj is None or event.is_set() or (worker is not None and traj.worker != worker) \
                or (group is not None and traj.group != group):
            continue
        event.set()
        n += 1
        if group is not None:
            break
    return n


def running_on(svc: RouterService, worker: int) -> int:
    trajectories = svc.state.controller.trajectories
    return sum(1 for tid in svc.resumes.running if (t := trajectories.get(tid)) is not None and t.worker == worker)


def _session_headers(headers: Headers) -> Headers:
    """The client's headers, with SGLang's routing key as the router's session key (unless it has one)."""
    raw = list(headers.raw)
    key = headers.get(sglang.ROUTING_KEY_HEADER)
    if key and SESSION_HEADER not in headers:
        raw.append((SESSION_HEADER.encode(), key.encode("latin-1")))
    return RawHeaders(raw)


async def _sglang_stream(inner, stream: sglang.StreamAnswer):
    try:
        async for chunk in inner:
            if out := sglang.translate_events(bytes(chunk), stream):
                yield out
    finally:
        await inner.aclose()


def _translate(response: Response, body: dict) -> Response:
    """The router's completion answer in SGLang's shape (errors pass as they are)."""
    if response.status_code != 200:
        return response
    rid, logprob = body.get("rid"), body.get("return_logprob") is True
    if isinstance(response, RelayResponse):
        response.body_iterator = _sglang_stream(response.body_iterator, sglang.StreamAnswer(logprob, rid))
        return response
    ids = body.get("input_ids")
    out = sglang.answer(json.loads(response.body), logprob, rid, bool(body.get("top_logprobs_num")),
                        len(ids) if isinstance(ids, list) else 0)
    worker = next((v.decode() for k, v in response.raw_headers if k.decode().lower() == WORKER_HEADER), None)
    return JSONResponse(out, headers={WORKER_HEADER: worker} if worker is not None else None)


def _generate(serve, rids: Rids):
    async def handler(request: Request) -> Response:
        svc: RouterService = request.app.state.service
        s = svc.settings
        try:
            raw = await _read_body(request, s.max_body_bytes)
            try:
                body = read_json(raw)
            except (ValueError, UnicodeDecodeError):
                raise ApiError(400, "the body is not valid JSON") from None
            completion = sglang.completion_body(body)
            headers = _session_headers(request.headers)
            routed = _route(json.dumps(completion).encode(), headers, "prompt", s.classes, s.fallback_class)
            svc.check_fits(routed.prompt_len, "input_ids")
        except ApiError as exc:
            svc.metrics.errors.labels("bad_request").inc()
            return exc.response()
        rids.learn(body.get("rid"), routed.group)
        response = await while_connected(request, serve(svc, "/v1/completions", routed, headers, "prompt"))
        if response is None:
            svc.metrics.errors.labels("client_disconnect").inc()
            return Response(status_code=CLIENT_CLOSED)
        return _translate(response, body)
    return handler


async def _json(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _abort(rids: Rids, per_worker: bool):
    async def handler(request: Request) -> Response:
        svc: RouterService = request.app.state.service
        worker = _worker(svc, request.path_params["worker_id"]).id if per_worker else None
        body = await _json(request)
        if body.get("abort_all") is True:
            return JSONResponse({"success": True, "aborted": abort_running(svc, worker)})
        rid = body.get("rid")
        if not isinstance(rid, str) or not rid:
            raise ApiError(400, "rid: give the request's rid, or abort_all: true", "rid")
        group = rids.groups.get(rid)
        aborted = 0 if group is None else abort_running(svc, worker, group)
        return JSONResponse({"success": True, "aborted": aborted})
    return handler


def _worker(svc: RouterService, worker_id: str):
    up = svc.upstreams[int(worker_id)] if worker_id.isdigit() and int(worker_id) < len(svc.upstreams) else None
    if up is None or up.removed:
        raise ApiError(404, f"worker_id: no worker {worker_id!r} on this router", "worker_id", "not_found")
    return up


async def _loads(request: Request) -> Response:
    """SGLang's `/v1/loads` for one worker: its resumable requests still running (slime's abort
    loop asks it until it is 0)."""
    svc: RouterService = request.app.state.service
    up = _worker(svc, request.path_params["worker_id"])
    return JSONResponse({"loads": [{"num_running_reqs": running_on(svc, up.id), "num_waiting_reqs": 0}]})


async def _list(request: Request) -> Response:
    svc: RouterService = request.app.state.service
    base = str(request.base_url).rstrip("/")
    rows = [{"id": str(u.id), "url": f"{base}/workers/{u.id}", "upstream_url": u.url, "is_healthy": u.healthy,
             "draining": u.draining, "load": w.load}
            for u, w in zip(svc.upstreams, svc.state.workers) if not u.removed]
    return JSONResponse({"workers": rows, "total": len(rows)})


async def _add(request: Request) -> Response:
    """The model gateway's registration (idempotent: a worker registered again is answered as it is)."""
    svc: RouterService = request.app.state.service
    url = (await _json(request)).get("url")
    if not isinstance(url, str):
        raise ApiError(400, "url: required, an http(s) URL", "url")
    try:
        url = check_server_url(url, "url:")
    except ValueError as exc:
        raise ApiError(400, str(exc), "url") from None
    up = svc.find(url)
    status = 200
    if up is None:
        up, status = svc.add_worker(url), 201
        await svc.poll_once()
    return JSONResponse({"status": "ok", "worker_id": str(up.id), "url": up.url, "is_healthy": up.healthy},
                        status_code=status)


async def _delete(request: Request) -> Response:
    svc: RouterService = request.app.state.service
    up = _worker(svc, request.path_params["worker_id"])
    up.removed = True
    svc.set_routable(up)
    return JSONResponse({"status": "ok", "worker_id": str(up.id), "removed": True})


def routes(serve, guard, bounded) -> list[Route]:
    """The routes; `serve` is the app's completion path, `guard` wraps those that change the pool,
    `bounded` puts a generating one within the in-flight bound (`app.Bounded`)."""
    rids = Rids()
    return [Route("/generate", bounded(_generate(serve, rids)), methods=["POST"]),
            Route("/abort_request", _abort(rids, per_worker=False), methods=["POST"]),
            Route("/workers", _list, methods=["GET"]),
            Route("/workers", guard(_add), methods=["POST"]),
            Route("/workers/{worker_id}", guard(_delete), methods=["DELETE"]),
            Route("/workers/{worker_id}/abort_request", _abort(rids, per_worker=True), methods=["POST"]),
            Route("/workers/{worker_id}/v1/loads", _loads, methods=["GET"])]
