"""The controller's Backend for a live router: placements go to the requests that wait for them,
and what an engine reports comes from its /metrics (scraped by the service, set here).

Nothing here does I/O: the service wires the hooks (start a held request, abort an evicted one,
push a worker's weights), so a recorded event sequence replays exactly without servers.
"""

from __future__ import annotations

from collections.abc import Callable

from cadencerl.core.backend import EngineStats, Event, Restore, refresh_each
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.worker import Worker

_NO_FIGURES = EngineStats(0, 0, 0, 0)


class RouterEngines:
    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.figures: dict[int, EngineStats] = {}
        self.on_place: Callable[[Trajectory, int], None] = lambda traj, worker: None
        self.on_evict: Callable[[Trajectory], None] = lambda traj: None
        self.on_version: Callable[[int, int], None] = lambda worker, version: None

    def now(self) -> float:
        raise NotImplementedError("a live router's clock is the service's")

    def start(self, workers: list[Worker]) -> None:
        """Nothing to start: the servers are the clients'."""

    def refresh(self, workers: list[Worker], now: float) -> None:
        """The residents' contexts are counted as their streams arrive; the servers' figures as polled."""
        refresh_each(self, workers)

    def kv_committed(self, worker: int) -> int:
        return sum(t.context for t in self.workers[worker].residents.values())

    def stats(self, worker: int) -> EngineStats:
        return self.figures.get(worker, _NO_FIGURES)

    def place(self, traj: Trajectory, worker: int, restore: Restore, delay_s: float) -> None:
        self.on_place(traj, worker)

    def evict(self, traj: Trajectory) -> None:
        self.on_evict(traj)

    def set_version(self, worker: int, version: int, keep_kv: bool = False) -> None:
        self.on_version(worker, version)

    def commit(self, now: float) -> None:
        """Each placement started its request already."""

    def schedule(self, time: float, tag: str) -> None:
        raise NotImplementedError("a live router's trainer is its clients': it sets no timer")

    def publish_at(self, time: float) -> None:
        raise NotImplementedError("a live router's clients publish their versions")

    def advance(self, until: float) -> list[Event]:
        raise NotImplementedError("a live router's events come from its requests")

    def idle(self) -> bool:
        return False

    def next_event_time(self) -> float | None:
        return None

    def verify(self) -> list[str]:
        return []
