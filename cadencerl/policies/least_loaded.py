"""The naive floor: fresh work to the worker with the fewest residents, no migration ever."""

from __future__ import annotations

from collections.abc import Iterator

from cadencerl.core.actions import Action
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.policies.base import admit_fresh, advance_idle, place_pending


class LeastLoaded:
    name = "least-loaded"
    kv_transfer = False

    def decide(self, view: PoolView) -> Iterator[Action]:
        yield from advance_idle(view)
        yield from place_pending(view, least_loaded)   # lost workers, tool returns
        yield from admit_fresh(view, least_loaded)


def least_loaded(workers: list[Worker], _traj=None) -> Worker:
    return min(workers, key=lambda w: (w.load, w.id))
