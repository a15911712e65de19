"""Laminar: independent weight advancement plus dynamic repack (arXiv 2510.12633, summary App. D).

Each worker pulls new weights on its own once its residents of the old version are gone; fresh work
goes to the least-loaded worker whose version still has budget; once a version admits no more fresh
work, a repack consolidates its tail from under-utilized workers onto the fullest ones with room, so
the freed workers advance. Where the paper is silent (the constants below): docs/baselines.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from cadencerl.core.actions import Action
from cadencerl.core.policy import Policy
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker
from cadencerl.policies.base import GroupAffinity, admit_fresh, advance_idle, grouped, move, pack, place_pending
from cadencerl.policies.least_loaded import least_loaded

REPACK_UTILIZATION = 0.25
TARGET_MARGIN = 0.10


class Laminar(Policy):
    kv_transfer = True
    weight_sync = "prefetch"   # relays hold each new version; a worker pulls it when ready

    def __init__(self, group_affinity: bool = False) -> None:
        self.name = "laminar-grouped" if group_affinity else "laminar"
        self._choose = grouped(least_loaded, GroupAffinity() if group_affinity else None)

    def decide(self, view: PoolView) -> Iterator[Action]:
        yield from advance_idle(view)
        yield from place_pending(view, lambda ws, _t: max(ws, key=lambda w: (w.load, -w.id)), _margin)
        yield from self._repack(view)
        yield from advance_idle(view)
        yield from admit_fresh(view, self._choose)

    def _repack(self, view: PoolView) -> Iterator[Action]:
        groups: dict[int, list[Worker]] = {}
        for w in view.alive():
            groups.setdefault(w.version, []).append(w)
        for v, workers in groups.items():
            if view.budget(v) > 0 or view.pending.count(v) or v >= view.trainer_version:
                continue  # still fresh work, or nothing newer to free workers for
            sources = sorted((w for w in workers if 0 < w.load < REPACK_UTILIZATION * w.max_num_seqs),
                             key=lambda w: (w.load, w.id))
            for src in sources:
                if not src.residents:
                    continue
                targets = sorted((w for w in workers if w is not src and w.load >= src.load),
                                 key=lambda w: (-w.load, w.id))
                plan = pack(sorted(src.residents.values(), key=lambda t: -t.context), targets, _margin)
                if plan is not None:
                    yield from move(plan)


def _margin(w: Worker) -> int:
    return int(TARGET_MARGIN * w.kv_capacity)
