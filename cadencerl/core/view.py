"""What a policy sees: the pool as a real engine would show it, never a trajectory's future."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol

from cadencerl.core.credits import CreditModel
from cadencerl.core.fresh import FreshQueue
from cadencerl.core.pending import PendingSet
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker


def off_worker(pending: PendingSet, tool_waiting: dict[int, int], version: int) -> int:
    """Unfinished trajectories of `version` on no worker (pending or on a tool call)."""
    return pending.count(version) + tool_waiting.get(version, 0)


def strands_work(worker: Worker, workers: list[Worker], pending: PendingSet, tool_waiting: dict[int, int]) -> bool:
    """Would advancing `worker` leave off-worker trajectories of its version with no live worker of
    that version to run on? The one statement of this rule: the view asks it for policies, the
    controller to validate an Advance."""
    if any(o.version == worker.version and o.alive for o in workers if o is not worker):
        return False
    return off_worker(pending, tool_waiting, worker.version) > 0


@dataclass
class PoolView:
    now: float
    trainer_version: int
    next_batch: int
    workers: list[Worker]
    pending: PendingSet
    fresh: FreshQueue
    credits: "CreditModel"
    trainer_busy: bool
    in_flight: int          # admitted, not yet completed
    tool_waiting: dict[int, int]
    gate: "AdmissionGate | None" = field(default=None)   # set by the controller, never by a policy
    active_by_class: dict[str, int] = field(default_factory=dict)

    def offworker(self, version: int) -> int:
        """Unfinished trajectories of `version` on no worker (pending or on a tool call)."""
        return off_worker(self.pending, self.tool_waiting, version)

    def may_advance(self, worker: Worker) -> bool:
        """An empty worker may advance unless it is the last home of its version's remaining work."""
        if worker.residents or worker.version >= self.trainer_version:
            return False
        return not strands_work(worker, self.workers, self.pending, self.tool_waiting)

    def budget(self, version: int) -> int:
        """Fresh trajectories the eta budget still lets start under `version`, whatever an admission
        layer says now: 0 is "this version's work is spent" (a worker may move on)."""
        return min(len(self.fresh), self.credits.admissible(version, self.next_batch))

    def admissible(self, version: int, traj: Trajectory | None = None) -> int:
        """Fresh trajectories that may start under `version` now: its budget, within the admission
        layer's allowance when there is one (a full layer holds work back; it does not spend it).
        A session pinned to a worker (`traj.pin`) passes the layer's caps, as in `accepts_new` (the
        layer's class gate, `next_fresh`, still decides when its class's turn comes)."""
        n = self.budget(version)
        if self.gate is None or not n or (traj is not None and traj.pin is not None):
            return n
        return min(n, self.gate.remaining(self))

    def next_fresh(self, version: int | None = None) -> Trajectory | None:
        """The next new session to admit (under `version`, when the caller knows which it joins):
        the earliest one the admission layer lets through (not asked when none waits: every pass
        ends on an empty queue, and the layer's answer is a pure function of the view)."""
        if self.gate is None or not self.fresh:
            return self.fresh.peek()
        return self.fresh.peek(self.gate.open_classes(self, version))

    def fresh_in_order(self) -> Iterator[Trajectory]:
        """Without an admission layer: the new sessions in the order `next_fresh` would give them
        if each were admitted in turn (for a policy that books a whole stream before proposing it)."""
        if self.gate is not None:
            raise ValueError("an admission layer decides the next session only after each admission")
        return self.fresh.in_order()

    def accepts_new(self, worker: Worker, traj: Trajectory | None = None) -> bool:
        """May `worker` take a new session (`traj`, if known) now? Continuations are never held, and
        neither is a session pinned to `worker`: it continues state only that worker holds (a live
        router's stored response), so holding it there would hold every session queued behind it."""
        return self.accepting_new([worker], traj)[0]

    def accepting_new(self, workers: list[Worker], traj: Trajectory | None = None) -> list[bool]:
        """`accepts_new` for each of `workers`, the admission layer asked once for all of them: its
        pool-wide figures are sums over the pool, so a question a worker made a choice among the
        workers cost the pool's size squared (a 64-server router's CPU went to that)."""
        if self.gate is None:
            return [True] * len(workers)
        pin = traj.pin if traj is not None else None
        return [ok or w.id == pin for w, ok in zip(workers, self.gate.accepting(self, workers))]

    def may_start_on(self, workers: list[Worker], traj: Trajectory | None = None) -> list[Worker]:
        """Those of `workers` a new session (`traj`, if known) may start on now: their version has
        budget for it, and the admission layer accepts it there (asked once for all of them)."""
        open_versions = {v for v in {w.version for w in workers} if self.admissible(v, traj) > 0}
        under = [w for w in workers if w.version in open_versions]
        return [w for w, accepts in zip(under, self.accepting_new(under, traj)) if accepts]

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]


class AdmissionGate(Protocol):
    """An admission layer in front of placement: it holds new sessions back, never continuations.

    Every question takes the view it is asked about, so an answer is a function of that view and
    the gate's own books (what it admitted and learned), never of which question came first."""

    def open_classes(self, view: PoolView, version: int | None = None) -> set[str]:
        """The classes a new session may come from now (to start under `version`; None: any)."""

    def accepting(self, view: PoolView, workers: list[Worker]) -> list[bool]:
        """May each of `workers` take a new session now? (One question for all: what the answer
        shares, the pool's figures, is worked out once.)"""

    def remaining(self, view: PoolView) -> int:
        """New sessions the layer lets start now, over the whole pool."""

    def books(self) -> dict:
        """What it counted of the sessions it admitted, as JSON, for a process that takes over (a journal)."""

    def take_up(self, books: dict) -> None:
        """Carry on from another process's `books()`."""
