"""`cadencerl router --data-path rust`: the port served in Rust (native/datapath, hyper), decided here.

The Rust side reads each `POST /v1/completions` and `/v1/chat/completions` whole and hands it over
in batches (`_datapath.take`) to the router's own code (`rust_owner.RustOwner`), which answers
"forward to this server" or the router's refusal. The Rust side relays the reply and reports its
end: the session is released with the tokens counted from the stream's events or the JSON body's
usage (before the end goes out), a server that failed before any byte is marked down and the
request placed once more (`RouterService.reroute`), and a client that leaves releases or withdraws
its request. Every other route, and a resumable request, is served by the router's own app, which
the Rust side reaches on a private port.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import uvicorn

from cadencerl.router.limits import MAX_HEAD_BYTES, RouterConfig
from cadencerl.router.requests import too_large
from cadencerl.router.rust_owner import RustOwner
from cadencerl.router.settings import RouterSettings

try:
    from cadencerl.router import _datapath     # built by `make router-native`
except ImportError:     # not built here: `--data-path rust` is refused with that said
    _datapath = None

DRAIN_S = 30.0          # how long a stop waits for the requests in flight
THREADS = int(os.environ.get("CADENCERL_DATAPATH_THREADS", "1"))   # the Rust side's (measured: docs/router.md)


def _on_bell(owner: RustOwner, bell: int) -> None:
    """The Rust side rang: the ring read, then every event it queued, on the loop's own thread (a
    thread waiting for events cost each batch two GIL hand-offs: docs/router.md)."""
    try:
        os.read(bell, 4096)
    except BlockingIOError:         # read by an earlier ring's turn: its events may be taken already
        pass
    if events := _datapath.take():
        owner.on_events(events)


class _Server(uvicorn.Server):
    """uvicorn for the router's own app, which first stops the Rust side and lets its requests finish."""

    async def shutdown(self, sockets=None) -> None:
        _datapath.stop()
        deadline = time.monotonic() + DRAIN_S
        while _datapath.in_flight() > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)


def serve_rust(app, config: RouterConfig, settings: RouterSettings, socks: list[socket.socket]) -> None:
    """Serve `app` (`config`: uvicorn's settings for it) on `socks` (from `serve.bind`) in Rust until
    interrupted; uvicorn serves the app's other routes on a private loopback port."""
    import uvloop

    private = socket.socket()
    private.bind(("127.0.0.1", 0))
    rest = f"http://127.0.0.1:{private.getsockname()[1]}"
    fds = []
    for sock in socks:          # the Rust side takes a copy of each; the originals close, so a stop refuses
        sock.listen(4096)
        fds.append(os.dup(sock.fileno()))
    limit = settings.max_body_bytes
    bell = _datapath.serve(fds, rest, THREADS, limit, too_large(limit).response().body, MAX_HEAD_BYTES,
                           config.read_timeout_s, settings.request_timeout_s, config.timeout_keep_alive)
    for sock in socks:
        sock.close()

    async def main() -> None:
        asyncio.get_running_loop().add_reader(bell, _on_bell, RustOwner(app, rest, _datapath), bell)
        await _Server(config).serve(sockets=[private])

    uvloop.install()
    asyncio.run(main())
