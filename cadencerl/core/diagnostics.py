"""What the controller says when a run goes wrong: a stall or the loss of every worker, named with
the state and knobs that explain it, and the end-of-run conservation check (no trajectory lost or
duplicated).

Apart from the controller so that module stays about the loop and the actions it applies; each
function only reads the books it is given."""

from __future__ import annotations

from collections.abc import Iterable

from cadencerl.config import ControllerSpec
from cadencerl.core.pending import PendingSet
from cadencerl.core.trajectory import State, Trajectory
from cadencerl.core.worker import Worker


class StallError(RuntimeError):
    """Nothing can make progress: a policy bug or an impossible configuration."""


def stall_message(policy: str, now: float, fresh: int, pending: PendingSet, done: int, total: int,
                  trainer_version: int, workers: list[Worker], params: ControllerSpec) -> str:
    """Why no decision moves the run: where the work is, the versions, lost workers and the knobs."""
    by_version = {v: pending.count(v) for v in pending.versions()}
    lost = [w.id for w in workers if not w.alive] or "none"
    return (f"policy {policy!r} stalled at t={now:.1f}s: {fresh} fresh, "
            f"{len(pending)} pending (by version {by_version}), {done}/{total} done, "
            f"trainer at version {trainer_version}, worker versions {sorted({w.version for w in workers})}, "
            f"workers lost: {lost}; eta {params.eta}, largest worker KV {max(w.kv_capacity for w in workers)} tokens")


def all_lost_message(now: float, done: int, total: int, lost_why: dict[int, str]) -> str:
    """Every worker is gone: what the backend saw of each."""
    return (f"every worker is lost at t={now:.1f}s, {done}/{total} done: "
            + "; ".join(f"worker {w}: {why or 'no reason given'}" for w, why in lost_why.items()))


def conservation_problems(backend_problems: Iterable[str], trajectories: Iterable[Trajectory], pending: int,
                          consumed: int) -> list[str]:
    """At the end of a run every trajectory completed once, after its admission, and was consumed
    by the trainer, with nothing left pending (the backend's own findings first)."""
    problems = list(backend_problems)
    states: dict[State, int] = {}
    total = 0
    for t in trajectories:
        total += 1
        states[t.state] = states.get(t.state, 0) + 1
        if t.state is State.DONE and t.completed_at < t.admitted_at:
            problems.append(f"trajectory {t.id} completed before it was admitted")
    if states.get(State.DONE, 0) != total:
        problems.append(f"not every trajectory completed: {({k.value: v for k, v in states.items()})}")
    if pending:
        problems.append(f"pending set not empty at the end: {pending}")
    if consumed != total:
        problems.append(f"trainer consumed {consumed} of {total}")
    return problems
