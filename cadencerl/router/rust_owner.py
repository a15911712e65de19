"""Decides for the router's Rust data path (`rust_path.py`): each request's check and parse, its
placement (a batch's requests entered together and placed by the batch's one decision pass, or
`app.place`'s whole way where something comes first), its release at its end, its one retry.

Compiled by `make native` with the service it drives, since its work lies on every request's path;
the Rust side is reached through `DataPath` (the extension module, or a test's or benchmark's fake).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any, Protocol, cast

from cadencerl.core.trajectory import State
from cadencerl.router.app import enter_at_once, place, rejection
from cadencerl.router.backpressure import InFlightLimit
from cadencerl.router.live import Session
from cadencerl.router.proxy import _completion_tokens, timed_out
from cadencerl.router.rejections import Rejected
from cadencerl.router.requests import ApiError, check_content_type, parse_request
from cadencerl.router.service import RouterService

FIELDS = {"/v1/completions": "prompt", "/v1/chat/completions": "messages"}
log = logging.getLogger(__name__)


class DataPath(Protocol):
    """What the Rust side takes from Python: a request forwarded to a URL, or answered here."""

    def forward(self, rid: int, url: str, worker: str) -> None: ...

    def reply(self, rid: int, status: int, headers: list[tuple[str, str]], body: bytes) -> None: ...


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
    """Decides for the Rust side (`datapath`): each request's placement, its release, its one retry."""

    def __init__(self, app: Any, rest: str, datapath: DataPath) -> None:
        self.svc: RouterService = app.state.service
        self.limit: InFlightLimit | None = app.state.limit
        self.rest, self.datapath = rest, datapath
        self.placed: dict[int, _Placed] = {}
        self.deciding: dict[int, asyncio.Task] = {}
        self.entered: dict[int, tuple] = {}     # entered this batch, for `after_pass`
        self.gone: set[int] = set()             # of those, the ones whose client left already
        self.holding: dict[int, Session] = {}   # held after the pass, their waits not begun yet

    def on_events(self, events: list[tuple[str, int, Any]]) -> None:
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
            self.datapath.forward(rid, self.rest + path, "")
            return
        if self.limit is not None and not self.limit.try_enter():
            claim = _Claim(False)
            self.start(rid, partial(self.placing, routed, field, claim), routed, path, claim)
            return
        claim = _Claim(self.limit is not None)
        try:
            session = enter_at_once(svc, routed)
        except Rejected as refused:
            self.leave(claim.slot)
            self.refuse(rid, refused)
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
        self.datapath.forward(rid, self.svc.upstreams[worker].url + placed.path, str(worker))

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
        if slot and self.limit is not None:
            self.limit.leave()

    def refuse(self, rid: int, exc: Exception) -> None:
        refusal = rejection(exc) if isinstance(exc, Rejected) else cast(ApiError, exc).response()
        self.datapath.reply(rid, refusal.status_code, [(k.decode(), v.decode()) for k, v in refusal.raw_headers],
                            bytes(refusal.body))
