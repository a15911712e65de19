"""The controller's checks of admissions and placements, for one action or a whole batch.

A batch is checked as if its steps were applied one by one, in one pass over the lot: within a
batch KV only grows (so each worker's total is checked once) and each admission lowers its
version's eta budget by exactly one (so the budget is checked once, for the count, by the caller).
"""

from __future__ import annotations

from collections.abc import Mapping

from cadencerl.core.actions import ActionError, Batch
from cadencerl.core.credits import CreditModel
from cadencerl.core.pending import PendingSet
from cadencerl.core.residency import live_worker
from cadencerl.core.trajectory import State, Trajectory, contexts
from cadencerl.core.worker import Worker


def check_fits(w: Worker, traj: Trajectory, context: int, queues_at_engine: bool, booked: int = 0) -> None:
    """No placement exceeds KV capacity (`context`: the trajectory's; `booked`: what the same batch
    placed on `w` before it). A router may queue work at an engine (vLLM's waiting queue holds no
    KV), but never a trajectory larger than the engine's whole KV."""
    if queues_at_engine:
        if context + 1 > w.kv_capacity:
            raise ActionError(f"trajectory {traj.id} ({context} tokens) exceeds worker {w.id}'s KV")
    elif w.kv_used + booked + context > w.kv_capacity:
        raise ActionError(f"placing trajectory {traj.id} ({context} tokens) on worker {w.id} exceeds its "
                          f"KV capacity ({w.kv_used + booked}/{w.kv_capacity})")


def check_budget(credits: CreditModel, next_batch: int, w: Worker, n: int) -> None:
    """`n` admissions on `w` fit in its version's eta budget (each lowers it by exactly one)."""
    if credits.admissible(w.version, next_batch) < n:
        raise ActionError(f"admit on worker {w.id} at version {w.version}: the eta budget is spent")


def check_fresh(traj: Trajectory) -> None:
    if traj.state is not State.FRESH:
        raise ActionError(f"trajectory {traj.id} is not fresh")


def check_placement(traj: Trajectory, w: Worker, pending: PendingSet) -> None:
    """A pending trajectory goes to a worker of its version."""
    if traj not in pending:
        raise ActionError(f"trajectory {traj.id} is not pending")
    if w.version != traj.version:
        raise ActionError(f"trajectory {traj.id} of version {traj.version} cannot run on worker {w.id} at "
                          f"version {w.version}")


def batch_steps(batch: Batch, workers: list[Worker], trajectories: Mapping[int, Trajectory], pending: PendingSet,
                queues_at_engine: bool) -> tuple[list[Trajectory], list[Worker], list[Worker]]:
    """Each step's trajectory and worker, and the workers of its admissions (one version), all
    checked except the eta budget; ActionError naming the first failing step of the first check
    that fails (trajectories and versions are checked before KV, so the step named may not be the
    first that would fail applied one by one; nothing is applied either way)."""
    tids, wids, admits = batch.trajs, batch.workers, batch.admits
    if not len(tids) == len(wids) == len(admits):
        raise ActionError("a batch's columns differ in length")
    if len(set(tids)) < len(tids):
        raise ActionError("a batch names a trajectory twice")
    live = {wid: live_worker(workers, wid) for wid in set(wids)}
    trajs = [trajectories.get(tid) for tid in tids]
    if None in trajs:
        raise ActionError(f"unknown trajectory {tids[trajs.index(None)]}")
    ws = [live[wid] for wid in wids]
    admitted = [w for w, admit in zip(ws, admits) if admit]
    if len({w.version for w in admitted}) > 1:
        raise ActionError(f"a batch admits under one version, not {sorted({w.version for w in admitted})}")
    for traj, w, admit in zip(trajs, ws, admits):
        if admit:
            check_fresh(traj)
        else:
            check_placement(traj, w, pending)
    lengths = contexts(trajs)
    booked: dict[int, int] = {}
    for wid, context in zip(wids, lengths):
        booked[wid] = booked.get(wid, 0) + context
    if queues_at_engine or any(w.kv_used + booked[wid] > w.kv_capacity for wid, w in live.items()):
        booked.clear()
        for traj, w, context in zip(trajs, ws, lengths):   # find the step that fails
            check_fits(w, traj, context, queues_at_engine, booked.get(w.id, 0))
            booked[w.id] = booked.get(w.id, 0) + context
    return trajs, ws, admitted
