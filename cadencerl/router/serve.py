"""Run the router under uvicorn (uvloop and httptools when installed: `datapath.py`), bound to the given host.

The socket is bound here, before uvicorn starts, so a host that does not resolve or a port in use
is a ConfigError naming `host` or `port`, not uvicorn's own log line and exit code."""

from __future__ import annotations

import errno
import importlib.util
import socket

import uvicorn

from cadencerl.config import ConfigError
from cadencerl.router.app import create_app
from cadencerl.router.datapath import protocol_for
from cadencerl.router.settings import RouterSettings

_PORT_ERRORS = {errno.EADDRINUSE: "already in use", errno.EACCES: "not permitted (ports below 1024 need root)"}


def server_config(settings: RouterSettings, admin_token: str | None = None) -> uvicorn.Config:
    fast_loop = importlib.util.find_spec("uvloop") is not None
    fast_http = importlib.util.find_spec("httptools") is not None
    app = create_app(settings, admin_token)     # the generating routes on the data path (`datapath.py`)
    return uvicorn.Config(app, host=settings.host, port=settings.port,
                          loop="uvloop" if fast_loop else "asyncio", http=protocol_for(app) if fast_http else "h11",
                          log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=30,
                          backlog=4096)


def bind(host: str, port: int) -> list[socket.socket]:
    """TCP sockets bound to every address `host` resolves to, as uvicorn (asyncio's create_server)
    binds them: SO_REUSEADDR, IPv6 sockets IPv6-only, one port for all (port 0: the first one's).
    A ConfigError names `host` (does not resolve, not this machine's) or `port` (in use, privileged)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(f"host: cannot resolve {host!r}: {getattr(exc, 'strerror', None) or exc}") from None
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):    # distinct, in resolver order
            if socks and port == 0:
                address = (address[0], socks[0].getsockname()[1], *address[2:])
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        for sock in socks:
            sock.close()
        if exc.errno in _PORT_ERRORS:
            raise ConfigError(f"port: {port} on {host} is {_PORT_ERRORS[exc.errno]}") from None
        raise ConfigError(f"host: cannot listen on {host}: {exc.strerror or exc}") from None
    return socks


def serve(settings: RouterSettings, socks: list[socket.socket]) -> None:
    """Serve on `socks` (from `bind`) until interrupted."""
    uvicorn.Server(server_config(settings)).run(sockets=socks)
