"""Fresh trajectories not yet admitted, in arrival order, with per-class queues.

Per-class queues let an admission layer hold back one workload class (MISA-T's HOLD) while the
others go ahead, without scanning the whole backlog. Any waiting trajectory can be taken, not only
the head (the clairvoyant reference takes longest first): a taken one leaves the index at once and
its queue entry is dropped when it reaches the head, so every operation is O(1) amortized and the
head of every queue is always a waiting trajectory.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from cadencerl.core.trajectory import Trajectory


class FreshQueue:
    def __init__(self, trajectories: list[Trajectory]) -> None:
        self._by_class: dict[str, deque[tuple[int, Trajectory]]] = {}   # (arrival, trajectory), taken ones too
        self._waiting: dict[int, Trajectory] = {}                        # id -> trajectory not yet taken
        self._counts: dict[str, int] = {}
        self._arrivals = 0
        for t in trajectories:
            self.push(t)

    def push(self, traj: Trajectory) -> None:
        """Queue `traj` behind every trajectory already here."""
        if traj.id in self._waiting:
            raise ValueError(f"trajectory {traj.id} is already waiting")
        cls = traj.workload_class
        self._by_class.setdefault(cls, deque()).append((self._arrivals, traj))
        self._waiting[traj.id] = traj
        self._counts[cls] = self._counts.get(cls, 0) + 1
        self._arrivals += 1

    def __len__(self) -> int:
        return len(self._waiting)

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def classes(self) -> list[str]:
        return [c for c, n in self._counts.items() if n]

    def count(self, cls: str) -> int:
        return self._counts.get(cls, 0)

    def peek(self, classes: set[str] | None = None) -> Trajectory | None:
        """The earliest-arrived fresh trajectory (of one of `classes`, if given)."""
        best = None
        for cls, q in self._by_class.items():
            if q and (classes is None or cls in classes) and (best is None or q[0][0] < best[0]):
                best = q[0]
        return best[1] if best else None

    def in_order(self) -> Iterator[Trajectory]:
        """The waiting trajectories in arrival order: what `peek` would give if each were taken in
        turn. Read it through before taking any (a take changes the queues it walks)."""
        waiting = self._waiting
        queues = [q for q in self._by_class.values() if q]
        for _arrival, traj in queues[0] if len(queues) == 1 else heapq.merge(*queues):
            if waiting.get(traj.id) is traj:
                yield traj

    def take(self, traj: Trajectory) -> None:
        """Remove `traj`, wherever it waits; KeyError if it is not waiting here."""
        if self._waiting.get(traj.id) is not traj:
            raise KeyError(traj.id)
        del self._waiting[traj.id]
        cls = traj.spec.workload_class
        self._counts[cls] -= 1
        self._skip(self._by_class[cls])

    def take_all(self, trajs: list[Trajectory]) -> None:
        """Remove every one of `trajs` (each as `take` would, the queues' heads skipped once);
        KeyError, with nothing removed, if one is not waiting here."""
        waiting, counts = self._waiting, self._counts
        strangers = [t.id for t in trajs if waiting.get(t.id) is not t]
        if strangers or len({t.id for t in trajs}) < len(trajs):
            raise KeyError(strangers[0] if strangers else "a trajectory twice")
        classes = set()
        for traj in trajs:
            del waiting[traj.id]
            cls = traj.spec.workload_class
            counts[cls] -= 1
            classes.add(cls)
        for cls in classes:
            self._skip(self._by_class[cls])

    def _skip(self, q: deque[tuple[int, Trajectory]]) -> None:
        """Drop taken trajectories from the head of `q` (after each take: a head is always waiting)."""
        while q and self._waiting.get(q[0][1].id) is not q[0][1]:
            q.popleft()
