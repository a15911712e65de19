"""What CadenceRL remembers between decisions, all of it observable: how fast residents grow, and
where each prompt's samples went.

Both cost O(workers) or O(1) per decision, never a scan of every resident; with the room index
below, a decision costs O(workers) plus a few microseconds per action it takes
(benchmarks/decision_latency.py measures it at 64 workers x 256 residents).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker


class GrowthMeter:
    """KV tokens a worker's residents will add before the next decision.

    Every decoding resident of a worker grows by one token per engine step, so one resident's
    observed growth between two decisions gives the worker's per-resident rate. The probe is the
    worker's longest-placed resident (most likely running, not queued). The estimate rises at once
    and decays by halves, so a worker speeding up is covered from its first observation.
    """

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self._probe: dict[int, tuple[int, int, float]] = {}   # worker -> (trajectory, context, time)
        self._rate: dict[int, float] = {}                      # worker -> tokens per second per resident

    def observe(self, view: PoolView) -> None:
        now, probes, rates = view.now, self._probe, self._rate
        for w in view.workers:
            residents = w.residents
            probe = probes.get(w.id)
            if probe is not None:
                tid, ctx, t = probe
                traj = residents.get(tid)
                if traj is not None and now > t:
                    rate = (traj.context - ctx) / (now - t)
                    old = rates.get(w.id, 0.0)
                    rates[w.id] = rate if rate >= old else 0.5 * (old + rate)
            if residents and w.alive:
                first = next(iter(residents.values()))
                probes[w.id] = (first.id, first.context, now)
            elif probe is not None:
                del probes[w.id]

    def tokens(self, w: Worker, residents: int) -> int:
        """Growth of `residents` decoding sequences on `w` over the horizon."""
        return int(residents * self._rate.get(w.id, 0.0) * self.horizon_s)

    def per_resident(self, w: Worker) -> float:
        """Growth of one decoding sequence on `w` over the horizon."""
        return self._rate.get(w.id, 0.0) * self.horizon_s


class PromptHomes:
    """The worker the latest sample of each prompt group went to: its prefix is cached there.

    Bounded and insertion-ordered: groups in flight are at most (eta+1) batches' worth, so the
    oldest entries can go.
    """

    def __init__(self, size: int = 16384) -> None:
        self.size = size
        self._home: OrderedDict[int, int] = OrderedDict()

    def get(self, group: int) -> int | None:
        return self._home.get(group)

    def note(self, group: int, worker: int) -> None:
        self._home[group] = worker
        self._home.move_to_end(group)
        if len(self._home) > self.size:
            self._home.popitem(last=False)


_IDS = 1 << 20   # worker ids below this: a sort key packs (value, id) into one int


class RoomIndex:
    """The candidates of one placement stream, sorted by spare room and by load, so that a tight
    fit is a bisection and a least-loaded pick stops at the first feasible worker.

    `spare(w)` is the room a worker has for one more trajectory (negative: none); after a placement
    `update` re-files the worker it went to. Without `by_load` only the room order is kept (a
    stream that never asks for the least-loaded worker saves half of every update). Each order is
    a sorted list of `value * _IDS + worker id`: ints compare faster than (value, id) pairs, in
    the same order.
    """

    def __init__(self, workers: list[Worker], spare, by_load: bool = True) -> None:
        self._spare = spare
        self._workers = {w.id: w for w in workers}
        if self._workers and max(self._workers) >= _IDS:
            raise ValueError(f"worker ids must be below {_IDS}")
        self._key = {w.id: (spare(w), len(w.residents)) for w in workers}
        self._by_room = sorted([room * _IDS + wid for wid, (room, _load) in self._key.items()])
        self._by_load = sorted([load * _IDS + wid for wid, (_room, load) in self._key.items()]) if by_load else None

    def __contains__(self, w: Worker) -> bool:
        return w.id in self._key

    def candidate(self, wid: int, need: int) -> Worker | None:
        """Worker `wid` if it is in this index and its spare room covers `need`."""
        key = self._key.get(wid)
        return self._workers[wid] if key is not None and key[0] >= need else None

    def update(self, w: Worker) -> None:
        wid = w.id
        room, load = self._key[wid]
        by_room = self._by_room
        del by_room[bisect.bisect_left(by_room, room * _IDS + wid)]
        new_room, new_load = self._key[wid] = self._spare(w), len(w.residents)
        bisect.insort(by_room, new_room * _IDS + wid)
        by_load = self._by_load
        if by_load is not None:
            del by_load[bisect.bisect_left(by_load, load * _IDS + wid)]
            bisect.insort(by_load, new_load * _IDS + wid)

    def tightest(self, need: int) -> Worker | None:
        """The worker whose spare room is the smallest that still covers `need`."""
        i = bisect.bisect_left(self._by_room, need * _IDS)
        return self._workers[self._by_room[i] % _IDS] if i < len(self._by_room) else None

    def least_loaded(self, need: int) -> Worker | None:
        """The worker with the fewest residents whose spare room covers `need`."""
        if self._by_load is None:
            raise ValueError("this index keeps no load order (by_load=False)")
        key = self._key
        for code in self._by_load:
            wid = code % _IDS
            if key[wid][0] >= need:
                return self._workers[wid]
        return None
