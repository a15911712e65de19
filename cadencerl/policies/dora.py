"""DORA*: multi-version streaming rollout with workload-aware worker reallocation (arXiv 2604.26256).

Several policy versions live at once. At each weight-synchronization point (a new version is
published) the workers are re-partitioned across the live versions in proportion to the work left
in each: unfinished trajectories for older versions, the fresh budget for the newest. A worker
taken from an old version hands its residents to the other workers of that version (KV moves
without re-prefill inside the homogeneous pool), then advances. As in the CadenceRL evaluation,
this is the resource-allocation component only, and only for homogeneous pools.
"""

from __future__ import annotations

from collections.abc import Iterator

from cadencerl.config import ConfigError, Scenario
from cadencerl.core.actions import Action, Advance
from cadencerl.core.policy import Policy
from cadencerl.core.view import PoolView
from cadencerl.policies.base import GroupAffinity, admit_fresh, advance_idle, grouped, move, pack, place_pending
from cadencerl.policies.least_loaded import least_loaded


class Dora(Policy):
    kv_transfer = True

    def __init__(self, group_affinity: bool = False) -> None:
        self.name = "dora-grouped" if group_affinity else "dora"
        self._choose = grouped(least_loaded, GroupAffinity() if group_affinity else None)
        self._seen_version = 0
        self._shares: dict[int, int] = {}

    def decide(self, view: PoolView) -> Iterator[Action]:
        yield from advance_idle(view)
        yield from place_pending(view, least_loaded)
        if view.trainer_version > self._seen_version:  # a weight-sync point: plan the partition
            self._seen_version = view.trainer_version
            self._shares = self._partition(view)
        yield from self._reallocate(view)             # carried out as room allows
        yield from admit_fresh(view, self._choose)

    @staticmethod
    def _partition(view: PoolView) -> dict[int, int]:
        """Workers per old version, in proportion to its unfinished work against the newest's budget."""
        workers = view.alive()
        newest = view.trainer_version
        loads: dict[int, int] = {}
        for w in workers:
            loads[w.version] = loads.get(w.version, 0) + w.load
        work = {v: n + view.offworker(v) for v, n in loads.items() if v < newest}
        fresh = view.admissible(newest) + loads.get(newest, 0)
        total = sum(work.values()) + fresh or 1
        return {v: max(1, round(len(workers) * n / total)) if n else 0 for v, n in work.items()}

    def _reallocate(self, view: PoolView) -> Iterator[Action]:
        newest = view.trainer_version
        for v, share in self._shares.items():
            group = sorted((w for w in view.alive() if w.version == v), key=lambda w: (-w.load, w.id))
            while len(group) > share:
                src = group.pop()  # the least-loaded worker of the version is handed over
                targets = sorted(group, key=lambda w: (w.load, w.id))
                plan = pack(sorted(src.residents.values(), key=lambda t: -t.context), targets)
                if plan is None:
                    break
                yield from move(plan)
                if view.may_advance(src):
                    yield Advance(src.id, newest)


def dora_for(scenario: Scenario, group_affinity: bool = False) -> Dora:
    """DORA* for a pool; it refuses a heterogeneous one."""
    kinds = {(g.accelerator, g.tp) for g in scenario.pool}
    if len(kinds) > 1:
        raise ConfigError("policy: dora (DORA*) assumes homogeneous hardware and refuses a heterogeneous pool "
                          f"({', '.join(sorted(f'{a} TP={tp}' for a, tp in kinds))}), as the CadenceRL paper excludes it")
    return Dora(group_affinity)
