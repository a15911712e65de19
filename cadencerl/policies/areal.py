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

from cadencerl.core.actions import Action, Admit
from cadencerl.core.policy import Policy
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.policies.base import GroupAffinity, Rotation, fits, grouped, interrupt_behind, place_pending


class AReaL(Policy):
    kv_transfer = False

    def __init__(self, group_affinity: bool = False) -> None:
        self.name = "areal-grouped" if group_affinity else "areal"
        self._rotation = Rotation()
        self._choose = grouped(lambda ws, _t: self._rotation.next(ws), GroupAffinity() if group_affinity else None)

    def decide(self, view: PoolView) -> Iterator[Action]:
        yield from interrupt_behind(view)
        workers = view.alive()
        yield from place_pending(view, self._sticky)   # tool returns, lost workers
        while (nxt := view.next_fresh()) is not None:
            ok = view.may_start_on([w for w in workers if fits(w, nxt.context)])
            w = self._choose(ok, nxt) if ok else None
            if w is None:
                return
            yield Admit(w.id, nxt.id)

    def _sticky(self, workers: list[Worker], traj: Trajectory) -> Worker:
        """AReaL's rid -> server LRU: a resumed request goes back to its server if it can."""
        home = next((w for w in workers if w.id == traj.kv_home), None)
        return home or self._rotation.next(workers)
