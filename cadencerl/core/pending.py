"""The policy-version-indexed pending set P_v: departed trajectories waiting for a destination.

Departure is separated from placement, so its size is the backpressure signal the paper uses.
Each version's trajectories are also kept in context order, so a policy that places shortest
(or longest) first reads that order instead of sorting the whole set at every decision. A pending
trajectory is on no worker, so its context does not change until it is placed or removed.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from itertools import count

from cadencerl.core.trajectory import Trajectory, admitted_version

_SHIFT = 40     # an entry's key is context << _SHIFT plus its arrival number (below 2**40): one int
_ARRIVAL = 1 << _SHIFT      # compares faster than a (context, arrival) tuple; arrival breaks ties
_ARRIVAL_MASK = _ARRIVAL - 1


class PendingSet:
    def __init__(self) -> None:
        self._by_version: dict[int, dict[int, Trajectory]] = {}
        self._ordered: dict[int, list[int]] = {}        # version -> keys, ascending: by (context, arrival)
        self._arrived: dict[int, Trajectory] = {}      # arrival number -> trajectory
        self._key: dict[int, int] = {}                  # trajectory id -> its key
        self._arrivals = count()

    def add(self, traj: Trajectory) -> None:
        v = admitted_version(traj)
        self._by_version.setdefault(v, {})[traj.id] = traj
        arrival = next(self._arrivals)
        self._arrived[arrival] = traj
        key = self._key[traj.id] = (traj.context << _SHIFT) + arrival
        bisect.insort(self._ordered.setdefault(v, []), key)

    def remove(self, traj: Trajectory) -> None:
        v = admitted_version(traj)
        bucket = self._by_version[v]
        del bucket[traj.id]
        ordered = self._ordered[v]
        key = self._key.pop(traj.id)
        del ordered[bisect.bisect_left(ordered, key)]
        del self._arrived[key & _ARRIVAL_MASK]
        if not bucket:
            del self._by_version[v]
            del self._ordered[v]

    def __contains__(self, traj: Trajectory) -> bool:
        v = traj.version
        return v is not None and traj.id in self._by_version.get(v, ())

    def at(self, version: int) -> list[Trajectory]:
        """In the order they departed."""
        return list(self._by_version.get(version, {}).values())

    def by_context(self, version: int, longest_first: bool = False) -> list[Trajectory]:
        """Shortest first (or longest first); equal contexts in the order they departed."""
        keys = self._ordered.get(version, ())
        if longest_first:   # a stable sort on the context alone keeps departure order among equals
            keys = sorted(keys, key=_context_of, reverse=True)
        arrived = self._arrived
        return [arrived[k & _ARRIVAL_MASK] for k in keys]

    def longest_first(self, version: int) -> LongestFirst:
        """`by_context(version, longest_first=True)` as a walk that skips the work longer than a
        bound in one bisection (a copy of the order: the set may change as the walk goes)."""
        return LongestFirst(list(self._ordered.get(version, ())), self._arrived)

    def shortest_first(self, version: int) -> Iterator[Trajectory]:
        """`by_context(version)`, read lazily from the live order (no copy): read it through before
        the set changes."""
        arrived = self._arrived
        return (arrived[k & _ARRIVAL_MASK] for k in self._ordered.get(version, ()))

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

    def __init__(self, keys: list[int], arrived: dict[int, Trajectory]) -> None:
        self._keys, self._arrived = keys, arrived   # keys ascending: longest first is runs of equal context from the end
        self._end = len(keys)    # entries from here on are given or passed over
        self._next = self._run_end = 0   # the rest of the run of equal contexts being given

    def next_within(self, bound: int) -> Trajectory | None:
        """The next trajectory of context at most `bound` (never more than the last call's bound)."""
        keys = self._keys
        if self._next < self._run_end:
            key = keys[self._next]
            if key >> _SHIFT <= bound:
                self._next += 1
                return self._arrived[key & _ARRIVAL_MASK]
            self._next = self._run_end     # the rest of this run is as long: passed over
        cut = bisect.bisect_right(keys, (bound << _SHIFT) + _ARRIVAL_MASK, 0, self._end)
        if cut == 0:
            return None
        start = bisect.bisect_left(keys, keys[cut - 1] >> _SHIFT << _SHIFT, 0, cut)
        self._end, self._next, self._run_end = start, start + 1, cut
        return self._arrived[keys[start] & _ARRIVAL_MASK]


def _context_of(key: int) -> int:
    return key >> _SHIFT
