"""A live router's sessions, on the simulator's controller: admission/'s and policies/' decision
code runs unchanged, and every action it proposes is checked by the controller as in a simulation.

A live request is one of the events the controller sees: a new session arrives FRESH and waits in
the hold queue; an Admit or Place sends its turn to a worker; the reply ends and the session waits
on its client (TOOL, still homed on its worker); its next request arrives (PENDING, placed again);
it ends when a request says so, when its reply was its only turn, or when it waits past the session
TTL. This module keeps what only a router has (session keys, the waiting order, the finished
classes); nothing here does I/O, so a recorded event sequence replays exactly (tests do).
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cadencerl.admission.gated import placement_of
from cadencerl.core.actions import Action, ActionError
from cadencerl.core.backend import EngineStats
from cadencerl.core.credits import CreditModel
from cadencerl.core.fresh import FreshQueue
from cadencerl.core.journal import JournalSink, NullJournal
from cadencerl.core.live import LiveController
from cadencerl.core.pending import PendingSet
from cadencerl.core.policy import Policy
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.engine.server_metrics import EngineMetrics
from cadencerl.router.engines import RouterEngines
from cadencerl.router.sessions_journal import parked_body

_SEALED = object()         # nobody holds this key: a router never knows how long a reply will be
OUTSIDE = -1               # the trajectory id of every request outside sessions: it has no history to keep


@dataclass
class Session:
    key: str | None
    traj: Trajectory
    arrived_at: float = 0.0
    parked_at: float = 0.0


@dataclass
class LiveState:
    """The router's sessions over a `LiveController`: session keys, the waiting order, finished classes."""

    policy: Policy
    workers: list[Worker]
    target_mix: dict[str, float]
    session_ttl_s: float = 60.0
    max_sessions: int = 100_000
    live: dict[int, Session] = field(default_factory=dict)          # traj id -> unfinished session
    by_key: dict[str, Session] = field(default_factory=dict)        # unfinished sessions with a key
    parked: OrderedDict = field(default_factory=OrderedDict)        # traj id -> Session, oldest first
    completed: Counter = field(default_factory=Counter)            # finished sessions per class
    recent: deque = field(default_factory=lambda: deque(maxlen=256))  # classes of the latest finishes
    batch_size: int = 1024          # the trainer's batch: MISA-T keeps each batch-sized cohort on the mix
    eta: int | None = None          # the staleness budget, None where the clients keep their own
    contended_ttl_s: float = 15.0   # a parked session's bound while new sessions wait in the hold queue
    journal: JournalSink = field(default_factory=NullJournal)   # the sessions, for a restart (sessions_journal)
    controller: LiveController = field(init=False)
    _ids: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        given, self.workers = self.workers, []      # the controller's list, which the engines read too
        self.engines = RouterEngines(self.workers)
        self.controller = LiveController(self.policy, self.engines, self.workers, batch_size=self.batch_size,
                                         eta=self.eta)
        for w in given:
            self.add_worker(w)

    def add_worker(self, worker: Worker) -> None:
        self.controller.add_worker(worker)

    @property
    def hold(self) -> FreshQueue:
        """The HOLD queue: new sessions in arrival order, per class (the controller's fresh queue)."""
        return self.controller.fresh

    @property
    def pending(self) -> PendingSet:
        return self.controller.pending

    @property
    def active_by_class(self) -> dict[str, int]:
        return self.controller.active_by_class

    @property
    def tool_waiting(self) -> dict[int, int]:
        return self.controller.tool_waiting

    @property
    def credits(self) -> CreditModel:
        return self.controller.credits

    # -- events -----------------------------------------------------------------------------------

    def new_session(self, key: str | None, cls: str, prompt_len: int, group: int, now: float = 0.0,
                    route_key: str | None = None, pin: int | None = None,
                    max_new_tokens: int | None = None, resumable: bool = False,
                    prefix: tuple[int, ...] = ()) -> Session:
        """A session's first request: FRESH, held until an Admit names its worker (`pin`, if given:
        the worker that holds what the request continues, e.g. a stored response). `resumable`: its
        client resumes an evicted request (`resumable.py`); no other request is ever evicted."""
        spec = TrajectorySpec(id=next(self._ids), group=group, prompt_len=max(1, prompt_len),
                              response=HiddenLength(0, _SEALED), workload_class=cls, route_key=route_key,
                              max_new_tokens=max_new_tokens, prefix=prefix)
        session = Session(key, Trajectory(spec, pin=pin, resumable=resumable), arrived_at=now)
        self.controller.submit(session.traj)
        self.live[spec.id] = session
        if key is not None:
            self.by_key[key] = session
        return session

    def session(self, key: str | None) -> Session | None:
        return self.by_key.get(key) if key is not None else None

    def continuation(self, session: Session, prompt_len: int, now: float, pin: int | None = None) -> None:
        """The next turn of a parked session: its new tokens are the tool's observation (`pin`: as
        for `new_session`, for this turn)."""
        traj = session.traj
        if traj.state is not State.TOOL:
            raise ActionError(f"session {session.key!r} has a request in flight")
        del self.parked[traj.id]
        traj.pin = pin
        self.controller.next_turn(traj, max(0, prompt_len - traj.context), now)

    def turn_ended(self, session: Session, generated: int, now: float) -> None:
        """A reply is complete and more turns may follow: park the session on its worker."""
        traj = session.traj
        self.controller.turn_ended(traj, generated, now)
        traj.pin = None
        session.parked_at = now
        self.parked[traj.id] = session
        if session.key is not None:
            self.journal.log("session", **parked_body(session))
            self.journal.flush(force=True)
        self._bound_parked()

    def finished(self, session: Session, generated: int, now: float) -> None:
        """The session's last reply is complete."""
        self.controller.finished(session.traj, generated, now)
        self._done(session)

    def end_parked(self, session: Session) -> None:
        """A parked session ends (its TTL passed, or the client said so): it finished at its last reply."""
        del self.parked[session.traj.id]
        self.controller.end_waiting(session.traj, session.parked_at)
        self._done(session)

    def withdraw(self, session: Session) -> None:
        """A held session gives up (its wait passed the bound, or its client left): never admitted."""
        self.controller.withdraw(session.traj)
        self._forget(session)

    def drop_pending(self, session: Session, now: float) -> None:
        """A placed session's request could not be placed again (no server left): it ends here."""
        self.controller.drop(session.traj, now)
        self._done(session)

    def refuse_longer_than(self, limit: int, now: float) -> list[Session]:
        """The waiting sessions (held for admission, or a next turn waiting for a server) whose
        context is `limit` tokens or more, withdrawn as the bound would withdraw them: no server
        can take them any more (one reported a smaller KV), so no decision would ever place them."""
        return self.refuse_waiting(lambda t: t.context >= limit, now)

    def refuse_pinned_to_dead(self, now: float) -> list[Session]:
        """The waiting sessions pinned to a worker that left rotation, withdrawn likewise: a pinned
        head of the hold queue would otherwise hold every session behind it until the wait bound."""
        return self.refuse_waiting(lambda t: t.pin is not None and not self.workers[t.pin].alive, now)

    def refuse_pinned_too_long(self, now: float) -> list[Session]:
        """The waiting sessions pinned to a worker whose KV cannot hold their context, withdrawn
        likewise: no decision would place them (the routers place a pinned one on its worker only)."""
        return self.refuse_waiting(lambda t: t.pin is not None and t.context >= self.workers[t.pin].kv_capacity, now)

    def refuse_waiting(self, test: Callable[[Trajectory], bool], now: float) -> list[Session]:
        """Withdraw the held and pending sessions whose trajectory passes `test`; those withdrawn."""
        held = [self.live[t.id] for t in self.hold.in_order() if test(t)]
        pending = [self.live[t.id] for t in self.pending if test(t)]
        for session in held:
            self.withdraw(session)
        for session in pending:
            self.drop_pending(session, now)
        return held + pending

    def placed(self, tid: int) -> Session:
        return self.live[tid]

    def bounce(self, session: Session, now: float) -> None:
        """A placed request failed before its first token: back to pending, to be placed again."""
        self.controller.bounce(session.traj, now)

    def expire(self, now: float) -> int:
        """End the sessions parked longer than the TTL (the shorter contended one while new sessions
        wait: a client that never sends a next turn must not keep new work out); how many ended."""
        n = 0
        ttl = min(self.session_ttl_s, self.contended_ttl_s) if len(self.hold) else self.session_ttl_s
        while self.parked:
            session = next(iter(self.parked.values()))
            if now - session.parked_at < ttl:
                break
            self.end_parked(session)
            n += 1
        return n

    def set_figures(self, worker: int, figures: EngineMetrics) -> None:
        """One scrape of the server's /metrics, in the controller's units (KV in tokens)."""
        w = self.workers[worker]
        if figures.kv_capacity_tokens:
            w.kv_capacity = figures.kv_capacity_tokens
        engine = EngineStats(int(figures.kv_cache_usage * w.kv_capacity), figures.num_requests_running,
                             figures.num_requests_waiting, figures.num_preemptions_total)
        self.engines.figures[worker] = engine
        w.engine_kv, w.num_waiting, w.preemptions = engine.kv_tokens, engine.waiting, engine.preemptions

    # -- decisions --------------------------------------------------------------------------------

    def view(self, now: float) -> PoolView:
        """What the policy sees, with its admission gate handed over, as the controller builds it."""
        return self.controller.view(now)

    def decide(self, now: float, exclude: frozenset[int] = frozenset()) -> list[Action]:
        """One pass of the policy over the live state; its actions, checked and applied by the
        controller. `exclude` hides workers for this pass only (a request that just failed on one)."""
        return self.controller.decide(now, exclude)

    def route_outside(self, group: int, prompt_len: int, route_key: str, now: float,
                      exclude: frozenset[int] = frozenset()) -> int | None:
        """The worker for a request that is no session (an embedding, a rerank): the placement
        policy's own rule (`route`, as for an admitted session) over the live workers, with no
        admission, no residency and no place in the class mix; None when no live worker is left.
        Call it after a `decide` pass (cache-aware sets up its tree there)."""
        ok = [w for w in self.workers if w.alive and w.id not in exclude]
        if not ok:
            return None
        placement: Any = placement_of(self.policy)     # a placement policy with its own rule, `route`
        spec = TrajectorySpec(id=OUTSIDE, group=group, prompt_len=max(1, prompt_len),
                              response=HiddenLength(0, _SEALED), workload_class="", route_key=route_key)
        return placement.route(self.view(now), Trajectory(spec), ok).id

    # -- bookkeeping, as the controller keeps it ---------------------------------------------------

    def _done(self, session: Session) -> None:
        cls = session.traj.workload_class
        self.completed[cls] += 1
        self.recent.append(cls)
        self.journal.log("class-finished", cls=cls)
        self._forget(session)

    def _forget(self, session: Session) -> None:
        self.live.pop(session.traj.id, None)
        if session.key is not None and self.by_key.get(session.key) is session:
            del self.by_key[session.key]
            self.journal.log("session-gone", key=session.key)
        self.journal.flush()

    def _bound_parked(self) -> None:
        while len(self.parked) > self.max_sessions:
            self.end_parked(next(iter(self.parked.values())))

    # -- what the metrics show --------------------------------------------------------------------

    def mix_dtv(self, recent: bool = False) -> float:
        """Total-variation distance between the classes of finished sessions and the target mix."""
        counts = Counter(self.recent) if recent else self.completed
        total = sum(counts.values())
        if not total:
            return 0.0
        classes = set(counts) | set(self.target_mix)
        return 0.5 * sum(abs(counts.get(c, 0) / total - self.target_mix.get(c, 0.0)) for c in classes)
