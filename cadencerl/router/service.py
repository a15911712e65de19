"""The router's live core: admission waits, placement, completion accounting, health polling.

Everything that changes the live state runs on the event loop's thread, so there are no locks: a
request's arrival, its reply's end and each health poll apply their event to `LiveState`, and a
decision pass (one per loop turn for all of them) wakes the held requests it admitted or placed.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import cast

import httpx

from cadencerl.core.actions import Admit, Batch, Place
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.router.background import Followers, follow
from cadencerl.router.backpressure import expire
from cadencerl.router.live import LiveState, Session
from cadencerl.router.metrics import RouterMetrics
from cadencerl.router.policy import described_workers, router_policy, router_worker
from cadencerl.router.rejections import Rejected, TooLong, too_long
from cadencerl.router.requests import ApiError
from cadencerl.router.resumes import Resumes
from cadencerl.router.sessions_journal import open_sessions_journal
from cadencerl.router.settings import RouterSettings
from cadencerl.router.stored import ResponseOwners
from cadencerl.router.transport import RawTransport
from cadencerl.router.upstream import Upstream, poll
from cadencerl.router.weights import WeightVersions

GROUPS_PER_WORKER = 4096    # prompt groups remembered per server, for the router's own hit count


class RouterService:
    def __init__(self, settings: RouterSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings, self.clock, self._t0 = settings, clock, clock()
        self.upstreams: list[Upstream] = []
        self.described = described_workers(settings)     # --config's pool: what each server is
        self.state = LiveState(router_policy(settings), [], settings.target_mix, settings.session_ttl_s,
                               settings.max_sessions, batch_size=settings.batch_size, eta=settings.eta,
                               contended_ttl_s=settings.contended_ttl_s)
        self.metrics = RouterMetrics()
        self.waiters: dict[int, asyncio.Future] = {}
        self.groups_seen: list[OrderedDict] = []
        self.owners = ResponseOwners(settings.max_response_ids)     # stored response id -> worker
        self.client: httpx.AsyncClient | None = None     # health, metrics and /v1/models
        self.transport: RawTransport | None = None   # forwarded requests go to it directly
        self.forward_timeout: dict = {}
        self._poller: asyncio.Task | None = None
        self.followers = Followers()        # background responses followed to their end
        self._stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.paused, self.processes_up = False, 1   # processes_up: accepting on the port (--processes, owner.py)
        self._decision_due = False          # a pass is scheduled for the loop's next turn (`decide_soon`)
        self.unpaused = asyncio.Event()
        self.resumes = Resumes()            # resumable requests in flight, and those evicted until re-sent
        self.weights = WeightVersions()     # the clients' weight versions, pushed to servers as they switch
        self.state.engines.on_place = self._wake
        self.state.engines.on_evict = self.resumes.evicted
        self.state.engines.on_version = lambda worker, version: self.weights.switched(
            cast(httpx.AsyncClient, self.client), self.upstreams[worker].url, version)
        for url in settings.workers:
            self.add_worker(url)
        self.journal = open_sessions_journal(self.state, settings.journal)

    def now(self) -> float:
        return self.clock() - self._t0

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        timeout = httpx.Timeout(self.settings.request_timeout_s, connect=10.0)
        self.transport = RawTransport()
        self.client = httpx.AsyncClient(transport=self.transport, timeout=timeout)
        self.forward_timeout = timeout.as_dict()
        await self.poll_once()
        self._poller = asyncio.create_task(self._poll_forever())
        self.loop = asyncio.get_running_loop()      # where another thread hands the service work

    async def stop(self) -> None:
        self._stopping = True
        tasks = [t for t in (self._poller, *self.followers.tasks()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.client is not None:
            await self.client.aclose()
        if self.journal is not None:
            self.journal.close()

    # -- workers ----------------------------------------------------------------------------------

    def add_worker(self, url: str) -> Upstream:
        up = Upstream(len(self.upstreams), url)
        self.upstreams.append(up)
        self.state.add_worker(router_worker(self.settings, self.described, up.id))
        self.groups_seen.append(OrderedDict())
        return up

    def find(self, url: str) -> Upstream | None:
        return next((u for u in self.upstreams if u.url == url.rstrip("/") and not u.removed), None)

    def set_routable(self, up: Upstream) -> None:
        self.state.workers[up.id].alive = up.routable
        if up.routable:
            self.decide()

    def upstream_failed(self, up: Upstream) -> None:
        """It refused a request's connection: out of rotation until a health poll gets through."""
        up.set_healthy(False, "it refused a connection")
        up.failures = max(up.failures, self.settings.failures_to_down)
        self.set_routable(up)

    async def poll_once(self, spread_s: float = 0.0) -> None:
        """Every server's /health and /metrics, then what their figures change. `spread_s`: the
        servers' polls started evenly over it, the last at its end, not all at once (the router's
        own loop, once an interval): a fleet's replies all parsed at one instant held every request
        behind them (16 ms at 64 servers)."""
        live = [u for u in self.upstreams if not u.removed]
        await asyncio.gather(*(self._poll(up, (i + 1) * spread_s / len(live)) for i, up in enumerate(live)))
        now = self.now()
        self.state.expire(now)
        self.resumes.end_unsent(self.state, now, self.settings.session_ttl_s)
        self._refuse_unfittable(now)
        self.decide(now)

    def _refuse_unfittable(self, now: float) -> None:
        """Capacities change here, once a poll (a server's reported KV, a worker removed), so the
        waiting requests are checked again here: one that no server can hold any more gets the 400 a
        new one gets from `check_fits` at once, instead of a 429 when --hold-timeout passes. One
        pinned to a server (its stored response is there) gets a 503 when that server left
        rotation, and a 400 when its KV cannot hold the request: no other server can take it, and
        held new, it would hold every new session queued behind it."""
        largest = self.largest_kv()
        if not (self.state.hold or self.state.pending):
            return
        refused: list[tuple[Session, BaseException]] = [
            (s, TooLong(s.traj.context, largest)) for s in (self.state.refuse_longer_than(largest, now) if largest else [])]
        for s in self.state.refuse_pinned_to_dead(now):
            self.metrics.rejections.labels("no_worker").inc()
            refused.append((s, Rejected(503, "no_worker", "previous_response_id: the server that holds it left "
                                        "rotation", self.retry_after(), "previous_response_id")))
        for s in self.state.refuse_pinned_too_long(now):        # counted where it is answered (`app.serve_routed`)
            refused.append((s, self._pinned_too_long(s)))
        for session, exc in refused:
            fut = self.waiters.pop(session.traj.id, None)
            if fut is not None and not fut.done():
                fut.set_exception(exc)

    def _pinned_too_long(self, session: Session) -> ApiError:
        kv = self.state.workers[cast(int, session.traj.pin)].kv_capacity
        return ApiError(400, f"input: about {session.traj.context} tokens in all, more than the server that "
                             f"holds previous_response_id can hold ({kv - 1} at most)", "input")

    async def _poll_forever(self) -> None:
        interval = self.settings.metrics_interval_s
        while True:      # each server looked at once an interval (and with none, the loop still waits)
            await asyncio.gather(asyncio.sleep(interval), self.poll_once(spread_s=interval))

    async def _poll(self, up: Upstream, after_s: float = 0.0) -> None:
        if after_s > 0:
            await asyncio.sleep(after_s)
        figures = await poll(cast(httpx.AsyncClient, self.client), up,
                             max(1.0, 2 * self.settings.metrics_interval_s), self.settings.failures_to_down)
        if figures is not None:
            self.state.set_figures(up.id, figures)
        self.state.workers[up.id].alive = up.routable

    # -- requests ---------------------------------------------------------------------------------

    def largest_kv(self) -> int:
        """The largest KV capacity, in tokens, of the servers not removed (0 when none is left)."""
        return max((w.kv_capacity for u, w in zip(self.upstreams, self.state.workers) if not u.removed), default=0)

    def check_fits(self, prompt_len: int, field: str) -> None:
        """A prompt no server's KV can hold would block the hold queue's head until it timed out:
        refuse it now (as the simulator does at set-up, `check_fits_somewhere`)."""
        largest = self.largest_kv()
        if largest and max(1, prompt_len) >= largest:
            raise too_long(prompt_len, field, largest)

    async def acquire(self, key: str | None, cls: str, prompt_len: int, group: int, route_key: str | None = None,
                      field: str = "prompt", pin: int | None = None, held: int = 0, max_new_tokens: int | None = None,
                      resumable: bool = False, prefix: tuple[int, ...] = ()) -> Session:
        """Admit (a new session) or place (a continuation) one request; waits in HOLD if it must.
        `field` names the prompt in the 400 of a request that stops fitting while it waits. `pin`: the
        server holding the stored response the request continues; it goes there alone, and its prompt
        is the new part only, added to the context the server holds: a session's continuation's own
        context (the earlier turns, counted as they went), else `held` (what the server holds for the
        stored response, `ResponseOwners.context`). `max_new_tokens`: MISA-T's bound on a new
        session's first reply before it measured any."""
        session = self.enter(key, cls, prompt_len, group, route_key, pin, held, max_new_tokens, resumable, prefix)
        await self.wait_placed(session, field)
        return session

    def enter(self, key: str | None, cls: str, prompt_len: int, group: int, route_key: str | None = None,
              pin: int | None = None, held: int = 0, max_new_tokens: int | None = None,
              resumable: bool = False, prefix: tuple[int, ...] = ()) -> Session:
        """`acquire` up to its wait: the session, placed already or held (a pass due: `decide_now`)."""
        now = self.now()
        if not any(w.alive for w in self.state.workers):
            self.metrics.rejections.labels("no_worker").inc()
            raise Rejected(503, "no_worker", "no server is up; retry later", self.retry_after())
        session = self.state.session(key)
        if session is not None and session.traj.state is State.TOOL:
            self.state.continuation(session, prompt_len + (session.traj.context if pin is not None else 0), now, pin)
            kind = "continuation"
        else:
            if session is not None:   # its last request is still in flight: this one is a reply of its own
                key = None
            session = self.state.new_session(key, cls, prompt_len + held, group, now, route_key, pin, max_new_tokens,
                                             resumable, prefix)
            kind = "new"
        session.traj.resumable = resumable
        self.metrics.requests_of(session.traj.workload_class, kind).inc()
        if pin is not None and session.traj.context >= self.state.workers[pin].kv_capacity:
            if kind == "new":                   # its new input fit; in all, it does not
                self.state.withdraw(session)
            else:
                self.state.drop_pending(session, now)
            raise self._pinned_too_long(session)
        if len(self.state.hold) <= self.settings.hold_max:
            self.decide_soon()
        else:                           # the queue's bound is judged after the pass that may admit from it
            self.decide(now)
        if session.traj.state is State.FRESH and len(self.state.hold) > self.settings.hold_max:
            self.state.withdraw(session)
            self.metrics.rejections.labels("hold_full").inc()
            raise Rejected(429, "hold_full", "the admission queue is full; retry later", self.retry_after())
        return session

    async def resume(self, session: Session, field: str) -> bool:
        """An evicted request's re-send: it runs where its trajectory is placed (at once if placed
        already). False when its session ended meanwhile (a new request, then)."""
        if session.traj.state is State.PENDING:
            self.decide()
            await self.wait_placed(session, field)
        return session.traj.state is State.RESIDENT

    def progress(self, session: Session, tokens: int) -> None:
        session.traj.tokens += tokens      # a resumable request's tokens as they stream: its context

    async def wait_placed(self, session: Session, field: str) -> None:
        """A held request's wait for its placement (none if placed already), bounded by --hold-timeout."""
        traj, loop = session.traj, asyncio.get_running_loop()
        if traj.state is State.RESIDENT:
            return
        fut = self.waiters[traj.id] = loop.create_future()
        timer = loop.call_later(self.settings.hold_timeout_s, expire, fut)   # (not wait_for: a task a wait)
        try:
            await fut
        except TooLong as long:           # withdrawn already (`_refuse_unfittable`)
            raise too_long(long.tokens, field, long.largest) from None
        except BaseException as exc:      # the wait passed its bound, or the client left
            self.waiters.pop(traj.id, None)
            timed_out = isinstance(exc, TimeoutError)
            if timed_out and traj.state is State.RESIDENT:
                return                     # placed just as the bound passed: go ahead
            held = traj.state is State.FRESH
            self.abandon(session)
            if not timed_out:
                raise
            if held:
                self.metrics.rejections.labels("hold_timeout").inc()
                raise Rejected(429, "hold_timeout", "waited too long for admission; retry later",
                               self.retry_after()) from None
            raise Rejected(503, "no_worker", "no server can take this request now") from None
        finally:
            timer.cancel()

    def abandon(self, session: Session) -> None:
        """A request that will not go (its client left, its wait ran out): released if placed, else withdrawn."""
        if session.traj.state is State.RESIDENT:
            self.release(session, 0, last=True)
        elif session.traj.state is State.FRESH:
            self.state.withdraw(session)
        elif session.traj.state is State.PENDING:
            self.state.drop_pending(session, self.now())

    def owner(self, response_id: str, field: str, generate: bool = False) -> Upstream:
        """The server that made (and stores) a response; a 404 naming `field` when the router knows
        none: not made through it (or not stored), forgotten (the map is bounded), or its server
        removed. `generate` (a new turn on it): a 503 when that server takes no new requests now."""
        worker = self.owners.get(response_id)
        if worker is None or self.upstreams[worker].removed:
            raise ApiError(404, f"{field}: no stored response {response_id!r} on this router's servers "
                                "(not made through it, not stored, forgotten, or its server was removed)", field)
        up = self.upstreams[worker]
        if generate and not up.routable:
            self.metrics.rejections.labels("no_worker").inc()
            raise Rejected(503, "no_worker", f"{field}: the server that holds {response_id!r} takes no new "
                                             "requests now (down or draining)", self.retry_after(), field)
        return up

    def retry_after(self) -> int:
        """Seconds a rejected client should wait: a quarter of the hold bound, at least one."""
        return max(1, round(self.settings.hold_timeout_s / 4))

    def decide(self, now: float | None = None, exclude: frozenset[int] = frozenset()) -> None:
        """One decision pass (none while paused for a weight update); the requests it placed go."""
        if self.paused:
            return
        now = self.now() if now is None else now
        for action in self.state.decide(now, exclude):
            for step in action.actions if isinstance(action, Batch) else (action,):
                if isinstance(step, (Admit, Place)):
                    self._placed(self.state.placed(step.traj), step, now)

    def decide_soon(self) -> None:
        """One decision pass at the loop's next turn for every admission and release of this one (a
        pass each was a third of the router's CPU under load); outside a running loop, one now."""
        if self._decision_due:
            return
        try:
            asyncio.get_running_loop().call_soon(self.decide_now)
            self._decision_due = True
        except RuntimeError:        # outside a running loop: the pass now
            self.decide()

    def decide_now(self) -> None:
        """The pass `decide_soon` made due, now (none if none is due)."""
        if self._decision_due:
            self._decision_due = False
            self.decide()

    def _placed(self, session: Session, action: Admit | Place, now: float) -> None:
        traj = session.traj
        seen = self.groups_seen[action.worker]
        if isinstance(action, Admit):
            self.metrics.admissions_of(traj.workload_class).inc()
            self.metrics.hold_wait.observe(max(0.0, now - session.arrived_at))
            if traj.group in seen:
                self.metrics.prefix_hits_of("group").inc()
        elif traj.kv_home == action.worker:
            self.metrics.prefix_hits_of("sticky").inc()
        seen[traj.group] = None
        seen.move_to_end(traj.group)
        if len(seen) > GROUPS_PER_WORKER:
            seen.popitem(last=False)

    def _wake(self, traj: Trajectory, worker: int) -> None:
        """The engines' hook: a placement (an admission, a move, a resume) lets its request go."""
        fut = self.waiters.pop(traj.id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def reroute(self, session: Session, failed: int) -> bool:
        """Retry a request that failed before its first token, once, on another server; counted as
        a retry only when one took it (a pinned request, or a pool with no other server up, has none)."""
        now = self.now()
        self.state.bounce(session, now)
        self.decide(now, exclude=frozenset({failed}))
        if session.traj.state is State.RESIDENT:
            self.metrics.retries.inc()
            return True
        self.state.drop_pending(session, now)
        return False

    def release(self, session: Session, generated: int, last: bool) -> None:
        """A request's reply ended (or failed): park its session for the next turn, or finish it."""
        traj = session.traj
        if traj.state is not State.RESIDENT:
            return
        now = self.now()
        if last or session.key is None:
            self.state.finished(session, generated, now)
        else:
            self.state.turn_ended(session, generated, now)
        self.decide_soon()

    def follow_background(self, session: Session, response_id: str, worker: int, last: bool) -> None:
        """Keep `session` placed until the background response it started ends (`background.py`)."""
        if self._stopping:
            self.release(session, 0, last=last)
        else:
            self.followers.start(session.traj.id, response_id, lambda wake: follow(
                cast(httpx.AsyncClient, self.client), self.upstreams[worker], self.settings, self.owners,
                response_id, session.traj.context, lambda generated: self.release(session, generated, last=last), wake))

    async def settle_background(self, key: str | None, previous_response_id: str | None) -> None:
        """A turn may continue a background response the router still follows: see it end first."""
        if not self.followers:          # every request asks: nothing to look up in the usual case
            return
        session = self.state.session(key) if key is not None else None
        await self.followers.settle(session.traj.id if session else None, previous_response_id,
                                    max(1.0, 2 * self.settings.metrics_interval_s) + 0.5)

    def end_session(self, key: str) -> bool:
        """The client says a parked session is over (DELETE /v1/sessions/{key})."""
        session = self.state.session(key)
        if session is None or session.traj.state is not State.TOOL:
            return False
        self.state.end_parked(session)
        self.decide()
        return True
