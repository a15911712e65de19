"""Sync and One-off: rollout in whole batches behind a barrier (CadenceRL summary, Appendix D).

* Sync: roll out batch k with version k, train, publish k+1, then roll out batch k+1: no overlap,
  no staleness.
* One-off: batch k+1 is rolled out with version k while batch k trains (staleness <= 1).

Both dispatch a batch's trajectories to the least-loaded worker and never migrate; all workers
take the new weights together at the barrier, when the pool is empty.
"""

from __future__ import annotations

from collections.abc import Iterator

from cadencerl.core.actions import Action, Admit, Advance
from cadencerl.core.policy import Policy
from cadencerl.core.view import PoolView
from cadencerl.policies.base import GroupAffinity, fits, grouped, place_pending
from cadencerl.policies.least_loaded import least_loaded


class Synchronous(Policy):
    kv_transfer = False

    def __init__(self, overlap: bool, group_affinity: bool = False) -> None:
        self.overlap = overlap
        self.name = ("one-off" if overlap else "sync") + ("-grouped" if group_affinity else "")
        self._choose = grouped(least_loaded, GroupAffinity() if group_affinity else None)
        # Sync takes the new weights at its barrier; One-off ships them while the next batch rolls out.
        self.weight_sync = "prefetch" if overlap else "on-demand"

    def decide(self, view: PoolView) -> Iterator[Action]:
        b = view.credits.batch_size
        admitted = view.credits.admitted
        batch = admitted // b                  # the batch being (or next to be) rolled out
        yield from place_pending(view, least_loaded)   # tool returns, lost workers: also at the barrier,
        if admitted % b == 0:                  # between batches: the barrier (which waits on them)
            if view.in_flight or not view.fresh:
                return
            ready = view.trainer_version >= batch - 1 if self.overlap else (
                view.trainer_version >= batch and not view.trainer_busy)
            if not ready:
                return
            for w in view.alive():
                if w.version < view.trainer_version:
                    yield Advance(w.id, view.trainer_version)
        while view.credits.admitted < (batch + 1) * b and (nxt := view.next_fresh()) is not None:
            ws = view.may_start_on([w for w in view.alive() if fits(w, nxt.context)])
            if not ws:
                return
            yield Admit(self._choose(ws, nxt).id, nxt.id)
