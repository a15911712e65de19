"""The live router's state in the controller's terms, so admission/'s decision code runs unchanged.

A live request is one of the events the simulator's controller sees: a new session arrives FRESH
and waits in the hold queue; a Place or Admit sends its turn to a worker; the turn's reply ends and
the session parks in a tool wait (TOOL, still homed on its worker, counted in the worker's
sessions); its next request arrives (PENDING, placed again); it finishes (DONE) when a request says
so, when its reply was its only turn, or when it stays parked past the session TTL. The policy (e.g.
`Admitted(MisaT, CacheAware)`) decides on a `PoolView` built from this state, and its actions are
applied with the controller's bookkeeping. Nothing here does I/O: the app feeds events and engine
figures in and reads actions out, so a recorded event sequence replays exactly (tests do).
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cadencerl.admission.gated import placement_of
from cadencerl.core.actions import Action, ActionError, Admit, Place
from cadencerl.core.credits import CreditModel
from cadencerl.core.fresh import FreshQueue
from cadencerl.core.pending import PendingSet
from cadencerl.core.policy import Policy
from cadencerl.core.residency import attach, back_from_tool, detach, live_worker, retire, start, to_tool
from cadencerl.core.spec import HiddenLength, TrajectorySpec
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.engine.server_metrics import EngineMetrics

UNBOUNDED = 1 << 62        # a live router has no staleness budget: the trainer paces its own requests
_SEALED = object()         # nobody holds this key: a router never knows how long a reply will be
OUTSIDE = -1               # the trajectory id of every request outside sessions: it has no history to keep


class HoldQueue(FreshQueue):
    """The HOLD queue: new sessions in arrival order, per class, that can grow while the router runs."""

    def __init__(self) -> None:
        super().__init__([])


@dataclass
class Session:
    key: str | None
    traj: Trajectory
    arrived_at: float = 0.0
    parked_at: float = 0.0


@dataclass
class LiveState:
    """Workers, sessions, hold queue and pending set of a live router, driven by events."""

    policy: Policy
    workers: list[Worker]
    target_mix: dict[str, float]
    session_ttl_s: float = 60.0
    max_sessions: int = 100_000
    hold: HoldQueue = field(default_factory=HoldQueue)
    pending: PendingSet = field(default_factory=PendingSet)
    live: dict[int, Session] = field(default_factory=dict)          # traj id -> unfinished session
    by_key: dict[str, Session] = field(default_factory=dict)        # unfinished sessions with a key
    parked: OrderedDict = field(default_factory=OrderedDict)        # traj id -> Session, oldest first
    active_by_class: dict[str, int] = field(default_factory=dict)
    tool_waiting: dict[int, int] = field(default_factory=dict)
    completed: Counter = field(default_factory=Counter)            # finished sessions per class
    recent: deque = field(default_factory=lambda: deque(maxlen=256))  # classes of the latest finishes
    batch_size: int = 1024          # the trainer's batch: MISA-T keeps each batch-sized cohort on the mix
    credits: CreditModel = field(init=False)
    _ids: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.credits = CreditModel(self.batch_size, UNBOUNDED, UNBOUNDED)

    # -- events -----------------------------------------------------------------------------------

    def new_session(self, key: str | None, cls: str, prompt_len: int, group: int, now: float = 0.0,
                    route_key: str | None = None, pin: int | None = None,
                    max_new_tokens: int | None = None) -> Session:
        """A session's first request: FRESH, held until an Admit names its worker (`pin`, if given:
        the worker that holds what the request continues, e.g. a stored response)."""
        spec = TrajectorySpec(id=next(self._ids), group=group, prompt_len=max(1, prompt_len),
                              response=HiddenLength(0, _SEALED), workload_class=cls, route_key=route_key,
                              max_new_tokens=max_new_tokens)
        session = Session(key, Trajectory(spec, pin=pin), arrived_at=now)
        self.hold.push(session.traj)
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
        back_from_tool(traj, max(0, prompt_len - traj.context), self.tool_waiting, self.pending, now)

    def turn_ended(self, session: Session, generated: int, now: float) -> None:
        """A reply is complete and more turns may follow: park the session on its worker."""
        traj = session.traj
        to_tool(traj, self.workers, self.tool_waiting, now)
        traj.tokens += generated
        traj.pin = None
        session.parked_at = now
        self.parked[traj.id] = session
        self._bound_parked()

    def finished(self, session: Session, generated: int, now: float) -> None:
        """The session's last reply is complete."""
        traj = session.traj
        detach(traj, self.workers, now)
        traj.tokens += generated
        self._done(session, now)

    def end_parked(self, session: Session) -> None:
        """A parked session ends (its TTL passed, or the client said so): it finished at its last reply."""
        traj = session.traj
        del self.parked[traj.id]
        self.tool_waiting[traj.version] -= 1
        self._done(session, session.parked_at)

    def withdraw(self, session: Session) -> None:
        """A held session gives up (its wait passed the bound, or its client left): never admitted."""
        self.hold.take(session.traj)
        session.traj.state = State.DONE
        self._forget(session)

    def drop_pending(self, session: Session, now: float) -> None:
        """A placed session's request could not be placed again (no server left): it ends here."""
        self.pending.remove(session.traj)
        self._done(session, now)

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
        traj = session.traj
        detach(traj, self.workers, now)
        traj.state = State.PENDING
        traj.departed_at = now
        self.pending.add(traj)

    def expire(self, now: float) -> int:
        """End the sessions parked longer than the TTL; how many ended."""
        n = 0
        while self.parked:
            session = next(iter(self.parked.values()))
            if now - session.parked_at < self.session_ttl_s:
                break
            self.end_parked(session)
            n += 1
        return n

    def set_figures(self, worker: int, figures: EngineMetrics) -> None:
        """One scrape of the server's /metrics, in the controller's units (KV in tokens)."""
        w = self.workers[worker]
        if figures.kv_capacity_tokens:
            w.kv_capacity = figures.kv_capacity_tokens
        w.engine_kv = int(figures.kv_cache_usage * w.kv_capacity)
        w.num_waiting, w.preemptions = figures.num_requests_waiting, figures.num_preemptions_total

    # -- decisions --------------------------------------------------------------------------------

    def view(self, now: float) -> PoolView:
        """What the policy sees, with its admission gate handed over as the controller hands it."""
        return PoolView(now=now, trainer_version=0, next_batch=0, workers=self.workers, pending=self.pending,
                        fresh=self.hold, credits=self.credits, trainer_busy=False,
                        in_flight=sum(self.active_by_class.values()), tool_waiting=self.tool_waiting,
                        gate=self.policy.gate, active_by_class=self.active_by_class)

    def decide(self, now: float, exclude: frozenset[int] = frozenset()) -> list[Action]:
        """One pass of the policy over the live state; its Admit and Place actions, applied.

        `exclude` hides workers for this pass only (a request that just failed on one)."""
        hidden = [w for w in self.workers if w.id in exclude and w.alive]
        if len(hidden) == sum(w.alive for w in self.workers):
            return []                     # no server to place on: nothing to decide
        for w in hidden:
            w.alive = False
        try:
            actions = []
            for action in self.policy.decide(self.view(now)):
                self._apply(action, now)
                actions.append(action)
            return actions
        finally:
            for w in hidden:
                w.alive = True

    def _apply(self, action: Action, now: float) -> None:
        if isinstance(action, Admit):
            traj = self._traj_fresh(action.traj)
            self.hold.take(traj)
            start(traj, 0, self.active_by_class, now)
            attach(traj, live_worker(self.workers, action.worker), self.workers, now)
        elif isinstance(action, Place):
            traj = next((t for t in self.pending if t.id == action.traj), None)
            if traj is None:
                raise ActionError(f"trajectory {action.traj} is not pending")
            self.pending.remove(traj)
            attach(traj, live_worker(self.workers, action.worker), self.workers, now)
        else:
            raise ActionError(f"a live router cannot apply {action!r} (use a router policy)")

    def route_outside(self, group: int, prompt_len: int, route_key: str, now: float,
                      exclude: frozenset[int] = frozenset()) -> int | None:
        """The worker for a request that is no session (an embedding, a rerank): the placement
        policy's own rule (`route`, as for an admitted session) over the live workers, with no
        admission, no residency and no place in the class mix; None when no live worker is left.
        Call it after a `decide` pass (cache-aware sets up its tree there)."""
        ok = [w for w in self.workers if w.alive and w.id not in exclude]
        if not ok:
            return None
        placement = placement_of(self.policy)
        spec = TrajectorySpec(id=OUTSIDE, group=group, prompt_len=max(1, prompt_len),
                              response=HiddenLength(0, _SEALED), workload_class="", route_key=route_key)
        return placement.route(self.view(now), Trajectory(spec), ok).id

    # -- bookkeeping, as the controller keeps it ---------------------------------------------------

    def _traj_fresh(self, tid: int) -> Trajectory:
        for cls in self.hold.classes():
            head = self.hold.peek({cls})
            if head is not None and head.id == tid:
                return head
        raise ActionError(f"trajectory {tid} is not at the head of the hold queue")

    def _done(self, session: Session, when: float) -> None:
        retire(session.traj, self.workers, self.active_by_class, when)
        cls = session.traj.workload_class
        self.completed[cls] += 1
        self.recent.append(cls)
        self._forget(session)

    def _forget(self, session: Session) -> None:
        self.live.pop(session.traj.id, None)
        if session.key is not None and self.by_key.get(session.key) is session:
            del self.by_key[session.key]

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
