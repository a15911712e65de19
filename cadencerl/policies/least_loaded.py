"""The naive floor: fresh work to the worker with the fewest residents, no migration ever."""

from __future__ import annotations

from collections.abc import Iterator

from cadencerl.core.actions import Action
from cadencerl.core.policy import Policy
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.policies.base import GroupAffinity, admit_fresh, advance_idle, grouped, place_pending


class LeastLoaded(Policy):
    """`ties_to_last` breaks a tie in load toward the highest worker id instead of the lowest: the same
    rule with another arbitrary choice, which measures how far the floor itself moves on a mixed pool
    (where the ids order the accelerator types)."""

    kv_transfer = False

    def __init__(self, group_affinity: bool = False, ties_to_last: bool = False) -> None:
        self.name = "least-loaded-grouped" if group_affinity else "least-loaded"
        self._pick = least_loaded_last if ties_to_last else least_loaded
        self._choose = grouped(self._pick, GroupAffinity() if group_affinity else None)

    def decide(self, view: PoolView) -> Iterator[Action]:
        yield from advance_idle(view)
        yield from place_pending(view, self._pick)   # lost workers, tool returns
        yield from admit_fresh(view, self._choose)


def least_loaded(workers: list[Worker], _traj=None) -> Worker:
    return min(workers, key=lambda w: (w.load, w.id))


def least_loaded_last(workers: list[Worker], _traj=None) -> Worker:
    """The least-loaded worker, ties to the highest id."""
    return min(workers, key=lambda w: (w.load, -w.id))
