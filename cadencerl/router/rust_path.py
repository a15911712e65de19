"""`cadencerl router --data-path rust`: the port served in Rust (native/datapath, hyper), decided here.

The Rust side reads each `POST /v1/completions` and `/v1/chat/completions` whole and hands it over
in batches (`_datapath.take`); here the router's own code checks and parses it, enters it for the
batch's one decision pass (`app.enter_at_once`) or takes `app.place`'s whole way (a pause, a
full in-flight bound), and answers "forward to this server" or the router's refusal. The Rust side
relays the reply and reports its end: the session is released with the tokens counted from the
stream's events or the JSON body's usage (before the end goes out), a server that failed before
any byte is marked down and the request placed once more (`RouterService.reroute`), and a client
that leaves releases or withdraws its request. Every other route, and a resumable request, is
served by the router's own app, which the Rust side reaches on a private port.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from functools import partial

import uvicorn

from cadencerl.core.trajectory import State
from cadencerl.router.app import enter_at_once, place, rejection
from cadencerl.router.limits import MAX_HEAD_BYTES, RouterConfig
from cadencerl.router.proxy import _completion_tokens, timed_out
from cadencerl.router.rejections import Rejected
from cadencerl.router.requests import ApiError, check_content_type, parse_request, too_large
from cadencerl.router.settings import RouterSettings

try:
    from cadencerl.router import _datapath     # built by `make router-native`
except ImportError:     # not built here: `--data-path rust` is refused with that said
    _datapath = None

FIELDS = {"/v1/completions": "prompt", "/v1/chat/completions": "messages"}
DRAIN_S = 30.0          # how long a stop waits for the requests in flight
THREADS = int(os.environ.get("CADENCERL_DATAPATH_THREADS", "1"))   # the Rust side's (measured: docs/router.md)
log = logging.getLogger(__name__)


class _Placed:
    __slots__ = ("session", "routed", "path", "slot", "retried")

    def __init__(self, session, routed, path: str, slot: bool) -> None:
        self.session, self.routed, self.path, self.slot, self.retried = session, routed, path, slot, False


class _Claim:
    """An in-flight slot a request holds before it is placed: given back when its decision task
    ends without passing it on (refused, its client gone, cancelled before it began), or passed on
    to its placement (`_Placed.slot`), which gives it back at the request's end."""

    __slots__ = ("slot",)

    def __init__(self, slot: bool) -> None:
        self.slot = slot


class RustOwner:
    """Decides for the Rust side: each request's placement, its release, its one retry."""

    def __init__(self, app, rest: str) -> None:
        self.svc, self.limit, self.rest = app.state.service, app.state.limit, rest
        self.placed: dict[int, _Placed] = {}
        self.deciding: dict[int, asyncio.Task] = {}
        self.entered: dict[int, tuple] = {}     # entered this batch, for `after_pass`
        self.gone: set[int] = set()             # of those, the ones whose client left already
        self.holding: dict[int, object] = {}    # held after the pass, their waits not begun yet

    def on_events(self, events: list) -> None:
        """The Rust side's events in the order they happened: asks, failures and ends. One that
        fails here is logged (and an ask answered 500), and the rest of the batch goes on."""
        for op, rid, data in events:
            try:
                if op == "a":
                    self.ask(rid, *data)
                elif op == "d":
                    self.done(rid, *data)
                elif op == "f":
                    self.failed(rid, *data)
                else:                   # a body the Rust side refused (413, 408), counted as the Python path does
                    self.svc.metrics.errors.labels(*data).inc()
            except Exception as exc:
                log.exception("the Rust data path's event %r for request %d failed", op, rid)
                if op == "a":
                    self.refuse(rid, ApiError(500, f"internal error: {type(exc).__name__}", kind="internal_error"))
        if self.entered:        # the batch's one decision pass (a bell's ring takes every event queued)
            self.after_pass()

    def ask(self, rid: int, path: str, headers: dict, body: bytes) -> None:
        svc, field = self.svc, FIELDS[path]     # headers: the first of each name, lower-case (hyper's)
        try:
            check_content_type(headers)
            routed = parse_request(body, headers, field, svc.settings.classes, svc.settings.fallback_class)
            svc.check_fits(routed.prompt_len, field)
        except ApiError as exc:
            svc.metrics.errors.labels("bad_request").inc()
            self.refuse(rid, exc)
            return
        if routed.prompt_ids is not None:       # resumable: the router's own app serves it whole
            _datapath.forward(rid, self.rest + path, "")
            return
        if self.limit is not None and not self.limit.try_enter():
            claim = _Claim(False)
            self.start(rid, partial(self.placing, routed, field, claim), routed, path, claim)
            return
        claim = _Claim(self.limit is not None)
        try:
            session = enter_at_once(svc, routed)
        except Rejected as exc:
            self.leave(claim.slot)
            self.refuse(rid, exc)
            return
        if session is None:
            self.start(rid, partial(self.placing, routed, field, claim), routed, path, claim)
        else:
            self.entered[rid] = (session, routed, field, path)

    def after_pass(self) -> None:
        """The requests entered this batch: forwarded if the pass placed them, else each waits in a task."""
        self.svc.decide_now()
        entered, self.entered, gone, self.gone = self.entered, {}, self.gone, set()
        slot = self.limit is not None
        for rid, (session, routed, field, path) in entered.items():
            if rid in gone:
                self.svc.abandon(session)        # its client left before the pass
                self.leave(slot)
            elif session.traj.state is State.RESIDENT:
                self.go(rid, _Placed(session, routed, path, slot))
            else:
                self.holding[rid] = session
                self.start(rid, partial(self.held, rid, session, field), routed, path, _Claim(slot))

    def start(self, rid: int, placing, routed, path: str, claim: _Claim) -> None:
        """Decide `rid` in a task: `placing()` gives its session once placed."""
        task = self.deciding[rid] = asyncio.ensure_future(self.wait(rid, placing, routed, path, claim))
        task.add_done_callback(lambda _: self.decided(rid, claim))

    def decided(self, rid: int, claim: _Claim) -> None:
        self.deciding.pop(rid, None)
        self.leave(claim.slot)          # a slot its placement did not take over
        claim.slot = False

    async def wait(self, rid: int, placing, routed, path: str, claim: _Claim) -> None:
        try:
            session = await placing()
        except asyncio.CancelledError:
            return                      # its client left while it waited (the wait withdrew it)
        except (Rejected, ApiError) as exc:
            if isinstance(exc, ApiError):
                self.svc.metrics.errors.labels("bad_request").inc()
            self.refuse(rid, exc)
            return
        self.go(rid, _Placed(session, routed, path, claim.slot))
        claim.slot = False

    async def placing(self, routed, field: str, claim: _Claim):
        """`place`'s whole way, first taking an in-flight slot unless it holds one."""
        if not claim.slot and self.limit is not None:
            await self.limit.enter()
            claim.slot = True
        return await place(self.svc, routed, field)

    async def held(self, rid: int, session, field: str):
        del self.holding[rid]                   # from here, the wait withdraws it if its client leaves
        await self.svc.wait_placed(session, field)      # (none if a pass placed it meanwhile)
        return session

    def go(self, rid: int, placed: _Placed, again: bool = False) -> None:
        """Forward `rid` where it is placed (`again`: a retry, not counted as a new placement)."""
        if not again:
            self.svc.metrics.served_by("0").inc()
        self.placed[rid] = placed
        worker = placed.session.traj.worker
        _datapath.forward(rid, self.svc.upstreams[worker].url + placed.path, str(worker))

    def done(self, rid: int, status: int, tokens: int, body: bytes | None, broke: bool) -> None:
        """A reply went (or its client left, or its stream broke: `broke`): the session released
        with what was generated."""
        placed = self.placed.pop(rid, None)
        if broke:
            self.svc.metrics.errors.labels("midstream").inc()
        if placed is not None:
            generated = 0 if status != 200 else tokens if tokens >= 0 else _completion_tokens(body or b"")
            self.svc.release(placed.session, generated, last=placed.routed.last)
            self.leave(placed.slot)
        elif rid in self.deciding:
            self.deciding[rid].cancel()
            if (session := self.holding.pop(rid, None)) is not None:
                self.svc.abandon(session)       # held, its wait not begun: nothing else withdraws it
        elif rid in self.entered:
            self.gone.add(rid)

    def failed(self, rid: int, what: str, down: bool) -> None:
        placed = self.placed.get(rid)
        if placed is None:      # the router's own app did not answer (a resumable request)
            self.refuse(rid, ApiError(502, f"the router's app failed ({what})", kind="upstream_error"))
            return
        if what == "timeout":           # slow is not failed: not sent again (proxy.timed_out)
            self.give_up(rid, placed, timed_out(self.svc))
            return
        self.svc.metrics.errors.labels(what).inc()
        up = self.svc.upstreams[placed.session.traj.worker]
        if down:
            self.svc.upstream_failed(up)
        asyncio.ensure_future(self.retry(rid, placed, up.id, what))

    async def retry(self, rid: int, placed: _Placed, failed: int, what: str) -> None:
        """Once to another server, as the Python data path does; else released and a 502."""
        if self.placed.get(rid) is not placed:
            return              # its client left meanwhile: released already
        if not placed.retried and await self.svc.reroute(placed.session, failed):
            placed.retried = True
            self.go(rid, placed, again=True)
            return
        self.give_up(rid, placed, ApiError(502, f"upstream server failed ({what})", kind="upstream_error"))

    def give_up(self, rid: int, placed: _Placed, error: ApiError) -> None:
        """Released with nothing generated, and the client told why."""
        self.placed.pop(rid, None)
        self.svc.release(placed.session, 0, last=placed.routed.last)
        self.leave(placed.slot)
        self.refuse(rid, error)

    def leave(self, slot: bool) -> None:
        if slot:
            self.limit.leave()

    @staticmethod
    def refuse(rid: int, exc: Exception) -> None:
        refusal = rejection(exc) if isinstance(exc, Rejected) else exc.response()
        _datapath.reply(rid, refusal.status_code, [(k.decode(), v.decode()) for k, v in refusal.raw_headers],
                        refusal.body)


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
        asyncio.get_running_loop().add_reader(bell, _on_bell, RustOwner(app, rest), bell)
        await _Server(config).serve(sockets=[private])

    uvloop.install()
    asyncio.run(main())
