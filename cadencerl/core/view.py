"""What a policy sees: the pool as a real engine would show it, never a trajectory's future."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Protocol

from cadencerl.config import PolicySpec
from cadencerl.core.actions import Action
from cadencerl.core.fresh import FreshQueue
from cadencerl.core.pending import PendingSet
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker

if TYPE_CHECKING:
    from cadencerl.core.credits import CreditModel


@dataclass
class PoolView:
    now: float
    trainer_version: int
    next_batch: int
    workers: list[Worker]
    pending: PendingSet
    fresh: FreshQueue
    credits: "CreditModel"
    params: PolicySpec
    trainer_busy: bool
    in_flight: int          # admitted, not yet completed
    completed_unconsumed: int
    tool_waiting: dict[int, int]
    gate: "AdmissionGate | None" = field(default=None)
    active_by_class: dict[str, int] = field(default_factory=dict)

    def offworker(self, version: int) -> int:
        """Unfinished trajectories of `version` on no worker (pending or on a tool call)."""
        return self.pending.count(version) + self.tool_waiting.get(version, 0)

    def may_advance(self, worker: Worker) -> bool:
        """An empty worker may advance unless it is the last home of its version's remaining work."""
        if worker.residents or worker.version >= self.trainer_version:
            return False
        if any(o.version == worker.version and o.alive for o in self.workers if o is not worker):
            return True
        return self.offworker(worker.version) == 0

    def admissible(self, version: int) -> int:
        """Fresh trajectories that may still start under `version` (the eta budget, and the
        admission layer's allowance when there is one)."""
        n = min(len(self.fresh), self.credits.admissible(version, self.next_batch))
        return min(n, self.gate.remaining()) if self.gate is not None and n else n

    def next_fresh(self) -> Trajectory | None:
        """The next new session to admit: the earliest one the admission layer lets through."""
        if self.gate is None:
            return self.fresh.peek()
        return self.fresh.peek(self.gate.open_classes())

    def accepts_new(self, worker: Worker) -> bool:
        """May `worker` take a new session now? (Continuations are never held.)"""
        return self.gate is None or self.gate.accepts(worker)

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]


class AdmissionGate(Protocol):
    """An admission layer in front of placement: it holds new sessions, never continuations."""

    def open_classes(self) -> set[str]: ...

    def accepts(self, worker: Worker) -> bool: ...

    def remaining(self) -> int: ...


class Policy(Protocol):
    """A placement policy: observable state in, actions out.

    `decide` is a generator; the controller applies each action as it is yielded, so the policy
    sees the effect of its earlier actions (headroom, pending) in the same view.
    """

    name: str
    kv_transfer: bool  # may a move restore KV over the cluster link instead of re-prefilling?

    def decide(self, view: PoolView) -> Iterable[Action]: ...
