"""CadenceRL's placement arithmetic for one version's workers, read once per decision.

A decision at 64 workers x 256 residents has well under a millisecond (benchmarks/decision_latency.py),
so each worker is read once for the floor check of every worker and the room of every worker in
the index, and a placement stream keeps its own books: it knows what each placement adds (the
trajectory's context and one resident), so it never reads a worker back and the controller can
apply the stream's placements as one batch. (Plain lists: at this size, numpy's conversions cost
more than the arithmetic they would save; measured, see the benchmark's docstring.)
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cadencerl.core.worker import Worker

_IDS = 1 << 20   # worker ids below this: a sort key packs (value, id) into one int


@dataclass
class RoomTerms:
    """`workers` read once. `free`: the KV above the base floor (capacity - used -
    int(floor_frac * capacity)); `load`: residents; `seqs`: sequence slots; `rate`: the observed
    growth of one resident (tokens per second); `per`: that growth over `horizon_s`; `room`: the
    spare room for one more trajectory (its growth counted), -1 without a free slot. Each figure
    is the one the policy's scalar `floor` and `_spare` give, with the same operations in the same
    order."""

    workers: list[Worker]
    ids: list[int]
    free: list[int]
    load: list[int]
    seqs: list[int]
    rate: list[float]
    per: list[float]
    room: list[int]
    floor_frac: float
    horizon_s: float
    rates: Mapping[int, float]   # worker id -> rate, as the growth meter keeps it

    @classmethod
    def read(cls, workers: list[Worker], rates: Mapping[int, float], floor_frac: float,
             horizon_s: float) -> RoomTerms:
        """One comprehension a column (as `reread` computes one worker, a few times faster)."""
        ids = [w.id for w in workers]
        free = [w.kv_capacity - w.kv_used - int(floor_frac * w.kv_capacity) for w in workers]
        load = [len(w.residents) for w in workers]
        seqs = [w.max_num_seqs for w in workers]
        rate = [rates.get(wid, 0.0) for wid in ids]
        per = [r * horizon_s for r in rate]
        room = [-1 if n >= s else f - int((n + 1) * p) for f, n, s, p in zip(free, load, seqs, per)]
        return cls(workers, ids, free, load, seqs, rate, per, room, floor_frac, horizon_s, rates)

    def reread(self, i: int) -> None:
        """Read worker `i` (a position) again, after its residents changed."""
        w = self.workers[i]
        cap, n, seqs = w.kv_capacity, len(w.residents), w.max_num_seqs
        free = self.free[i] = cap - w.kv_used - int(self.floor_frac * cap)
        rate = self.rate[i] = self.rates.get(w.id, 0.0)
        per = self.per[i] = rate * self.horizon_s
        self.load[i], self.seqs[i] = n, seqs
        self.room[i] = -1 if n >= seqs else free - int((n + 1) * per)

    def below_floor(self) -> list[int]:
        """Positions of the workers with more than one resident whose headroom is under the floor."""
        h = self.horizon_s
        return [i for i, (free, n, r) in enumerate(zip(self.free, self.load, self.rate))
                if n > 1 and free < int(n * r * h)]

    def select(self, keep: list[bool]) -> RoomTerms:
        def pick(values: list) -> list:
            return [x for x, k in zip(values, keep) if k]
        terms = RoomTerms(pick(self.workers), pick(self.ids), pick(self.free), pick(self.load), pick(self.seqs),
                          pick(self.rate), pick(self.per), pick(self.room), self.floor_frac, self.horizon_s,
                          self.rates)
        return terms


class RoomIndex:
    """The candidates of one placement stream, sorted by spare room and by load, so that a tight
    fit is a bisection and a least-loaded pick stops at the first feasible worker.

    A worker's spare room is what it has for one more trajectory above its floor, the floor
    counting that trajectory's growth too; -1 without a free sequence slot. `place` books a
    placement on a worker (its context, one more resident) and re-files that worker. Without
    `by_load` only the room order is kept (a stream that never asks for the least-loaded worker
    saves half of every update). Each order is a sorted list of `value * _IDS + worker id`: ints
    compare faster than (value, id) pairs, in the same order.
    """

    def __init__(self, terms: RoomTerms, by_load: bool = True) -> None:
        ids = terms.ids
        if ids and max(ids) >= _IDS:
            raise ValueError(f"worker ids must be below {_IDS}")
        self._workers, self._per, self._seqs = terms.workers, terms.per, terms.seqs
        self._pos = dict(zip(ids, range(len(ids))))
        self._free, self._load, self._room = list(terms.free), list(terms.load), list(terms.room)
        self._by_room = sorted([r * _IDS + wid for r, wid in zip(self._room, ids)])
        self._by_load = sorted([n * _IDS + wid for n, wid in zip(self._load, ids)]) if by_load else None

    def __contains__(self, w: Worker) -> bool:
        return w.id in self._pos

    def __len__(self) -> int:
        return len(self._pos)

    def load(self, w: Worker) -> int:
        """Residents on `w`, counting the placements booked here."""
        return self._load[self._pos[w.id]]

    def total_load(self) -> int:
        return sum(self._load[i] for i in self._pos.values())

    def remove(self, w: Worker) -> None:
        """Take `w` out of this index: no later pick of the stream returns it."""
        wid = w.id
        i = self._pos.pop(wid)
        del self._by_room[bisect.bisect_left(self._by_room, self._room[i] * _IDS + wid)]
        if self._by_load is not None:
            del self._by_load[bisect.bisect_left(self._by_load, self._load[i] * _IDS + wid)]

    def candidate(self, wid: int, need: int) -> Worker | None:
        """Worker `wid` if it is in this index and its spare room covers `need`."""
        i = self._pos.get(wid)
        return self._workers[i] if i is not None and self._room[i] >= need else None

    def place(self, w: Worker, tokens: int) -> None:
        """Book one more resident of `tokens` on `w` and re-file it."""
        wid = w.id
        i = self._pos[wid]
        room, load = self._room[i], self._load[i]
        free = self._free[i] = self._free[i] - tokens
        self._load[i] = load + 1
        new_room = self._room[i] = -1 if load + 1 >= self._seqs[i] else free - int((load + 2) * self._per[i])
        by_room = self._by_room
        del by_room[bisect.bisect_left(by_room, room * _IDS + wid)]
        bisect.insort(by_room, new_room * _IDS + wid)
        by_load = self._by_load
        if by_load is not None:
            del by_load[bisect.bisect_left(by_load, load * _IDS + wid)]
            bisect.insort(by_load, (load + 1) * _IDS + wid)

    def tightest(self, need: int) -> Worker | None:
        """The worker whose spare room is the smallest that still covers `need`."""
        by_room = self._by_room
        i = bisect.bisect_left(by_room, need * _IDS)
        return self._workers[self._pos[by_room[i] % _IDS]] if i < len(by_room) else None

    def least_loaded(self, need: int, caps: Mapping[int, float] | None = None) -> Worker | None:
        """The worker with the fewest residents whose spare room covers `need` and, given `caps`
        (worker id -> load), whose load is under its cap."""
        if self._by_load is None:
            raise ValueError("this index keeps no load order (by_load=False)")
        pos, room, load = self._pos, self._room, self._load
        for code in self._by_load:
            wid = code % _IDS
            i = pos[wid]
            if room[i] >= need and (caps is None or load[i] < caps[wid]):
                return self._workers[i]
        return None


class FirstFit:
    """Concentration's targets in (affinity rank, most headroom, id) order, each with its spare
    room (`spare`): the first whose room covers a context, for contexts that only fall as they come
    (pending work longest first), in O(log n) a pick instead of a scan of the order.

    Workers whose room covered the last context asked for are kept in that order (`_open`); the
    rest wait in a heap by room and join it when a context falls to their room. A pick changes only
    the worker it went to: `refile` reads it again.
    """

    def __init__(self, workers: list[Worker], spare: Callable[[Worker], int]) -> None:
        self._spare = spare
        self._room = {w.id: spare(w) for w in workers}
        self._rooms = sorted(self._room.values())          # every room, for the largest
        self._open: list[tuple[int, int, int, Worker]] = []   # (rank, -headroom, id, worker)
        self._waiting = [(-self._room[w.id], w.id, w) for w in workers]
        heapq.heapify(self._waiting)
        self._asked = 0

    def largest(self) -> int:
        """The longest context any of them could take (-1: none has a slot)."""
        return self._rooms[-1] if self._rooms else -1

    def first(self, context: int) -> Worker:
        """The first worker in the order whose room covers `context` (at most `largest()`)."""
        self._asked = context
        waiting = self._waiting
        while waiting and -waiting[0][0] >= context:
            w = heapq.heappop(waiting)[2]
            bisect.insort(self._open, (w.rank, -w.headroom, w.id, w))
        return self._open[0][3]

    def refile(self, w: Worker) -> None:
        """`w`, the last pick, took its placement: its room and place in the order are read again."""
        del self._open[0]
        rooms, old = self._rooms, self._room[w.id]
        del rooms[bisect.bisect_left(rooms, old)]
        room = self._room[w.id] = self._spare(w)
        bisect.insort(rooms, room)
        if room >= self._asked:
            bisect.insort(self._open, (w.rank, -w.headroom, w.id, w))
        else:
            heapq.heappush(self._waiting, (-room, w.id, w))
