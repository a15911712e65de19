"""CadenceRL: reshape the workload instead of estimating each move's benefit (paper section 4, App. B).

Per policy version v, the workers at v are in one of two modes:

* **Pacing**, while fresh work of v remains under the admission budget: a worker whose KV headroom
  fell below the floor evicts its longest resident to the pending set P_v (long out); then pending
  and fresh trajectories are placed shortest-first (short in), on a worker holding a sibling of
  the same prompt if one is feasible, else by tight fit: the feasible worker with the smallest
  post-placement headroom, feasible meaning post-placement headroom >= floor + delta per resident
  (delta is a per-trajectory decode reserve: each resident keeps room to grow by delta tokens).
* **Concentration**, once the budget for v is exhausted: pending trajectories are placed
  longest-first on workers ordered by descending affinity, then headroom (feasible: headroom >=
  floor, no delta). Only when P_v is empty (the gate) does the lowest-affinity worker drain: its
  residents depart to P_v and are placed the same way. A drained worker advances to the newest
  version, or first to an intermediate version whose weaker-affinity workers still hold tail work.

Where the paper is silent: a source drains only when a newer version has fresh work for it to
advance to (draining earlier would leave it idle), and only if the workers above it in the
affinity order (or equal but fuller) have the headroom to absorb its KV, so residents never
bounce back; pacing never evicts a worker's last resident; the floor is a fraction of each
worker's KV capacity.
"""

from __future__ import annotations

from collections.abc import Iterator

from cadencerl.config import PolicySpec
from cadencerl.core.actions import Action, Admit, Advance, Evict, Place
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.policies.base import fits


class Cadence:
    name = "cadence"

    def __init__(self, params: PolicySpec) -> None:
        self.delta = params.delta
        self.floor_frac = params.headroom_floor
        self.kv_transfer = params.kv_preparation
        self.kv_staging = params.kv_preparation   # late-bound: staged on relays at departure (section 4.4)

    def floor(self, w: Worker) -> int:
        return int(self.floor_frac * w.kv_capacity)

    def _reserve(self, w: Worker, per_resident: int) -> int:
        """The headroom a placement must leave on `w`: the floor, plus `per_resident` decode tokens
        for every resident it would then hold."""
        return self.floor(w) + per_resident * (w.load + 1)

    def _feasible(self, w: Worker, tokens: int, per_resident: int) -> bool:
        return fits(w, tokens, self._reserve(w, per_resident))

    # -- the decision ---------------------------------------------------------------------------

    def decide(self, view: PoolView) -> Iterator[Action]:
        groups: dict[int, list[Worker]] = {}
        for w in view.alive():
            groups.setdefault(w.version, []).append(w)
        for v in sorted(groups):
            if view.admissible(v) > 0:
                yield from self._pace(view, v, groups[v])
            else:
                yield from self._concentrate(view, v, groups[v])
        yield from self._advance(view)

    # -- pacing ---------------------------------------------------------------------------------

    def _pace(self, view: PoolView, v: int, workers: list[Worker]) -> Iterator[Action]:
        for w in workers:
            while w.headroom < self.floor(w) and w.load > 1:
                yield Evict(max(w.residents.values(), key=lambda t: t.context).id)
        # Shortest first over fresh and pending work. Feasibility is monotone in length, so the
        # first trajectory that fits nowhere ends its stream.
        pending = sorted(view.pending.at(v), key=lambda t: t.context)
        i = 0
        fresh_open = True
        siblings: dict[int, set[int]] | None = None
        last_fresh: tuple[int, int] | None = None   # (group, worker) of the last admission
        while True:
            fresh = view.next_fresh() if fresh_open and view.admissible(v) > 0 else None
            nxt = pending[i] if i < len(pending) else None
            if fresh is None and nxt is None:
                return
            if fresh is not None and (nxt is None or fresh.context <= nxt.context):
                w = None
                if last_fresh and last_fresh[0] == fresh.group:
                    cand = view.workers[last_fresh[1]]
                    w = cand if self._feasible(cand, fresh.context, self.delta) and view.accepts_new(cand) else None
                w = w or self._tight_fit([x for x in workers if view.accepts_new(x)] if view.gate else workers,
                                         fresh.context)
                if w is None:
                    fresh_open = False
                    continue
                last_fresh = (fresh.group, w.id)
                yield Admit(w.id, fresh.id)
                continue
            tight = self._tight_fit(workers, nxt.context)
            if tight is None:
                pending = pending[:i]  # nothing longer fits either
                continue
            if siblings is None:
                siblings = _sibling_index(workers, {t.group for t in pending[i:]})
            home = next((view.workers[wid] for wid in sorted(siblings.get(nxt.group, ()))
                         if self._feasible(view.workers[wid], nxt.context, self.delta)), None)
            w = home or tight
            siblings.setdefault(nxt.group, set()).add(w.id)
            i += 1
            yield Place(nxt.id, w.id)

    def _tight_fit(self, workers: list[Worker], tokens: int) -> Worker | None:
        """The feasible worker (decode reserve delta) left with the least spare room after the placement."""
        best, best_room = None, None
        for w in workers:
            reserve = self._reserve(w, self.delta)
            if fits(w, tokens, reserve):
                room = w.headroom - tokens - reserve
                if best_room is None or room < best_room:
                    best, best_room = w, room
        return best

    # -- concentration --------------------------------------------------------------------------

    def _concentrate(self, view: PoolView, v: int, workers: list[Worker]) -> Iterator[Action]:
        yield from self._place_longest_first(view, v, workers)
        if view.pending.count(v):
            return  # the gate: a cascade resolves before another begins
        if not self._fresh_ahead(view, v):
            return  # a drained worker would idle: nothing newer to advance to yet
        for src in sorted((w for w in workers if w.residents), key=lambda w: (-w.affinity, w.kv_used, w.id)):
            # Work only moves up the affinity order; between equals it consolidates onto fuller workers.
            targets = [w for w in workers if w.affinity < src.affinity
                       or (w.affinity == src.affinity and w is not src and (w.kv_used, w.id) > (src.kv_used, src.id))]
            room = sum(max(0, w.headroom - self.floor(w)) for w in targets)
            slots = sum(w.max_num_seqs - w.load for w in targets)
            if not targets or room < src.kv_used or slots < src.load:
                continue
            for traj in sorted(src.residents.values(), key=lambda t: -t.context):
                yield Evict(traj.id)
            yield from self._place_longest_first(view, v, targets)
            return

    @staticmethod
    def _fresh_ahead(view: PoolView, v: int) -> bool:
        return any(view.admissible(u) > 0 for u in range(v + 1, view.trainer_version + 1))

    def _place_longest_first(self, view: PoolView, v: int, workers: list[Worker]) -> Iterator[Action]:
        targets = sorted(workers, key=lambda w: (w.affinity, -w.headroom, w.id))
        largest = self._largest_room(targets)
        for traj in sorted(view.pending.at(v), key=lambda t: -t.context):
            ctx = traj.context
            if ctx > largest:
                continue  # fits nowhere: skip without scanning
            w = next(w for w in targets if self._feasible(w, ctx, 0))
            yield Place(traj.id, w.id)
            targets.sort(key=lambda w: (w.affinity, -w.headroom, w.id))
            largest = self._largest_room(targets)

    def _largest_room(self, workers: list[Worker]) -> int:
        """The longest context any of `workers` could take right now (floor kept, no reserve)."""
        return max((w.headroom - self.floor(w) for w in workers if w.load < w.max_num_seqs), default=-1)

    # -- advancing ------------------------------------------------------------------------------

    def _advance(self, view: PoolView) -> Iterator[Action]:
        for w in view.alive():
            if not view.may_advance(w) or view.admissible(w.version) > 0:
                continue
            yield Advance(w.id, self._next_version(view, w))

    @staticmethod
    def _next_version(view: PoolView, w: Worker) -> int:
        """Join an intermediate version first if weaker-affinity workers there still hold its tail."""
        for u in range(w.version + 1, view.trainer_version):
            if view.admissible(u) == 0 and any(o.version == u and o.residents and o.affinity > w.affinity
                                               for o in view.alive()):
                return u
        return view.trainer_version


def _sibling_index(workers: list[Worker], groups: set[int]) -> dict[int, set[int]]:
    """Which workers hold a resident of each prompt group in `groups`."""
    index: dict[int, set[int]] = {}
    for w in workers:
        for t in w.residents.values():
            g = t.spec.group
            if g in groups:
                index.setdefault(g, set()).add(w.id)
    return index
