"""The router's own decision owner behind a Rust data path: a measurement of issue #37's way forward.

`native_datapath.so` (build.sh) serves the public port in Rust (hyper, tokio) and hands each
`POST /v1/completions` and `/v1/chat/completions` to this process in batches; here the router's own
code parses it (`requests.parse_request`), admits or places it (`app.place`: MISA-T, the policy,
HOLD and 429 as in the router), and answers "forward to this server" or the router's error reply.
The Rust side relays the server's reply; when it ends, the request is released. Every other route
goes to the router's own app, served here by uvicorn on a private port.

Not the product: a reply's tokens are not counted from its usage (each request is released with its
`max_tokens` as generated), and retries, mid-stream error events and body limits are the Python
data path's only. A client that leaves releases its request (or withdraws it while held). What it
measures is the HTTP work moved out of Python.

    python benchmarks/native_datapath/owner.py --port 8100 --workers http://127.0.0.1:8001 [--policy P]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import threading
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import native_datapath  # noqa: E402  (built by build.sh beside this file)

from cadencerl.router.app import create_app, place, rejection  # noqa: E402
from cadencerl.router.rejections import Rejected  # noqa: E402
from cadencerl.router.requests import ApiError, parse_request  # noqa: E402
from cadencerl.router.serve import uvicorn_config  # noqa: E402
from cadencerl.router.settings import make_settings  # noqa: E402

FIELDS = {"/v1/completions": "prompt", "/v1/chat/completions": "messages"}


class Headers(dict):
    """The request's headers (lower-case names) as `parse_request` reads them."""

    def get(self, key: str, default=None):
        return dict.get(self, key.lower(), default)


class Owner:
    def __init__(self, app) -> None:
        self.svc = app.state.service
        self.placed: dict[int, tuple] = {}        # request id -> (session, routed)
        self.deciding: dict[int, asyncio.Task] = {}

    def on_batch(self, batch: tuple[list, list]) -> None:
        """Each ask's decision started, then the ends: a reply sent (its session released) or a client
        gone before its request was placed (the decision cancelled: a held request is withdrawn)."""
        asks, done = batch
        for ask in asks:
            task = self.deciding[ask[0]] = asyncio.ensure_future(self.decide(*ask))
            task.add_done_callback(lambda _, rid=ask[0]: self.deciding.pop(rid, None))
        for rid, status in done:
            if rid in self.placed:
                session, routed = self.placed.pop(rid)
                generated = (routed.max_new_tokens or 16) if status == 200 else 0
                self.svc.release(session, generated, last=routed.last)
            elif rid in self.deciding:
                self.deciding[rid].cancel()

    async def decide(self, rid: int, path: str, headers: list, body: bytes) -> None:
        svc, field = self.svc, FIELDS[path]
        try:
            routed = parse_request(body, Headers(headers), field, svc.settings.classes, svc.settings.fallback_class)
            session = await place(svc, routed, field)
        except asyncio.CancelledError:
            return                      # its client left while it was held (`place` withdrew it)
        except (Rejected, ApiError) as exc:
            refusal = rejection(exc) if isinstance(exc, Rejected) else exc.response()
            native_datapath.reply(rid, refusal.status_code, [(k.decode(), v.decode()) for k, v in refusal.raw_headers],
                                  refusal.body)
            return
        self.placed[rid] = (session, routed)
        native_datapath.forward(rid, svc.upstreams[session.traj.worker].url)


def take_forever(owner: Owner, loop: asyncio.AbstractEventLoop) -> None:
    """In a thread of its own: each batch the Rust side has (waiting with the GIL released) to the loop."""
    while True:
        loop.call_soon_threadsafe(owner.on_batch, native_datapath.take())


async def main(args: argparse.Namespace) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        private = s.getsockname()[1]
    settings = make_settings(workers=args.workers.split(","), policy=args.policy, host="127.0.0.1", port=private)
    app = create_app(settings)
    owner = Owner(app)
    native_datapath.serve(args.port, f"http://127.0.0.1:{private}", args.threads)
    threading.Thread(target=take_forever, args=(owner, asyncio.get_running_loop()), daemon=True).start()
    print(f"listening on http://127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    await uvicorn.Server(uvicorn_config(app, settings)).serve()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--workers", required=True, help="the servers' URLs, comma-separated")
    ap.add_argument("--policy", default="misa+cache-aware")
    ap.add_argument("--threads", type=int, default=1, help="the Rust side's threads")
    import uvloop
    uvloop.install()
    asyncio.run(main(ap.parse_args()))
