"""What a policy sees: the pool as a real engine would show it, never a trajectory's future."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Protocol

from cadencerl.config import PolicySpec
from cadencerl.core.actions import Action
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
    fresh: deque[Trajectory]
    credits: "CreditModel"
    params: PolicySpec
    trainer_busy: bool
    in_flight: int          # admitted, not yet completed
    completed_unconsumed: int
    tool_waiting: dict[int, int]

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
        """Fresh trajectories that may still start under `version` (the eta budget)."""
        return min(len(self.fresh), self.credits.admissible(version, self.next_batch))

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]


class Policy(Protocol):
    """A placement policy: observable state in, actions out.

    `decide` is a generator; the controller applies each action as it is yielded, so the policy
    sees the effect of its earlier actions (headroom, pending) in the same view.
    """

    name: str
    kv_transfer: bool  # may a move restore KV over the cluster link instead of re-prefilling?

    def decide(self, view: PoolView) -> Iterable[Action]: ...
