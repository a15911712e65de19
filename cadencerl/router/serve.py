"""Run the router under uvicorn (uvloop and httptools when installed: `datapath.py`), bound to the given host.

The socket is bound here, before uvicorn starts, so a host that does not resolve or a port in use
is a ConfigError naming `host` or `port`, not uvicorn's own log line and exit code."""

from __future__ import annotations

import errno
import gc
import importlib.util
import socket

import uvicorn

from cadencerl.config import ConfigError
from cadencerl.router.app import GeneratingRoutes, create_app
from cadencerl.router.datapath import protocol_for
from cadencerl.router.limits import RouterConfig, keep_alive_s, read_timeout_s
from cadencerl.router.settings import RouterSettings, rust_data_path_built

_PORT_ERRORS = {errno.EADDRINUSE: "already in use", errno.EACCES: "not permitted (ports below 1024 need root)"}


def uvicorn_config(app: GeneratingRoutes, settings: RouterSettings) -> RouterConfig:
    """uvicorn's settings for `app`: its generating routes on the data path (`datapath.py`)."""
    fast_loop = importlib.util.find_spec("uvloop") is not None
    fast_http = importlib.util.find_spec("httptools") is not None
    return RouterConfig(app, read_timeout_s(), host=settings.host, port=settings.port,
                        loop="uvloop" if fast_loop else "asyncio", http=protocol_for(app) if fast_http else "h11",
                        log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=keep_alive_s(),
                        backlog=4096)


def listen(settings: RouterSettings) -> list[socket.socket]:
    """The sockets `settings` serve on (`bind`); `--data-path rust` where it was not built is a
    ConfigError naming the field (and a bad `CADENCERL_KEEP_ALIVE_S` or `CADENCERL_READ_TIMEOUT_S`, naming it)."""
    keep_alive_s()
    read_timeout_s()
    if settings.data_path == "rust":
        if not rust_data_path_built():
            raise ConfigError("data_path: the Rust data path is not built here (`make router-native` builds it)")
    return bind(settings.host, settings.port, reuse_port=settings.processes > 1)


def bind(host: str, port: int, reuse_port: bool = False) -> list[socket.socket]:
    """TCP sockets bound to every address `host` resolves to, as uvicorn (asyncio's create_server)
    binds them: SO_REUSEADDR, IPv6 sockets IPv6-only, one port for all (port 0: the first one's);
    `reuse_port`: SO_REUSEPORT too, for the data-path processes that share the port (`processes.py`).
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
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
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
    """Serve on `socks` (from `bind`) until interrupted; with `--processes N`, as the decision owner
    of N - 1 data-path processes on the same port (`processes.py`); `--data-path rust`: in Rust."""
    app = create_app(settings)
    _settle()
    if settings.data_path == "rust":
        from cadencerl.router.rust_path import serve_rust
        serve_rust(app, uvicorn_config(app, settings), settings, socks)
        return
    if settings.processes == 1:
        uvicorn.Server(uvicorn_config(app, settings)).run(sockets=socks)
        return
    from cadencerl.router.processes import OwnerServer
    private = socket.socket()
    private.bind(("127.0.0.1", 0))      # where the data-path processes relay what they do not serve
    OwnerServer(uvicorn_config(app, settings), app, socks[0].getsockname()[1], private).run(sockets=[*socks, private])


def _settle() -> None:
    """What start-up made (modules, the app, its policy) put out of the cyclic collector's reach:
    each full collection walked it all, a pause of every request in flight (docs/router.md)."""
    gc.collect()
    gc.freeze()
