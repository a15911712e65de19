"""Run the router under uvicorn (uvloop and httptools when installed), bound to the given host."""

from __future__ import annotations

import importlib.util

import uvicorn

from cadencerl.router.app import create_app
from cadencerl.router.settings import RouterSettings


def server_config(settings: RouterSettings, admin_token: str | None = None) -> uvicorn.Config:
    fast_loop = importlib.util.find_spec("uvloop") is not None
    fast_http = importlib.util.find_spec("httptools") is not None
    return uvicorn.Config(create_app(settings, admin_token), host=settings.host, port=settings.port,
                          loop="uvloop" if fast_loop else "asyncio", http="httptools" if fast_http else "h11",
                          log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=30,
                          backlog=4096)


def serve(settings: RouterSettings) -> None:
    uvicorn.Server(server_config(settings)).run()
