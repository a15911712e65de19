"""The controller for live traffic (the router): trajectories arrive and leave as clients send them,
the clients' trainer publishes versions, and a decision runs on each event instead of each tick.

It is the simulator's `Controller`, so every action a policy proposes is checked the same way; what
differs is who brings the events (a router's requests, not a backend's clock) and the trainer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mypy_extensions import mypyc_attr

from cadencerl.config import ControllerSpec
from cadencerl.core.actions import Action, ActionError, Interrupt
from cadencerl.core.backend import Backend
from cadencerl.core.controller import Controller
from cadencerl.core.credits import CreditModel
from cadencerl.core.policy import Policy
from cadencerl.core.residency import back_from_tool, detach, retire, to_tool
from cadencerl.core.trajectory import State, Trajectory, admitted_version
from cadencerl.core.worker import Worker

UNBOUNDED = 1 << 62     # no staleness budget (eta None): the clients pace their own requests


@dataclass
class ClientTrainer:
    """The trainer of the router's clients, which trains elsewhere. A completion waits to be trained
    on; each version the clients publish (AReaL's weight update) says one batch was: the oldest
    `batch_size` completions are consumed then, as AReaL's staleness manager counts them."""

    credits: CreditModel
    version: int = 0
    busy_until: None = None
    consumed: int = 0
    ready: Counter = field(default_factory=Counter)       # completed, not yet trained on: tag -> count
    staleness: Counter = field(default_factory=Counter)   # versions behind at completion -> trajectories
    publish_times: list[float] = field(default_factory=list)

    @property
    def next_batch(self) -> int:
        return self.version

    def finished(self, traj: Trajectory) -> None:
        tag = traj.tag
        assert tag is not None, f"trajectory {traj.id} finished but was never admitted"
        self.staleness[self.version - tag] += 1
        self.ready[tag] += 1

    def publish(self, now: float) -> None:
        """A batch was trained: the oldest completions are consumed, and the next version exists."""
        for _ in range(min(self.credits.batch_size, self.ready.total())):
            tag = min(self.ready)
            self.ready[tag] -= 1
            if not self.ready[tag]:
                del self.ready[tag]
            self.credits.consumed(tag)
            self.consumed += 1
        self.version += 1
        self.publish_times.append(now)


@mypyc_attr(allow_interpreted_subclasses=True)
class LiveController(Controller):
    """`Controller` driven by a router: its entry points are the events a client's requests make."""

    def __init__(self, policy: Policy, backend: Backend, workers: list[Worker], *, batch_size: int = 1024,
                 eta: int | None = None, tick_s: float = 0.5) -> None:
        """`eta`: the staleness budget (None: the clients keep their own, every admission is allowed)."""
        params = ControllerSpec(tick_s=tick_s) if eta is None else ControllerSpec(tick_s=tick_s, eta=eta)
        super().__init__(policy, backend, workers, [], batch_size=batch_size, params=params,
                         train_time_s=0.0, sample_every_s=float("inf"))
        self.credits = CreditModel(batch_size, UNBOUNDED if eta is None else eta, UNBOUNDED)
        # the clients' trainer in the simulated one's place: it has every member the controller reads
        self.trainer = ClientTrainer(self.credits)    # type: ignore[assignment]
        self.applied: list[Action] = []     # the actions of the decision pass under way

    # -- what the clients bring ------------------------------------------------------------------

    def add_worker(self, worker: Worker) -> None:
        if worker.id != len(self.workers):
            raise ValueError(f"worker {worker.id} must be number {len(self.workers)}")
        self.workers.append(worker)

    def submit(self, traj: Trajectory) -> None:
        """A new session's first request: FRESH, held until an admission names its worker."""
        self.trajectories[traj.id] = traj
        self.fresh.push(traj)

    def withdraw(self, traj: Trajectory) -> None:
        """A held session gives up before its admission (its wait passed the bound, its client left)."""
        self.fresh.take(traj)
        traj.state = State.DONE
        del self.trajectories[traj.id]

    def turn_ended(self, traj: Trajectory, generated: int, now: float) -> None:
        """A reply is complete and more turns may follow: the session waits on its client (TOOL)."""
        to_tool(traj, self.workers, self.tool_waiting, now)
        traj.tokens += generated

    def next_turn(self, traj: Trajectory, new_tokens: int, now: float) -> None:
        """The next request of a waiting session: its new tokens join the context; it waits to be placed."""
        if traj.state is not State.TOOL:
            raise ActionError(f"trajectory {traj.id} has a request in flight")
        back_from_tool(traj, new_tokens, self.tool_waiting, self.pending, now)

    def finished(self, traj: Trajectory, generated: int, now: float) -> None:
        """The session's last reply is complete: its sample is the client's."""
        if traj.state is State.PENDING:     # evicted as its last token came: it finished all the same
            self.pending.remove(traj)
        else:
            detach(traj, self.workers, now)
        traj.tokens += generated
        self._close(traj, now, sample=True)

    def end_waiting(self, traj: Trajectory, when: float) -> None:
        """A session waiting on its client ends (its time to live passed, or the client said so): it
        finished at its last reply."""
        self.tool_waiting[admitted_version(traj)] -= 1
        self._close(traj, when, sample=True)

    def bounce(self, traj: Trajectory, now: float) -> None:
        """A placed request failed before its first token: back to the pending set, to be placed again."""
        detach(traj, self.workers, now)
        traj.state = State.PENDING
        traj.departed_at = now
        self.pending.add(traj)

    def drop(self, traj: Trajectory, now: float) -> None:
        """A pending request cannot be placed again (no server left for it): its session ends here."""
        self.pending.remove(traj)
        self._close(traj, now, sample=False)

    def publish(self, now: float) -> int:
        """The clients pushed new weights: the next version exists. Returns it."""
        self.trainer.publish(now)
        return self.trainer.version

    def switch_all(self, now: float) -> None:
        """Every live worker takes the newest version at once, its requests resumed there on the new
        weights: the version switch of a client that tags tokens with its own version (AReaL)."""
        for w in self.workers:
            if w.alive and w.version < self.trainer.version:
                self._interrupt(Interrupt(w.id, self.trainer.version), now)

    # -- decisions -------------------------------------------------------------------------------

    def decide(self, now: float, exclude: frozenset[int] = frozenset()) -> list[Action]:
        """One pass of the policy, with the workers in `exclude` hidden for it; the actions applied."""
        hidden = [w for w in self.workers if w.id in exclude and w.alive]
        if len(hidden) == sum(w.alive for w in self.workers):
            return []                     # no server to place on: nothing to decide
        for w in hidden:
            w.alive = False
        self.applied = []
        try:
            self.now = now
            self._decide(now)
            return self.applied
        finally:
            for w in hidden:
                w.alive = True

    def apply(self, action: Action, now: float) -> None:
        super().apply(action, now)
        self.applied.append(action)

    # -- bookkeeping -----------------------------------------------------------------------------

    def _close(self, traj: Trajectory, when: float, sample: bool) -> None:
        retire(traj, self.workers, self.active_by_class, when)
        self.done += 1
        if sample:
            self.trainer.finished(traj)
        else:
            tag = traj.tag
            assert tag is not None, f"trajectory {traj.id} closed but was never admitted"
            self.credits.consumed(tag)
        del self.trajectories[traj.id]
