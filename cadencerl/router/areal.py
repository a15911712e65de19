"""AReaL's control routes, answered by the router for every server behind it: its client sends
each to every address it knows, and behind a router it knows one.

`/areal_pause_generation` hands every resumable request in flight back with "abort" (its client
re-sends it after the update) and holds new requests; `/areal_update_weights {"model_path"}` makes
the checkpoint the controller's next version and switches every worker to it (its server reloads
through stock vLLM's dev-mode routes, `weights.py`); `/areal_continue_generation` ends the pause.
AReaL's NCCL weight groups need its patched server and a GPU: those routes answer 501 naming why.
"""

from __future__ import annotations

import asyncio
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cadencerl.devpool.weights import WeightPushError
from cadencerl.router.requests import ApiError
from cadencerl.router.service import Rejected, RouterService

NCCL_ROUTES = ("/areal_init_weights_update_group", "/areal_set_update_weight_meta", "/areal_update_weights_xccl",
               "/areal_set_update_weight_meta_lora", "/areal_update_weights_lora_xccl")


async def while_paused(svc: RouterService) -> None:
    """A request that comes during a weight update waits for its end (at most --hold-timeout)."""
    if svc.paused:
        try:
            await asyncio.wait_for(svc.unpaused.wait(), svc.settings.hold_timeout_s)
        except asyncio.TimeoutError:
            raise Rejected(429, "paused", "paused for a weight update; retry later", svc.retry_after()) from None


def pause(svc: RouterService) -> None:
    svc.paused = True
    svc.unpaused.clear()
    svc.resumes.pause()


def resume(svc: RouterService) -> None:
    svc.paused = False
    svc.unpaused.set()
    svc.decide()


async def update_weights(svc: RouterService, model_path: str) -> int:
    """`model_path` is the next version, on every worker; the version. WeightPushError if a server fails."""
    now = svc.now()
    version = svc.state.controller.publish(now)
    svc.weights.paths[version] = model_path
    svc.state.controller.switch_all(now)
    await svc.weights.settle()
    svc.metrics.weight_version.set(version)
    return version


async def _pause(request: Request) -> Response:
    pause(request.app.state.service)
    return JSONResponse({"success": True})


async def _continue(request: Request) -> Response:
    resume(request.app.state.service)
    return JSONResponse({"success": True})


async def _update(request: Request) -> Response:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise ApiError(400, "the body is not valid JSON") from None
    path = body.get("model_path") if isinstance(body, dict) else None
    if not isinstance(path, str) or not path:
        raise ApiError(400, "model_path: give the folder of the new weights, as a string", "model_path")
    try:
        version = await update_weights(request.app.state.service, path)
    except WeightPushError as exc:
        raise ApiError(502, str(exc), "model_path", "upstream_error") from None
    return JSONResponse({"success": True, "version": version})


def _no_nccl(path: str):
    async def handler(request: Request) -> Response:
        raise ApiError(501, f"{path}: NCCL weight groups need AReaL's patched vLLM server and a GPU; behind "
                            "this router, update from disk (/areal_update_weights with model_path)", kind="not_implemented")
    return handler


ROUTES = [Route("/areal_pause_generation", _pause, methods=["POST"]),
          Route("/areal_continue_generation", _continue, methods=["POST"]),
          Route("/areal_update_weights", _update, methods=["POST"]),
          *(Route(path, _no_nccl(path), methods=["POST"]) for path in NCCL_ROUTES)]
