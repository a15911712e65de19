"""AReaL: interruptible generation with bounded staleness (inclusionAI/AReaL, summary App. D).

When new weights are published every worker is interrupted: running requests are aborted, the
weights are updated, and the unfinished trajectories resume on the same server with the new
weights after re-prefilling their prefixes (the prefix cache is stale), so one trajectory may
span several versions. New rollouts start while the staleness budget allows
(`max_head_offpolicyness` = eta, the same credit model as every policy here) and are dispatched
round-robin across servers, as AReaL's client does.
"""

from __future__ import annotations

from collections.abc import Iterator

from cadencerl.core.actions import Action, Admit, Interrupt, Place
from cadencerl.core.view import PoolView
from cadencerl.policies.base import fits
from cadencerl.policies.registry import register


class AReaL:
    name = "areal"
    kv_transfer = False

    def __init__(self) -> None:
        self._cursor = 0

    def decide(self, view: PoolView) -> Iterator[Action]:
        for w in view.alive():
            if w.version < view.trainer_version:
                yield Interrupt(w.id, view.trainer_version)
        workers = view.alive()
        for traj in sorted(view.pending, key=lambda t: t.context):   # lost workers, tool returns
            w = self._next(workers, lambda w: w.version == traj.version and fits(w, traj.context))
            if w is not None:
                yield Place(traj.id, w.id)
        while (nxt := view.next_fresh()) is not None:
            w = self._next(workers, lambda w: view.admissible(w.version) > 0 and fits(w, nxt.context)
                           and view.accepts_new(w))
            if w is None:
                return
            yield Admit(w.id, nxt.id)

    def _next(self, workers, ok):
        """Round-robin: the next worker after the cursor that `ok` accepts."""
        n = len(workers)
        for i in range(n):
            w = workers[(self._cursor + i) % n]
            if ok(w):
                self._cursor = (self._cursor + i + 1) % n
                return w
        return None


register("areal", lambda s: AReaL())
