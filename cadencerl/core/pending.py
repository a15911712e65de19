"""The policy-version-indexed pending set P_v: departed trajectories waiting for a destination.

Departure is separated from placement, so its size is the backpressure signal the paper uses.
Each version's trajectories are also kept in context order, so a policy that places shortest
(or longest) first reads that order instead of sorting the whole set at every decision. A pending
trajectory is on no worker, so its context does not change until it is placed or removed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from itertools import count
from operator import itemgetter

from cadencerl.core.trajectory import Trajectory

_Entry = tuple[int, int, Trajectory]   # (context, arrival number, trajectory): arrival breaks ties
_context_of, _trajectory_of = itemgetter(0), itemgetter(2)


class PendingSet:
    def __init__(self) -> None:
        self._by_version: dict[int, dict[int, Trajectory]] = {}
        self._ordered: dict[int, list[_Entry]] = {}       # version -> entries by (context, arrival)
        self._entry: dict[int, _Entry] = {}               # trajectory id -> its entry
        self._arrivals = count()

    def add(self, traj: Trajectory) -> None:
        v = traj.version
        self._by_version.setdefault(v, {})[traj.id] = traj
        entry = self._entry[traj.id] = (traj.context, next(self._arrivals), traj)
        bisect.insort(self._ordered.setdefault(v, []), entry)

    def remove(self, traj: Trajectory) -> None:
        v = traj.version
        bucket = self._by_version[v]
        del bucket[traj.id]
        ordered = self._ordered[v]
        del ordered[bisect.bisect_left(ordered, self._entry.pop(traj.id))]
        if not bucket:
            del self._by_version[v]
            del self._ordered[v]

    def __contains__(self, traj: Trajectory) -> bool:
        return traj.id in self._by_version.get(traj.version, ())

    def at(self, version: int) -> list[Trajectory]:
        """In the order they departed."""
        return list(self._by_version.get(version, {}).values())

    def by_context(self, version: int, longest_first: bool = False) -> list[Trajectory]:
        """Shortest first (or longest first); equal contexts in the order they departed."""
        entries = self._ordered.get(version, ())
        if longest_first:   # a stable sort on the context alone keeps departure order among equals
            entries = sorted(entries, key=_context_of, reverse=True)
        return list(map(_trajectory_of, entries))

    def longest_first(self, version: int) -> LongestFirst:
        """`by_context(version, longest_first=True)` as a walk that skips the work longer than a
        bound in one bisection (a copy of the order: the set may change as the walk goes)."""
        return LongestFirst(list(self._ordered.get(version, ())))

    def shortest_first(self, version: int) -> Iterator[Trajectory]:
        """`by_context(version)`, read lazily from the live order (no copy): read it through before
        the set changes."""
        return map(_trajectory_of, self._ordered.get(version, ()))

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


class LongestFirst:
    """Pending work longest first, equal contexts in departure order, for a caller whose bound on
    what fits only falls as it goes: whatever is longer than the bound at its turn is passed over
    for good, found by bisection, not read one by one."""

    def __init__(self, entries: list[_Entry]) -> None:
        self._entries = entries   # by (context, arrival): longest first is runs of equal context from the end
        self._end = len(entries)  # entries from here on are given or passed over
        self._next = self._run_end = 0   # the rest of the run of equal contexts being given

    def next_within(self, bound: int) -> Trajectory | None:
        """The next trajectory of context at most `bound` (never more than the last call's bound)."""
        entries = self._entries
        if self._next < self._run_end:
            entry = entries[self._next]
            if entry[0] <= bound:
                self._next += 1
                return entry[2]
            self._next = self._run_end     # the rest of this run is as long: passed over
        cut = bisect.bisect_right(entries, (bound, math.inf), 0, self._end)
        if cut == 0:
            return None
        start = bisect.bisect_left(entries, (entries[cut - 1][0],), 0, cut)
        self._end, self._next, self._run_end = start, start + 1, cut
        return entries[start][2]
