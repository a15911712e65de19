"""Fresh trajectories not yet admitted, in arrival order, with per-class queues.

Per-class queues let an admission layer hold back one workload class (MISA-T's HOLD) while the
others go ahead, without scanning the whole backlog.
"""

from __future__ import annotations

from collections import deque

from cadencerl.core.trajectory import Trajectory


class FreshQueue:
    def __init__(self, trajectories: list[Trajectory]) -> None:
        self._by_class: dict[str, deque[tuple[int, Trajectory]]] = {}
        for i, t in enumerate(trajectories):
            self._by_class.setdefault(t.workload_class, deque()).append((i, t))
        self._taken: set[int] = set()
        self._count = len(trajectories)

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def classes(self) -> list[str]:
        return [c for c in self._by_class if self.count(c)]

    def count(self, cls: str) -> int:
        self._skip(cls)
        return len(self._by_class.get(cls, ()))

    def peek(self, classes: set[str] | None = None) -> Trajectory | None:
        """The earliest-arrived fresh trajectory (of one of `classes`, if given)."""
        best = None
        for cls in self._by_class:
            if classes is not None and cls not in classes:
                continue
            self._skip(cls)
            q = self._by_class[cls]
            if q and (best is None or q[0][0] < best[0]):
                best = q[0]
        return best[1] if best else None

    def take(self, traj: Trajectory) -> None:
        if traj.id in self._taken or traj.workload_class not in self._by_class:
            raise KeyError(traj.id)
        q = self._by_class[traj.workload_class]
        if q and q[0][1] is traj:
            q.popleft()
        elif not any(t is traj for _i, t in q):
            raise KeyError(traj.id)
        else:
            self._taken.add(traj.id)
        self._count -= 1

    def _skip(self, cls: str) -> None:
        q = self._by_class.get(cls)
        while q and q[0][1].id in self._taken:
            self._taken.discard(q.popleft()[1].id)
