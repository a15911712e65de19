"""Small pieces the policies share: budgeted admission and advancing idle workers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from cadencerl.core.actions import Action, Admit, Advance
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker


def fits(worker: Worker, tokens: int, reserve: int = 0) -> bool:
    """Room for `tokens` more KV (plus `reserve`) and a free sequence slot."""
    return worker.headroom - tokens >= reserve and worker.load < worker.max_num_seqs


def advance_idle(view: PoolView, workers: Iterable[Worker] | None = None) -> Iterator[Action]:
    """Empty workers whose version has no fresh budget left move to the newest version."""
    for w in workers if workers is not None else view.alive():
        if view.may_advance(w) and view.admissible(w.version) == 0:
            yield Advance(w.id, view.trainer_version)


def admit_fresh(view: PoolView, choose: Callable[[list[Worker], Trajectory], Worker | None]) -> Iterator[Action]:
    """Admit fresh trajectories one at a time to the worker `choose` picks, within the eta budget."""
    while view.fresh:
        nxt = view.fresh[0]
        candidates = [w for w in view.alive() if view.admissible(w.version) > 0 and fits(w, nxt.context)]
        if not candidates:
            return
        w = choose(candidates, nxt)
        if w is None:
            return
        yield Admit(w.id, 1)


def resident_order(worker: Worker, longest_first: bool = True) -> list[Trajectory]:
    return sorted(worker.residents.values(), key=lambda t: t.context, reverse=longest_first)
