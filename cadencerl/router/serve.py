"""Run the router under uvicorn (uvloop and httptools when installed), bound to the given host.

The socket is bound here, before uvicorn starts, so a host that does not resolve or a port in use
is a ConfigError naming `host` or `port`, not uvicorn's own log line and exit code."""

from __future__ import annotations

import errno
import importlib.util
import socket

import uvicorn

from cadencerl.config import ConfigError
from cadencerl.router.app import create_app
from cadencerl.router.settings import RouterSettings

_PORT_ERRORS = {errno.EADDRINUSE: "already in use", errno.EACCES: "not permitted (ports below 1024 need root)"}


def server_config(settings: RouterSettings, admin_token: str | None = None) -> uvicorn.Config:
    fast_loop = importlib.util.find_spec("uvloop") is not None
    fast_http = importlib.util.find_spec("httptools") is not None
    return uvicorn.Config(create_app(settings, admin_token), host=settings.host, port=settings.port,
                          loop="uvloop" if fast_loop else "asyncio", http="httptools" if fast_http else "h11",
                          log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=30,
                          backlog=4096)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (as uvicorn binds: SO_REUSEADDR), or a ConfigError naming
    `host` (does not resolve, not this machine's) or `port` (in use, privileged)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(f"host: cannot resolve {host!r}: {getattr(exc, 'strerror', None) or exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno in _PORT_ERRORS:
            raise ConfigError(f"port: {port} on {host} is {_PORT_ERRORS[exc.errno]}") from None
        raise ConfigError(f"host: cannot listen on {host}: {exc.strerror or exc}") from None
    return sock


def serve(settings: RouterSettings, sock: socket.socket) -> None:
    """Serve on `sock` (from `bind`) until interrupted."""
    uvicorn.Server(server_config(settings)).run(sockets=[sock])
