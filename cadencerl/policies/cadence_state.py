"""What CadenceRL remembers between decisions, all of it observable: how fast residents grow, and
where each prompt's samples went.

Both cost O(workers) or O(1) per decision, never a scan of every resident, so a decision stays
well under a millisecond at 64 workers x 256 residents (benchmarks/decision_latency.py).
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
        now = view.now
        for w in view.workers:
            probe = self._probe.get(w.id)
            if probe is not None:
                tid, ctx, t = probe
                traj = w.residents.get(tid)
                if traj is not None and now > t:
                    rate = (traj.context - ctx) / (now - t)
                    old = self._rate.get(w.id, 0.0)
                    self._rate[w.id] = rate if rate >= old else 0.5 * (old + rate)
            if w.residents and w.alive:
                first = next(iter(w.residents.values()))
                self._probe[w.id] = (first.id, first.context, now)
            else:
                self._probe.pop(w.id, None)

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


class RoomIndex:
    """The candidates of one placement stream, sorted by spare room and by load, so that a tight
    fit is a bisection and a least-loaded pick stops at the first feasible worker.

    `spare(w)` is the room a worker has for one more trajectory (negative: none); after a placement
    `update` re-files the worker it went to.
    """

    def __init__(self, workers: list[Worker], spare) -> None:
        self._spare = spare
        self._workers = {w.id: w for w in workers}
        self._key = {w.id: (spare(w), w.load) for w in workers}
        self._by_room = sorted((room, wid) for wid, (room, _load) in self._key.items())
        self._by_load = sorted((load, wid) for wid, (_room, load) in self._key.items())

    def __contains__(self, w: Worker) -> bool:
        return w.id in self._key

    def update(self, w: Worker) -> None:
        room, load = self._key[w.id]
        del self._by_room[bisect.bisect_left(self._by_room, (room, w.id))]
        del self._by_load[bisect.bisect_left(self._by_load, (load, w.id))]
        room, load = self._key[w.id] = self._spare(w), w.load
        bisect.insort(self._by_room, (room, w.id))
        bisect.insort(self._by_load, (load, w.id))

    def tightest(self, need: int) -> Worker | None:
        """The worker whose spare room is the smallest that still covers `need`."""
        i = bisect.bisect_left(self._by_room, (need, -1))
        return self._workers[self._by_room[i][1]] if i < len(self._by_room) else None

    def least_loaded(self, need: int) -> Worker | None:
        """The worker with the fewest residents whose spare room covers `need`."""
        key = self._key
        for _load, wid in self._by_load:
            if key[wid][0] >= need:
                return self._workers[wid]
        return None
