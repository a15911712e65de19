"""The decision owner of a router run as several processes (`--processes N`): process 0.

It serves HTTP like a single router, and over `channel.py` it decides for the data-path processes
(`helper.py`): each of their requests is admitted or placed here by the same code as its own
(`app.place`, MISA-T's HOLD and caps, the cache-aware tree, the in-flight bound), and released
here when its reply ends. One decision state, so N processes decide as one on the same sequence.
A data-path process that goes away has every session it held released, none left placed.
"""

from __future__ import annotations

import asyncio
import logging
import os

from cadencerl.router.app import GeneratingRoutes, place
from cadencerl.router.channel import Channel
from cadencerl.router.live import Session
from cadencerl.router.rejections import Rejected
from cadencerl.router.requests import ApiError, Routed
from cadencerl.router.service import RouterService

log = logging.getLogger(__name__)
COUNTED = {"errors", "rejections"}      # the counters a data-path process counts in (by one label)


class _Helper:
    """One data-path process's connection: its waiting acquires and its placed requests, by id."""

    def __init__(self, owner: DecisionOwner) -> None:
        self.owner, self.svc = owner, owner.svc
        self.channel = Channel(self.on_message, self.on_lost)
        self.process = "?"
        self.ready = False
        self.waiting: dict[int, asyncio.Task] = {}
        self.placed: dict[int, tuple[Session, bool]] = {}     # request id -> (session, holds an in-flight slot)

    def on_message(self, m: list) -> None:
        op = m[0]
        if op == "a":
            task = asyncio.get_running_loop().create_task(self._acquire(*m[1:]))
            self.waiting[m[1]] = task
        elif op == "d":
            self._release(m[1], m[2], m[3])
        elif op == "x":
            task = self.waiting.pop(m[1], None)
            if task is not None:
                task.cancel()
            self._release(m[1], 0, True)
        elif op == "f":
            asyncio.get_running_loop().create_task(self._reroute(m[1], m[2]))
        elif op == "u":
            self.svc.upstream_failed(self.svc.upstreams[m[1]])
        elif op == "c" and m[1] in COUNTED:
            getattr(self.svc.metrics, m[1]).labels(m[2]).inc(m[3])
        elif op == "hello":
            self.process = str(m[1])
        elif op == "ready":             # it accepts on the port now
            self.ready = True
            self.svc.processes_up += 1

    async def _acquire(self, rid: int, field: str, key: str | None, cls: str, prompt_len: int, group: int,
                       route_key: str, max_new_tokens: int | None, last: bool, prefix: list[int]) -> None:
        svc, limit, slot = self.svc, self.owner.limit, False
        routed = Routed(b"", False, key, route_key, cls, last, prompt_len, group, max_new_tokens=max_new_tokens,
                        prefix=tuple(prefix))
        try:
            svc.check_fits(prompt_len, field)
            if limit is not None:
                await limit.enter()
                slot = True
            session = await place(svc, routed, field)
        except Rejected as exc:
            self.channel.send(["r", rid, exc.status, exc.reason, str(exc), exc.retry_after, exc.param])
        except ApiError as exc:
            svc.metrics.errors.labels("bad_request").inc()
            self.channel.send(["e", rid, exc.status, exc.message, exc.param, exc.kind])
        except asyncio.CancelledError:
            pass                # its client left while it waited (`x`), or the process went away
        else:
            svc.metrics.served_by(self.process).inc()
            self.placed[rid] = (session, slot)
            slot = False
            self.channel.send(["p", rid, session.traj.worker, svc.upstreams[session.traj.worker].url])
        finally:
            self.waiting.pop(rid, None)
            if slot:
                limit.leave()

    def _release(self, rid: int, generated: int, last: bool) -> None:
        session, slot = self.placed.pop(rid, (None, False))
        if session is not None:
            self.svc.release(session, generated, last=last)
        if slot:
            self.owner.limit.leave()

    async def _reroute(self, rid: int, failed: int) -> None:
        svc = self.svc
        session = self.placed.get(rid, (None,))[0]
        if session is not None and await svc.reroute(session, failed):
            self.channel.send(["p", rid, session.traj.worker, svc.upstreams[session.traj.worker].url])
        else:
            self.channel.send(["n", rid])

    def on_lost(self) -> None:
        for task in list(self.waiting.values()):
            task.cancel()
        for rid in list(self.placed):
            self._release(rid, 0, True)
        self.owner.helpers.discard(self)
        if self.ready:
            self.svc.processes_up -= 1
        if not self.owner.closing:
            log.warning("data-path process %s left; its requests were released", self.process)


class DecisionOwner:
    """Listens on a Unix socket for the data-path processes and decides for them."""

    def __init__(self, routes: GeneratingRoutes, path: str) -> None:
        self.svc: RouterService = routes.state.service
        self.limit = routes.state.limit
        self.path = path
        self.helpers: set[_Helper] = set()
        self.closing = False
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        def connected() -> Channel:
            helper = _Helper(self)
            self.helpers.add(helper)
            return helper.channel
        self._server = await asyncio.get_running_loop().create_unix_server(connected, self.path)

    async def stop(self) -> None:
        self.closing = True
        if self._server is not None:
            self._server.close()
        for helper in list(self.helpers):
            if helper.channel.transport is not None:
                helper.channel.transport.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
