"""The OpenAI Responses API's stored-response routes: `GET /v1/responses/{id}` and
`POST /v1/responses/{id}/cancel`, relayed to the server that made the response.

`POST /v1/responses` itself generates, so it is a completion-like route (`app.py`): read, admitted
by MISA-T and relayed as completions are, and a request with `previous_response_id` is pinned to
the server that holds that response (`stored.py`). These two routes generate nothing: they go to
the owner without admission, the query (`stream`, `starting_after`) and headers passed on, the
answer (a stream too) passed back unchanged. An id the router does not know, or whose server was
removed, is a 404 naming `response_id`; vLLM-router instead asks every server in turn, and a
router that asked a random one would answer that server's 404 for a response that exists.
"""

from __future__ import annotations

import httpx
from starlette.requests import Request
from starlette.responses import Response

from cadencerl.router.disconnect import CLIENT_CLOSED, while_connected
from cadencerl.router.passthrough import failure, relay_once
from cadencerl.router.proxy import forwarded_headers
from cadencerl.router.requests import ApiError, error_response
from cadencerl.router.service import RouterService
from cadencerl.router.stored import response_path
from cadencerl.router.upstream import Upstream

UNKNOWN_RESPONSE = "unknown_response"     # the errors counter's kind for a stored response id the router does not know


def stored_response(suffix: str):
    """The handler of `GET /v1/responses/{id}` (suffix "") or `POST .../{id}/cancel` ("/cancel")."""
    async def handler(request: Request) -> Response:
        svc: RouterService = request.app.state.service
        response_id = request.path_params["response_id"]
        try:
            up = svc.owner(response_id, "response_id")
        except ApiError as exc:
            svc.metrics.errors.labels(UNKNOWN_RESPONSE).inc()
            return exc.response()
        path = f"{response_path(response_id)}{suffix}"
        if request.url.query:
            path += f"?{request.url.query}"
        response = await while_connected(request, _relay(svc, up, request.method, path, request.headers))
        if response is None:
            svc.metrics.errors.labels("client_disconnect").inc()
            return Response(status_code=CLIENT_CLOSED)
        return response
    return handler


async def _relay(svc: RouterService, up: Upstream, method: str, path: str, headers) -> Response:
    """One try: only the owner holds the response, so there is no other server to retry on."""
    try:
        return await relay_once(svc, up, method, path, b"", forwarded_headers(headers), stream=True)
    except httpx.HTTPError as exc:
        why = failure(svc, up, exc)
        return error_response(502, f"the server that holds the response failed ({why})", kind="upstream_error")
