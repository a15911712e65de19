"""The router's own decision owner behind a Rust data path: a measurement of issue #37's way forward.

`native_datapath.so` (build.sh) serves the public port in Rust (hyper, tokio) and hands each
`POST /v1/completions` and `/v1/chat/completions` to this process in batches; here the router's own
code parses it (`requests.parse_request`), admits or places it (the service's `enter` and one pass
a loop turn, or `app.place`'s whole way: MISA-T, the policy, HOLD and 429 as in the router), and
answers "forward to this server" or the router's error reply.
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

from cadencerl.core.trajectory import State  # noqa: E402
from cadencerl.router.app import create_app, enter_at_once, place, rejection  # noqa: E402
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
        self.entered: dict[int, tuple] = {}     # entered this loop turn, for `after_pass`
        self.gone: set[int] = set()             # of those, the ones whose client left already
        self.holding: dict[int, object] = {}    # held after the pass, their waits not begun yet
        self.after_due = False

    def on_batch(self, batch: tuple[list, list]) -> None:
        """The asks, each parsed and entered for the loop turn's one decision pass (`after_pass`; one
        `place` must see through a pause, a background response or a resume goes to a task at once),
        then the ends, an ask's own among them: a reply sent (its session released), or a client
        gone before its request went (its decision cancelled, a held request withdrawn)."""
        asks, done = batch
        for rid, path, headers, body in asks:
            try:
                routed = parse_request(body, Headers(headers), FIELDS[path], self.svc.settings.classes,
                                       self.svc.settings.fallback_class)
                session = enter_at_once(self.svc, routed)
            except (Rejected, ApiError) as exc:
                self.refuse(rid, exc)
                continue
            if session is None:
                self.start(rid, place(self.svc, routed, FIELDS[path]), routed)
            else:
                self.entered[rid] = (session, routed, FIELDS[path])
        for rid, status in done:
            if rid in self.placed:
                session, routed = self.placed.pop(rid)
                generated = (routed.max_new_tokens or 16) if status == 200 else 0
                self.svc.release(session, generated, last=routed.last)
            elif rid in self.deciding:
                self.deciding[rid].cancel()
                if (session := self.holding.pop(rid, None)) is not None:
                    self.svc.abandon(session)       # held, its wait not begun: nothing else withdraws it
            elif rid in self.entered:
                self.gone.add(rid)
        if self.entered and not self.after_due:     # after the pass every batch of this loop turn made due
            self.after_due = True
            asyncio.get_running_loop().call_soon(self.after_pass)

    def after_pass(self) -> None:
        """The requests entered this loop turn: forwarded if the pass placed them, else each waits in a task."""
        self.after_due = False
        self.svc.decide_now()
        entered, self.entered, gone, self.gone = self.entered, {}, self.gone, set()
        for rid, (session, routed, field) in entered.items():
            if rid in gone:
                self.svc.abandon(session)        # its client left before the pass
            elif session.traj.state is State.RESIDENT:
                self.go(rid, session, routed)
            else:
                self.holding[rid] = session
                self.start(rid, self.held(rid, session, field), routed)

    def start(self, rid: int, placing, routed) -> None:
        task = self.deciding[rid] = asyncio.ensure_future(self.wait(rid, placing, routed))
        task.add_done_callback(lambda _: self.deciding.pop(rid, None))

    async def wait(self, rid: int, placing, routed) -> None:
        try:
            session = await placing
        except asyncio.CancelledError:
            return                      # its client left while it was held (the wait withdrew it)
        except (Rejected, ApiError) as exc:
            self.refuse(rid, exc)
            return
        self.go(rid, session, routed)

    async def held(self, rid: int, session, field: str):
        del self.holding[rid]                   # from here, the wait withdraws it if its client leaves
        await self.svc.wait_placed(session, field)
        return session

    def go(self, rid: int, session, routed) -> None:
        self.placed[rid] = (session, routed)
        native_datapath.forward(rid, self.svc.upstreams[session.traj.worker].url)

    def refuse(self, rid: int, exc: Exception) -> None:
        refusal = rejection(exc) if isinstance(exc, Rejected) else exc.response()
        native_datapath.reply(rid, refusal.status_code, [(k.decode(), v.decode()) for k, v in refusal.raw_headers],
                              refusal.body)


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
