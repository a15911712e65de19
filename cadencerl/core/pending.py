"""The policy-version-indexed pending set P_v: departed trajectories waiting for a destination.

Departure is separated from placement, so its size is the backpressure signal the paper uses.
"""

from __future__ import annotations

from collections.abc import Iterator

from cadencerl.core.trajectory import Trajectory


class PendingSet:
    def __init__(self) -> None:
        self._by_version: dict[int, dict[int, Trajectory]] = {}

    def add(self, traj: Trajectory) -> None:
        self._by_version.setdefault(traj.version, {})[traj.id] = traj

    def remove(self, traj: Trajectory) -> None:
        bucket = self._by_version[traj.version]
        del bucket[traj.id]
        if not bucket:
            del self._by_version[traj.version]

    def __contains__(self, traj: Trajectory) -> bool:
        return traj.id in self._by_version.get(traj.version, ())

    def at(self, version: int) -> list[Trajectory]:
        return list(self._by_version.get(version, {}).values())

    def versions(self) -> list[int]:
        return sorted(self._by_version)

    def count(self, version: int | None = None) -> int:
        if version is None:
            return sum(len(b) for b in self._by_version.values())
        return len(self._by_version.get(version, ()))

    def __len__(self) -> int:
        return self.count()

    def __iter__(self) -> Iterator[Trajectory]:
        for v in sorted(self._by_version):
            yield from list(self._by_version[v].values())
