"""Small pieces the policies share: where each prompt's samples went (group affinity), budgeted
admission, and the three ways workers take new weights."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from cadencerl.core.actions import Action, Admit, Advance, Evict, Interrupt, Place, UpdateInPlace
from cadencerl.core.trajectory import Trajectory
from cadencerl.core.view import PoolView
from cadencerl.core.worker import Worker


class PromptHomes:
    """The worker the latest sample of each prompt group went to: its prefix is cached there.

    Bounded and insertion-ordered: groups in flight are at most (eta+1) batches' worth, so the
    oldest entries can go.
    """

    def __init__(self, size: int = 16384) -> None:
        self.size = size
        self._home: OrderedDict[int, int] = OrderedDict()
        self.get = self._home.get   # group -> worker or None (the dict's own lookup: read at every placement)

    def note(self, group: int, worker: int) -> None:
        self._home[group] = worker
        self._home.move_to_end(group)
        if len(self._home) > self.size:
            self._home.popitem(last=False)


class GroupAffinity:
    """Prefix-aware routing as real RL rollout routers do it (verl's agent loop, SGLang's router):
    the samples of one prompt go where the previous one went while it is a candidate, so the
    prompt is prefilled once. Wraps a policy's own chooser; bounded memory of recent groups."""

    def __init__(self, size: int = 16384) -> None:
        self.homes = PromptHomes(size)

    def wrap(self, choose: Callable[[list[Worker], Trajectory], Worker | None]
             ) -> Callable[[list[Worker], Trajectory], Worker | None]:
        def pick(workers: list[Worker], traj: Trajectory) -> Worker | None:
            wid = self.homes.get(traj.group)
            w = next((w for w in workers if w.id == wid), None) if wid is not None else None
            w = w or choose(workers, traj)
            if w is not None:
                self.homes.note(traj.group, w.id)
            return w
        return pick


class Rotation:
    """Worker ids in rotation (round-robin): the first worker at or after the cursor, which then moves past it."""

    def __init__(self) -> None:
        self._cursor = 0

    def next(self, workers: list[Worker]) -> Worker | None:
        if not workers:
            return None
        w = min(workers, key=lambda w: (w.id - self._cursor) % (1 << 30))
        self._cursor = w.id + 1
        return w


def grouped(choose: Callable[[list[Worker], Trajectory], Worker | None], affinity: "GroupAffinity | None"
            ) -> Callable[[list[Worker], Trajectory], Worker | None]:
    """`choose`, behind group affinity when the policy runs with it."""
    return affinity.wrap(choose) if affinity is not None else choose


def fits(worker: Worker, tokens: int, reserve: int = 0) -> bool:
    """Room for `tokens` more KV (plus `reserve`) and a free sequence slot."""
    return worker.headroom - tokens >= reserve and worker.load < worker.max_num_seqs


def advance_idle(view: PoolView, workers: Iterable[Worker] | None = None) -> Iterator[Action]:
    """Empty workers whose version has no fresh budget left move to the newest version."""
    for w in workers if workers is not None else view.alive():
        if view.may_advance(w) and view.budget(w.version) == 0:
            yield Advance(w.id, view.trainer_version)


def _behind(view: PoolView) -> Iterator[Worker]:
    return (w for w in view.alive() if w.version < view.trainer_version)


def interrupt_behind(view: PoolView) -> Iterator[Action]:
    """Every live worker behind the trainer takes the new version at once: its running requests are
    aborted and resume in place with the new weights, re-prefilled (AReaL's interruptible generation,
    verl's and slime's partial rollout), so a trajectory may span versions."""
    return (Interrupt(w.id, view.trainer_version) for w in _behind(view))


def update_behind_in_place(view: PoolView) -> Iterator[Action]:
    """Every live worker behind the trainer takes the new version at once, its running requests
    frozen meanwhile and resumed on the KV they hold (vLLM's `/pause?mode=keep`, OpenRLHF's partial
    rollout, PipelineRL's in-flight updates): no re-prefill, and a trajectory may span versions."""
    return (UpdateInPlace(w.id, view.trainer_version) for w in _behind(view))


def admit_fresh(view: PoolView, choose: Callable[[list[Worker], Trajectory], Worker | None]) -> Iterator[Action]:
    """Admit fresh trajectories one at a time to the worker `choose` picks, within the eta budget.
    Behind an admission layer, one version at a time, oldest first: the layer picks each session's
    class for the cohort it joins, which the version of its worker decides."""
    workers = view.alive()
    if view.gate is None:
        yield from _admit_into(view, choose, workers, None)
        return
    for v in sorted({w.version for w in workers}):
        yield from _admit_into(view, choose, [w for w in workers if w.version == v], v)


def _admit_into(view: PoolView, choose: Callable[[list[Worker], Trajectory], Worker | None],
                workers: list[Worker], version: int | None) -> Iterator[Action]:
    while (nxt := view.next_fresh(version)) is not None:
        candidates = view.may_start_on([w for w in workers if fits(w, nxt.context)])
        if not candidates:
            return
        w = choose(candidates, nxt)
        if w is None:
            return
        yield Admit(w.id, nxt.id)


def place_pending(view: PoolView, choose: Callable[[list[Worker], Trajectory], Worker],
                  margin: Callable[[Worker], int] = lambda w: 0) -> Iterator[Action]:
    """Place pending trajectories (continuations, resumes) shortest first on a worker of their
    version that `choose` picks among those with room; the first that fits nowhere ends a version's
    turn (anything longer would not fit either)."""
    by_version: dict[int, list[Worker]] = {}
    for w in view.alive():
        by_version.setdefault(w.version, []).append(w)
    for v in view.pending.versions():
        workers = by_version.get(v, [])
        for traj in view.pending.by_context(v):
            ctx = traj.context
            ws = [w for w in workers if fits(w, ctx, margin(w))]
            if not ws:
                break
            yield Place(traj.id, choose(ws, traj).id)


def pack(trajs: Iterable[Trajectory], targets: list[Worker], margin: Callable[[Worker], int] = lambda w: 0,
         ) -> list[tuple[Trajectory, Worker]] | None:
    """First fit of every trajectory onto `targets` (in their order), or None if one does not fit."""
    room = {w.id: w.headroom - margin(w) for w in targets}
    slots = {w.id: w.max_num_seqs - w.load for w in targets}
    plan = []
    for t in trajs:
        dst = next((w for w in targets if room[w.id] >= t.context and slots[w.id] > 0), None)
        if dst is None:
            return None
        room[dst.id] -= t.context
        slots[dst.id] -= 1
        plan.append((t, dst))
    return plan


def move(plan: list[tuple[Trajectory, Worker]]) -> Iterator[Action]:
    """Depart every planned trajectory first, then place each: one migration cascade."""
    for traj, _dst in plan:
        yield Evict(traj.id)
    for traj, dst in plan:
        yield Place(traj.id, dst.id)
